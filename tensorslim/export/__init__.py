"""Export to other runtimes: :func:`to_gguf` writes our LLaMA and its tokenizer as a GGUF file for llama.cpp.
Importing it does no work (the ``gguf`` package is imported when a file is written)."""

from tensorslim.export.gguf import GGUF_TYPES, to_gguf

__all__ = ["GGUF_TYPES", "to_gguf"]
