"""Bounded attention memory for long inputs (Attendre, arXiv 2401.04881): configs, eviction policies, the verb that
equips a model (the layer family, :mod:`tensorslim.layers.memory`), and streaming reads with eviction at prefill and
decoding."""

from tensorslim.layers.memory import (
    POLICIES,
    KVStore,
    MemoryConfig,
    MemoryReport,
    equip_memory_,
    memory_stores,
    reset_memory_,
)
from tensorslim.memory.streaming import StreamResult, generate, stream_logits, stream_nll

__all__ = [
    "POLICIES",
    "KVStore",
    "MemoryConfig",
    "MemoryReport",
    "StreamResult",
    "equip_memory_",
    "generate",
    "memory_stores",
    "reset_memory_",
    "stream_logits",
    "stream_nll",
]
