"""Data: built-in corpora, tokenizers, packing into fixed-length sequences."""
