"""Bounded attention memory (Attendre, arXiv 2401.04881) as a layer family: its config, eviction policies, K/V
store, and the verb that equips a model's attention layers with it."""

from tensorslim.layers.memory.config import POLICIES, MemoryConfig
from tensorslim.layers.memory.equip import MemoryReport, equip_memory_, memory_stores, reset_memory_
from tensorslim.layers.memory.store import KVStore

__all__ = ["POLICIES", "KVStore", "MemoryConfig", "MemoryReport", "equip_memory_", "memory_stores", "reset_memory_"]
