"""What a bounded attention memory keeps: :class:`MemoryConfig`, plain data (also the ``tensorslim longeval`` flags).

The memory follows Attendre (Yang & Hua, arXiv 2401.04881): a K/V memory per attention layer, filled chunk by chunk
and shrunk by an eviction policy (FIFO, LRA, LFA), plus a Q memory in which each query waits ``wait`` later tokens
before it attends (§3 of the paper; its body was not available to us, so the details are a reconstruction from the
abstract, see docs/long_context.md). The ``h2o`` policy is the accumulated-attention baseline of H2O (Zhang et al.,
arXiv 2306.14048, §3), and ``fifo`` with ``sinks=4`` is StreamingLLM (Xiao et al., arXiv 2309.17453, §3.2).
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorslim._checks import check_fields, require_int
from tensorslim.options import option

POLICIES = ("fifo", "lra", "lfa", "h2o")


@dataclass(frozen=True, kw_only=True)
class MemoryConfig:
    """A bounded K/V memory for every attention layer (see :func:`tensorslim.layers.memory.equip_memory_`)."""

    capacity: int = option(256, "entries per layer and key/value head kept between chunks (the memory budget)")
    policy: str = option("lra", f"eviction policy, one of {list(POLICIES)}")
    sinks: int = option(0, "first tokens of the stream never evicted (StreamingLLM's attention sinks)")
    chunk: int = option(64, "tokens read per step; at most capacity + chunk entries are attended at once")
    wait: int = option(0, "later tokens each query waits for before it attends (Attendre's Q memory; encoders)")
    tau: float = option(0.01, "attention probability at which an entry counts as attended (lra, lfa)")
    recent: int = option(0, "newest entries never evicted (H2O's recent window; 0: half the capacity for h2o)")
    lra_insert: bool = option(True, "lra: a new entry counts as attended when inserted (else only once attended)")

    def __post_init__(self) -> None:
        check_fields(self)
        require_int("capacity", self.capacity)
        require_int("chunk", self.chunk)
        if self.policy not in POLICIES:
            raise ValueError(f"policy={self.policy!r} is unknown; allowed: {list(POLICIES)}")
        if self.capacity < self.chunk:
            raise ValueError(f"capacity={self.capacity} is smaller than chunk={self.chunk}; allowed: >= chunk")
        require_int("sinks", self.sinks, minimum=0)
        require_int("wait", self.wait, minimum=0)
        require_int("recent", self.recent, minimum=0)
        if self.sinks + self.protected_recent >= self.capacity:
            raise ValueError(
                f"sinks={self.sinks} + recent={self.protected_recent} leave no evictable entry in "
                f"capacity={self.capacity}; allowed: sinks + recent < capacity"
            )
        if isinstance(self.tau, bool) or not isinstance(self.tau, int | float) or not 0 < self.tau <= 1:
            raise ValueError(f"tau={self.tau!r} is invalid; allowed: a probability in (0, 1]")
        if not isinstance(self.lra_insert, bool):
            raise ValueError(f"lra_insert={self.lra_insert!r} is invalid; allowed: True or False")

    @property
    def protected_recent(self) -> int:
        """Newest entries exempt from eviction: ``recent``, or for ``h2o`` by default half the budget (H2O §5 splits
        its budget evenly between heavy hitters and recent tokens)."""
        if self.recent or self.policy != "h2o":
            return self.recent
        return (self.capacity - self.sinks) // 2
