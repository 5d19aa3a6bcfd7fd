"""Tensor-parallel collectives as autograd functions, with a tally of what each one sends.

BOOST (Wang et al., 2025, arXiv 2512.12131) §3 places every collective of a low-rank layer on the rank-r latent.
Getting the *backward* of those collectives right is the whole game, so each one here is an explicit
``torch.autograd.Function`` (``torch.distributed.nn.functional.all_reduce`` sums gradients in backward, which gives
p-times too large weight gradients when the output feeds replicated computation).

Megatron's conventions (Shoeybi et al., 2019, §3): ``f`` is identity forward / all-reduce backward (a replicated
tensor entering sharded computation), ``g`` is all-reduce forward / identity backward (partial sums leaving sharded
computation into replicated computation). BOOST's latents are produced *and* consumed by sharded computation, so
their collective is ``g`` followed by ``f``: all-reduce in both directions (:func:`reduce_latent`).

Every call records ``(tag, op, phase)`` with the number of collectives, the wall time spent blocked in them (the
whole call for a blocking collective, which is what overlapping could hide at most; only the ``wait`` for an
overlapped one: :func:`reduce_from_tp_async`, :func:`column_parallel`) and the elements/bytes of the *result*
tensor (for an all-reduce the size of the reduced tensor, for an all-gather the gathered tensor). This logical
payload is what the §5.2 model counts; a ring algorithm moves ``2(p-1)/p`` of it per rank.
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


class InFlight:
    """An all-reduce started with ``async_op=True``: :meth:`wait` blocks until it is done and returns the summed
    tensor (the autograd output of :func:`reduce_from_tp_async`), logging only the time spent blocked."""

    def __init__(self, tp: TPGroup, tag: str) -> None:
        self.tp, self.tag = tp, tag
        self.work: dist.Work | None = None
        self.tensor: torch.Tensor | None = None

    def start(self, buffer: torch.Tensor) -> None:
        if self.tp.size > 1:
            self.work = dist.all_reduce(buffer, group=self.tp.group, async_op=True)

    def wait(self) -> torch.Tensor:
        start = time.perf_counter()
        if self.work is not None:
            self.work.wait()
            self.tp.log.add(self.tag, "all_reduce", "fwd", self.tensor, seconds=time.perf_counter() - start)
            self.work = None
        return self.tensor


class _ReduceForwardAsync(torch.autograd.Function):
    """``g`` started asynchronously: the returned buffer holds the sum only after ``flight.wait()``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, flight: InFlight) -> torch.Tensor:
        out = x.contiguous().clone()
        flight.start(out)  # gloo's worker thread writes the sum into ``out`` while this thread computes on
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _ColumnParallel(torch.autograd.Function):
    """``f`` fused with the column-parallel B that reads a replicated latent; the all-reduce of the latent's
    gradient runs while B's weight gradient is computed (Megatron-LM's asynchronous tensor-parallel all-reduce,
    Narayanan et al., 2021, arXiv 2104.04473, §4.1 / ``LinearWithGradAccumulationAndAsyncCommunication``).

    ``weight`` is ``(n, r)`` with ``z`` ``(..., r)`` → ``(..., n)``, or batched ``(c, n, r)`` with ``z``
    ``(B, T, c, r)`` → ``(c, B, T, n)`` (BOOST §3.3's batched B for q/k/v and gate/up).
    """

    @staticmethod
    def forward(ctx, z: torch.Tensor, weight: torch.Tensor, tp: TPGroup, tag: str) -> torch.Tensor:
        device = z.device.type
        if torch.is_autocast_enabled(device):  # compute in autocast's dtype, as the plain op would
            dtype = torch.get_autocast_dtype(device)
            z, weight = z.to(dtype), weight.to(dtype)
        with torch.autocast(device, enabled=False):
            out = column(z, weight)
        ctx.save_for_backward(z, weight)
        ctx.tp, ctx.tag = tp, tag
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        z, weight = ctx.saved_tensors
        tp, grad = ctx.tp, grad.to(z.dtype)
        batched = weight.dim() == 3
        # partial over the ranks: each holds the rows of B (outputs) of its shard
        grad_z = (torch.einsum("cbtn,cnr->btcr", grad, weight) if batched else grad @ weight).contiguous()
        work = dist.all_reduce(grad_z, group=tp.group, async_op=True) if tp.size > 1 else None
        if batched:  # needs only local tensors: computed while the all-reduce is in flight
            grad_weight = torch.einsum("cbtn,btcr->cnr", grad, z)
        else:
            grad_weight = grad.reshape(-1, grad.shape[-1]).T @ z.reshape(-1, z.shape[-1])
        if work is not None:
            start = time.perf_counter()
            work.wait()
            tp.log.add(ctx.tag, "all_reduce", "bwd", grad_z, seconds=time.perf_counter() - start)
        return grad_z, grad_weight, None, None


def column(z: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``z Bᵀ``: ``(..., r)`` × ``(n, r)`` → ``(..., n)``, or ``(B, T, c, r)`` × ``(c, n, r)`` → ``(c, B, T, n)``."""
    if weight.dim() == 3:
        return torch.einsum("btcr,cnr->cbtn", z, weight)
    return torch.nn.functional.linear(z, weight)


def column_parallel(z: torch.Tensor, weight: torch.Tensor, tp: TPGroup, *, tag: str) -> torch.Tensor:
    """``z Bᵀ`` for a replicated latent ``z`` and a column-parallel ``B``, its backward all-reduce of ``z``'s
    gradient overlapped with ``B``'s weight gradient (see :class:`_ColumnParallel` for the shapes)."""
    if tp.size == 1:
        return column(z, weight)
    return _ColumnParallel.apply(z, weight, tp, tag)


def reduce_from_tp_async(x: torch.Tensor, tp: TPGroup, *, tag: str) -> InFlight:
    """``g`` without blocking: start the all-reduce of ``x`` and return at once; ``.wait()`` gives the sum.

    Whatever runs between the two calls overlaps the collective; nothing may read the tensor before ``wait``.
    """
    flight = InFlight(tp, tag)
    flight.tensor = _ReduceForwardAsync.apply(x, flight)
    return flight


def reduce_from_tp(x: torch.Tensor, tp: TPGroup, *, tag: str) -> torch.Tensor:
    """``g``: all-reduce forward, identity backward (row-parallel output into replicated computation)."""
    return _ReduceForward.apply(x, tp, tag)


def copy_to_tp(x: torch.Tensor, tp: TPGroup, *, tag: str) -> torch.Tensor:
    """``f``: identity forward, all-reduce backward (replicated input into column-parallel computation)."""
    return _CopyForward.apply(x, tp, tag)


def reduce_latent(x: torch.Tensor, tp: TPGroup, *, tag: str) -> torch.Tensor:
    """BOOST's latent collective (§3.1): ``f ∘ g``, all-reduce forward and backward (row-parallel A → column-parallel
    B)."""
    return copy_to_tp(reduce_from_tp(x, tp, tag=tag), tp, tag=tag)


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
