"""The bounded K/V memory of one attention layer, with each entry's position and attention statistic.

Keys are stored already rotated by RoPE at their own absolute position (rotation is done once, from the position the
token had in the stream), and each entry keeps that position: masks and FIFO order read the stored positions, never
the slot an entry happens to occupy after evictions (Attendre, arXiv 2401.04881 §3; reconstruction).
"""

from __future__ import annotations

import torch

from tensorslim.layers.memory.config import MemoryConfig
from tensorslim.layers.memory.policies import initial_stat, keep_indices, observe


class KVStore:
    """Entries ``(B, H_kv, M, hd)`` kept between steps; ``M <= capacity`` after every step.

    Attributes:
        seen: tokens streamed so far, i.e. the position of the next token.
        step: steps (chunks) done, the clock of LRA.
        peak: the most entries ever attended at once (``<= capacity + chunk``).
    """

    def __init__(self, config: MemoryConfig) -> None:
        self.config = config
        self.keys: torch.Tensor | None = None  # (B, H_kv, M, hd), rotated
        self.values: torch.Tensor | None = None  # (B, H_kv, M, hd)
        self.positions: torch.Tensor | None = None  # (B, H_kv, M), ascending along M
        self.stat: torch.Tensor | None = None  # (B, H_kv, M), the policy's statistic
        self.seen = 0
        self.step = 0
        self.peak = 0

    @property
    def size(self) -> int:
        """Entries held now."""
        return 0 if self.keys is None else self.keys.shape[2]

    def next_positions(self, count: int, *, device: torch.device) -> torch.Tensor:
        """Positions ``(count,)`` of the next ``count`` tokens of the stream."""
        return torch.arange(self.seen, self.seen + count, device=device)

    def insert(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Append the next tokens' ``(B, H_kv, T, hd)`` keys and values (not yet evicted: see :meth:`evict`)."""
        batch, heads, count, _ = keys.shape
        positions = self.next_positions(count, device=keys.device).expand(batch, heads, count)
        config = self.config
        stat = initial_stat(
            config.policy, (batch, heads, count), step=self.step, device=keys.device, lra_insert=config.lra_insert
        )
        if self.keys is None:
            self.keys, self.values, self.positions, self.stat = keys, values, positions, stat
        else:
            self.keys = torch.cat([self.keys, keys], dim=2)
            self.values = torch.cat([self.values, values], dim=2)
            self.positions = torch.cat([self.positions, positions], dim=2)
            self.stat = torch.cat([self.stat, stat], dim=2)
        self.seen += count

    def attend(self, queries: torch.Tensor, query_positions: torch.Tensor, *, scale: float) -> torch.Tensor:
        """Attention of ``queries`` ``(B, H, Q, hd)`` at ``query_positions`` ``(Q,)`` over the entries at positions
        ``<= query position + wait``; records the statistics. Returns ``(B, H, Q, hd)``.

        ``H`` may be a multiple of ``H_kv`` (grouped-query attention): each key/value head serves ``H // H_kv`` query
        heads, and its statistic pools over all of them.
        """
        assert self.keys is not None and self.values is not None and self.positions is not None
        batch, heads, count, _ = queries.shape
        kv_heads, entries = self.keys.shape[1], self.keys.shape[2]
        group = heads // kv_heads
        self.peak = max(self.peak, entries)
        q = queries.reshape(batch, kv_heads, group * count, -1)  # query heads of one kv head side by side
        scores = torch.matmul(q, self.keys.transpose(-1, -2)) * scale  # (B, H_kv, g*Q, M)
        limit = (query_positions + self.config.wait).repeat(group)  # (g*Q,)
        visible = self.positions[:, :, None, :] <= limit[None, None, :, None]  # (B, H_kv, g*Q, M)
        probs = torch.softmax(scores.float().masked_fill(~visible, float("-inf")), dim=-1)
        self.stat = observe(self.config.policy, self.stat, probs, step=self.step, tau=self.config.tau)
        out = torch.matmul(probs.to(self.values.dtype), self.values)  # (B, H_kv, g*Q, hd)
        return out.view(batch, heads, count, -1)

    def evict(self) -> None:
        """Shrink to ``capacity`` entries by the policy, and advance the step clock."""
        config = self.config
        if self.size > config.capacity:
            assert self.positions is not None and self.stat is not None
            keep = keep_indices(
                config.policy,
                self.stat,
                self.positions,
                capacity=config.capacity,
                sinks=config.sinks,
                recent=config.protected_recent,
            )  # (B, H_kv, capacity)
            rows = keep[..., None].expand(-1, -1, -1, self.keys.shape[-1])
            self.keys, self.values = self.keys.gather(2, rows), self.values.gather(2, rows)
            self.positions, self.stat = self.positions.gather(2, keep), self.stat.gather(2, keep)
        self.step += 1

    def reset(self) -> None:
        """Forget everything (a new stream)."""
        self.__init__(self.config)
