"""Run small tensor work on one thread: every op that opens an OpenMP parallel region pays for waking the others.

On CPU, PyTorch hands any elementwise op over 32,768 elements, every MKL GEMM (MKL opened two parallel regions for a
12 × 12 × 240 product) and the fused AdamW kernel (one region per parameter tensor) to all ``torch.get_num_threads()``
threads. For tiny tensors the region costs more than the work: waking the sleeping threads (the CLI sets
``OMP_WAIT_POLICY=PASSIVE``), then waiting at the barrier. A CoMERA ``bert6`` train step opened 2,409 regions at 2
threads, 1,824 of them for the TT cores' contractions, the TT embedding's grouped GEMMs and the optimizer's
per-parameter updates (2-core AMD EPYC). A 12 × 12 × 240 ``mm`` took 13 µs of the main thread's CPU
time at two threads and 3.6 µs at one, before any waiting.

:func:`one_thread` sets PyTorch's intra-op thread count to 1 for a block (``torch.set_num_threads``, which costs
about 0.1 µs) and :func:`one_thread_graph` runs a differentiable function on one thread in forward *and* backward:
the backward of ops recorded inside a block would otherwise run at the engine's thread count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch.autograd.function import once_differentiable
from torch.utils._python_dispatch import _get_current_dispatch_mode

# Mean parameter size (elements) under which the whole AdamW update runs on one thread. PyTorch's fused CPU AdamW
# opens one OpenMP parallel region per parameter tensor; a CoMERA bert6 model has 300 tensors averaging 5,600
# elements, so at two threads its update was 300 regions, each costing more than its work. 32,768 is PyTorch's own
# grain size: elementwise ops on fewer elements than that already run on one thread.
ONE_THREAD_MEAN_NUMEL = 1 << 15


@contextmanager
def one_thread() -> Iterator[None]:
    """PyTorch's intra-op thread count set to 1 inside the block, restored after it."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class _OneThreadGraph(torch.autograd.Function):
    """``fn(*inputs)`` recorded as an inner autograd graph on one thread; backward runs that graph on one thread.

    Like a checkpoint that keeps its activations: forward builds the inner graph on detached copies of the inputs,
    backward differentiates it with :func:`torch.autograd.grad` (a re-entrant call, as reentrant checkpointing
    makes). Nothing is recomputed.
    """

    @staticmethod
    def forward(ctx, fn, *inputs):
        leaves = [x.detach().requires_grad_(x.requires_grad) for x in inputs]
        with torch.enable_grad(), one_thread():
            outs = tuple(fn(*leaves))
        ctx.leaves, ctx.outs = leaves, outs
        return tuple(out.detach() for out in outs)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):
        wanted = [i for i, leaf in enumerate(ctx.leaves) if leaf.requires_grad]
        with one_thread():
            # Retained: the outer graph may be run again (retain_graph=True); the inner one goes with this node.
            got = torch.autograd.grad(
                ctx.outs, [ctx.leaves[i] for i in wanted], grads, retain_graph=True, allow_unused=True
            )
        result: list[torch.Tensor | None] = [None] * len(ctx.leaves)
        for i, grad in zip(wanted, got, strict=True):
            result[i] = grad
        return None, *result


def one_thread_graph(fn: Callable[..., Sequence[torch.Tensor]], *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``tuple(fn(*inputs))``, with forward and backward on one thread on CPU.

    ``fn`` must be a function of ``inputs`` alone (tensors it closes over get no gradient). Without a gradient to
    record it runs under :func:`one_thread`; on another device, on one thread already, while ``torch.compile``
    traces or under a Python dispatch mode (fake tensors, FLOP counting) it is ``fn`` called as is.
    """
    if (
        any(x.device.type != "cpu" for x in inputs)
        or torch.get_num_threads() == 1
        or torch.compiler.is_compiling()
        or _get_current_dispatch_mode() is not None
    ):
        return tuple(fn(*inputs))
    if not torch.is_grad_enabled() or not any(x.requires_grad for x in inputs):
        with one_thread():
            return tuple(fn(*inputs))
    return _OneThreadGraph.apply(fn, *inputs)


def update_small_on_one_thread(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """``optimizer``, whose ``step`` runs on one thread when its parameters are on CPU and average fewer than
    :data:`ONE_THREAD_MEAN_NUMEL` elements (models of tiny tensors, such as CoMERA's TT cores).

    Done with the optimizer's own step hooks (``torch.set_num_threads``, as :func:`one_thread`),
    so the object stays a plain ``torch.optim.AdamW`` (the sharded checkpoints check its type). The update of each
    element is the same at any thread count.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    small = sum(p.numel() for p in params) < ONE_THREAD_MEAN_NUMEL * len(params)
    if not params or not small or any(p.device.type != "cpu" for p in params):
        return optimizer
    saved: list[int] = []  # the thread count to restore; kept if a step raised, so the next step restores it

    def enter(*_) -> None:
        if not saved:
            saved.append(torch.get_num_threads())
        torch.set_num_threads(1)

    def leave(*_) -> None:
        torch.set_num_threads(saved.pop())

    optimizer.register_step_pre_hook(enter)
    optimizer.register_step_post_hook(leave)
    return optimizer
