"""Tensor-parallel collectives as autograd functions, with a tally of what each one sends.

BOOST (Wang et al., 2025, arXiv 2512.12131) §3 places every collective of a low-rank layer on the rank-r latent.
Getting the *backward* of those collectives right is the whole game, so each one here is an explicit
``torch.autograd.Function`` (``torch.distributed.nn.functional.all_reduce`` sums gradients in backward, which gives
p-times too large weight gradients when the output feeds replicated computation).

Megatron's conventions (Shoeybi et al., 2019, §3): ``f`` is identity forward / all-reduce backward (a replicated
tensor entering sharded computation), ``g`` is all-reduce forward / identity backward (partial sums leaving sharded
computation into replicated computation). BOOST's latents are produced *and* consumed by sharded computation, so
their collective is ``g`` followed by ``f``: all-reduce in both directions (:func:`reduce_latent`).

Every call records ``(tag, op, phase)`` with the number of collectives, the wall time spent blocked in them (what
overlapping them with computation could hide at most) and the elements/bytes of the *result* tensor (for an
all-reduce the size of the reduced tensor, for an all-gather the gathered tensor). This logical payload is what the
§5.2 model counts; a ring algorithm moves ``2(p-1)/p`` of it per rank.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class Tally:
    """How many collectives of one kind ran and how much they carried."""

    count: int = 0
    elements: int = 0
    bytes: int = 0
    seconds: float = 0.0  # wall time this rank spent inside the (blocking) calls


@dataclass
class CommLog:
    """Collectives keyed by ``(tag, op, phase)``; ``phase`` is ``"fwd"`` or ``"bwd"``."""

    tallies: dict[tuple[str, str, str], Tally] = field(default_factory=lambda: defaultdict(Tally))
    enabled: bool = True

    def add(self, tag: str, op: str, phase: str, tensor: torch.Tensor, *, seconds: float = 0.0) -> None:
        if not self.enabled:
            return
        tally = self.tallies[(tag, op, phase)]
        tally.count += 1
        tally.elements += tensor.numel()
        tally.bytes += tensor.numel() * tensor.element_size()
        tally.seconds += seconds

    def reset(self) -> None:
        self.tallies.clear()

    def total(self, *, prefix: str = "", phase: str | None = None) -> Tally:
        """Sum over the tags that start with ``prefix`` (and over one phase when given)."""
        out = Tally()
        for (tag, _op, ph), tally in self.tallies.items():
            if tag.startswith(prefix) and (phase is None or ph == phase):
                out.count += tally.count
                out.elements += tally.elements
                out.bytes += tally.bytes
                out.seconds += tally.seconds
        return out

    def as_rows(self) -> list[dict[str, object]]:
        """One JSON-friendly row per ``(tag, op, phase)``."""
        return [
            {"tag": tag, "op": op, "phase": phase, "count": t.count, "elements": t.elements, "bytes": t.bytes}
            for (tag, op, phase), t in sorted(self.tallies.items())
        ]


@dataclass
class TPGroup:
    """The tensor-parallel process group seen from one rank, plus its communication log."""

    group: dist.ProcessGroup | None
    rank: int
    size: int
    log: CommLog = field(default_factory=CommLog)

    @classmethod
    def single(cls) -> TPGroup:
        """A group of one process: every collective is the identity and nothing is logged."""
        return cls(group=None, rank=0, size=1)


def _all_reduce(x: torch.Tensor, tp: TPGroup, tag: str, phase: str, op: dist.ReduceOp = dist.ReduceOp.SUM) -> None:
    """In place; a no-op for a group of one."""
    if tp.size == 1:
        return
    start = time.perf_counter()
    dist.all_reduce(x, op=op, group=tp.group)
    tp.log.add(tag, "all_reduce", phase, x, seconds=time.perf_counter() - start)


class _ReduceForward(torch.autograd.Function):
    """Megatron's ``g``: sum partial results; the gradient of a replicated consumer is already complete."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tp: TPGroup, tag: str) -> torch.Tensor:
        out = x.contiguous().clone()
        _all_reduce(out, tp, tag, "fwd")
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad, None, None


class _CopyForward(torch.autograd.Function):
    """Megatron's ``f``: each rank's sharded consumer returns a partial gradient, which must be summed."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tp: TPGroup, tag: str) -> torch.Tensor:
        ctx.tp, ctx.tag = tp, tag
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        grad = grad.contiguous().clone()
        _all_reduce(grad, ctx.tp, ctx.tag, "bwd")
        return grad, None, None


class _ReduceBoth(torch.autograd.Function):
    """``f ∘ g``: a latent summed from sharded producers and read by sharded consumers (BOOST §3.1)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tp: TPGroup, tag: str) -> torch.Tensor:
        ctx.tp, ctx.tag = tp, tag
        out = x.contiguous().clone()
        _all_reduce(out, tp, tag, "fwd")
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        grad = grad.contiguous().clone()
        _all_reduce(grad, ctx.tp, ctx.tag, "bwd")
        return grad, None, None


class _GatherLast(torch.autograd.Function):
    """All-gather along the last dimension; its consumer is replicated, so backward keeps the local slice."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tp: TPGroup, tag: str) -> torch.Tensor:
        ctx.tp, ctx.width = tp, x.shape[-1]
        if tp.size == 1:
            return x.clone()
        parts = [torch.empty_like(x) for _ in range(tp.size)]
        start = time.perf_counter()
        dist.all_gather(parts, x.contiguous(), group=tp.group)
        out = torch.cat(parts, dim=-1)
        tp.log.add(tag, "all_gather", "fwd", out, seconds=time.perf_counter() - start)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        start = ctx.tp.rank * ctx.width
        return grad[..., start : start + ctx.width].contiguous(), None, None


def reduce_from_tp(x: torch.Tensor, tp: TPGroup, *, tag: str) -> torch.Tensor:
    """``g``: all-reduce forward, identity backward (row-parallel output into replicated computation)."""
    return _ReduceForward.apply(x, tp, tag)


def copy_to_tp(x: torch.Tensor, tp: TPGroup, *, tag: str) -> torch.Tensor:
    """``f``: identity forward, all-reduce backward (replicated input into column-parallel computation)."""
    return _CopyForward.apply(x, tp, tag)


def reduce_latent(x: torch.Tensor, tp: TPGroup, *, tag: str) -> torch.Tensor:
    """BOOST's latent collective: all-reduce forward and backward (row-parallel A → column-parallel B)."""
    return _ReduceBoth.apply(x, tp, tag)


def gather_last(x: torch.Tensor, tp: TPGroup, *, tag: str) -> torch.Tensor:
    """All-gather the last dimension (BOOST §3.1: once, after the last layer); backward slices locally."""
    return _GatherLast.apply(x, tp, tag)


def all_reduce_stat(x: torch.Tensor, tp: TPGroup, *, tag: str, op: dist.ReduceOp = dist.ReduceOp.SUM) -> torch.Tensor:
    """A non-differentiable all-reduce of a small statistic (softmax max and normalizer); in place."""
    _all_reduce(x, tp, tag, "fwd", op)
    return x


def gather_untracked(x: torch.Tensor, tp: TPGroup, *, dim: int) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` (checkpoints and tests; not part of a training step's log)."""
    if tp.size == 1:
        return x.detach().clone()
    parts = [torch.empty_like(x) for _ in range(tp.size)]
    dist.all_gather(parts, x.detach().contiguous(), group=tp.group)
    return torch.cat(parts, dim=dim)
