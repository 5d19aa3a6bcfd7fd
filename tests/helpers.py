"""Shared tiny shapes for tests."""

from __future__ import annotations

from tensorslim.models.llama import LlamaConfig

TINY_LLAMA = LlamaConfig(d_model=64, n_layers=2, n_heads=4, d_ff=172, vocab_size=256, max_seq_len=64)
