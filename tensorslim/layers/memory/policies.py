"""Eviction policies as functions on score tensors: what an attention step teaches each entry, and which to keep.

Every policy keeps, per batch row and key/value head, the ``capacity`` entries of highest score; ties are broken
against the oldest entry (the reconstruction of Attendre, arXiv 2401.04881 §3, in docs/long_context.md). Entries
protected by ``sinks`` (the first tokens of the stream) or by a recent window score +inf.

- ``fifo``: score = position, so the oldest go first (Attendre's baseline; with sinks, StreamingLLM, arXiv
  2309.17453 §3.2).
- ``lra`` (least recently attended): score = the last step at which some query gave the entry a probability >= tau;
  a new entry counts as attended when inserted (``lra_insert=True``, as a cache counts an insertion as a use) or
  only once a query attends it (``lra_insert=False``: never-attended entries go first, oldest first, so an entry
  attended once outlives any number of newer entries nobody attends; protect the newest with ``recent``).
- ``lfa`` (least frequently attended): score = how many queries gave it a probability >= tau, summed over steps.
- ``h2o``: score = the attention probability it received, summed over queries and steps (H2O's accumulated
  attention, arXiv 2306.14048 §3), with half the budget kept for the most recent tokens.
"""

from __future__ import annotations

import torch


def initial_stat(
    policy: str, shape: tuple[int, ...], *, step: int, device: torch.device, lra_insert: bool = True
) -> torch.Tensor:
    """The statistic of entries inserted at ``step``: LRA counts insertion as an attention (a new entry is recent)
    unless ``lra_insert`` is False (then -1, before every step: attended never), the counting policies start at
    zero. The inserting step's own queries attend next, so an entry they attend gets ``step`` either way."""
    if policy == "lra":
        return torch.full(shape, float(step) if lra_insert else -1.0, device=device)
    return torch.zeros(shape, device=device)


def observe(policy: str, stat: torch.Tensor, probs: torch.Tensor, *, step: int, tau: float) -> torch.Tensor:
    """``stat`` ``(B, H, N)`` after the queries of one step attended with ``probs`` ``(B, H, Q, N)``."""
    if policy == "lra":
        return torch.where(probs.amax(dim=2) >= tau, torch.full_like(stat, float(step)), stat)
    if policy == "lfa":
        return stat + (probs >= tau).sum(dim=2).to(stat.dtype)
    if policy == "h2o":
        return stat + probs.sum(dim=2).to(stat.dtype)
    return stat  # fifo reads positions only


def keep_indices(
    policy: str, stat: torch.Tensor, positions: torch.Tensor, *, capacity: int, sinks: int, recent: int
) -> torch.Tensor:
    """Indices ``(B, H, capacity)``, ascending, of the entries to keep among ``N`` (``stat``, ``positions``: ``(B, H,
    N)``, positions ascending along N).

    Ranking: protected entries first, then the highest score; among equal scores the newest (so the oldest tie is
    evicted). Done as a stable sort by score over the entries ordered newest first.
    """
    score = positions.to(stat.dtype) if policy == "fifo" else stat
    newest = positions.amax(dim=-1, keepdim=True)
    protected = (positions < sinks) | (positions > newest - recent)
    score = score.masked_fill(protected, float("inf"))
    newest_first = torch.flip(torch.arange(positions.shape[-1], device=positions.device), dims=(0,))
    ranked = torch.sort(score[..., newest_first], dim=-1, descending=True, stable=True).indices[..., :capacity]
    return torch.sort(newest_first[ranked], dim=-1).values
