"""FSDP2 on the data-parallel axis of a ``(dp, tp)`` mesh, around a tensor-parallel (or plain) model.

torchtitan's order (``parallelize``: TP, then FSDP; Liang et al., 2024, arXiv 2410.06511, §3.1): the TP model's
local parameters are ordinary tensors on each rank; :func:`fully_shard` then splits every one of them along dim 0
over the ``dp`` ranks of its TP column. Parameters, gradients (reduce-scattered in backward) and AdamW's moments
(created like their parameters) all hold ``1/dp`` of the TP-local size, where DDP keeps all of it on every rank.

Each transformer block is its own FSDP group (all-gathered just before its forward, resharded after it, gathered
again for its backward); the root group holds the embedding, the final norm and the head.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter
from torch.distributed.tensor import DTensor, Shard

from tensorslim.distributed.comm import CommLog, TPGroup

PRECISIONS = ("fp32", "bf16")


def mixed_precision(name: str) -> MixedPrecisionPolicy:
    """``fp32``: no casts. ``bf16``: parameters all-gathered and computed in bf16, gradients reduced in fp32, the
    sharded master weights and AdamW state stay fp32 (FSDP2's ``MixedPrecisionPolicy``)."""
    if name not in PRECISIONS:
        raise ValueError(f"mixed_precision={name!r} is unknown; allowed: {list(PRECISIONS)}")
    if name == "fp32":
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


class _LoggedAllGather(DefaultAllGather):
    """FSDP2's own all-gather of a group's parameter shards, plus an entry in the communication log."""

    def __init__(self, log: CommLog) -> None:
        self.log = log

    def __call__(self, output_tensor, input_tensor, group, async_op=False):  # noqa: ANN001, ANN204 - FSDP2's signature
        phase = "bwd" if torch._C._current_graph_task_id() != -1 else "fwd"  # inside autograd's backward or not
        self.log.add("dp.params", "all_gather", phase, output_tensor)
        return super().__call__(output_tensor, input_tensor, group, async_op)


class _LoggedReduceScatter(DefaultReduceScatter):
    """FSDP2's reduce-scatter of a group's gradients, plus an entry in the communication log."""

    def __init__(self, log: CommLog) -> None:
        self.log = log

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):  # noqa: ANN001, ANN204
        self.log.add("dp.grads", "reduce_scatter", "bwd", input_tensor)
        return super().__call__(output_tensor, input_tensor, group, op, async_op)


def shard_blocks(
    model: nn.Module, dp_mesh: DeviceMesh, *, blocks: nn.ModuleList, precision: str = "fp32", log: CommLog | None = None
) -> nn.Module:
    """``fully_shard`` each of ``blocks``, then ``model`` itself (bottom-up, as FSDP2 requires); in place.

    Args:
        model: the (tensor-parallel) model; its remaining parameters form the root group.
        dp_mesh: the 1-D data-parallel mesh (``mesh["dp"]``).
        blocks: the model's transformer blocks.
        precision: ``fp32`` or ``bf16`` (see :func:`mixed_precision`).
        log: where FSDP2's all-gathers (``dp.params``) and reduce-scatters (``dp.grads``) are tallied, by the
            logical size of the gathered parameters / the reduced gradients.
    """
    policy = mixed_precision(precision)
    size = dp_mesh.size()
    for module in [*blocks, model]:
        fully_shard(module, mesh=dp_mesh, mp_policy=policy, shard_placement_fn=lambda p: even_split(p, size))
        if log is not None:
            module.set_custom_all_gather(_LoggedAllGather(log))
            module.set_custom_reduce_scatter(_LoggedReduceScatter(log))
    return model


def even_split(param: torch.Tensor, size: int) -> Shard:
    """The first dimension that ``size`` ranks split evenly (dim 0 when none does).

    FSDP2 splits dim 0 by default, but BTP's batched B factors have a leading dim of 3 (q, k, v) or 2 (gate, up):
    over 4 ranks, one rank would hold a third of the q/k/v factors instead of a quarter.
    """
    return Shard(next((dim for dim, n in enumerate(param.shape) if n % size == 0), 0))


def reshard(model: nn.Module) -> None:
    """Put every FSDP2 group of ``model`` back to its sharded parameters.

    The root group keeps its parameters gathered after a forward without backward (an evaluation), and meanwhile
    ``named_parameters()`` yields the gathered tensors, not the sharded ones AdamW updates.
    """
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a parameter, gradient or optimizer moment (a DTensor's local shard; else itself)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def dp_split(tensor: torch.Tensor) -> tuple[int, int, int]:
    """``(dim, start, stop)``: the range of dimension ``dim`` of the full (TP-local) tensor that this rank holds.

    FSDP2 splits its shard dimension like ``torch.chunk``: ``ceil(n / dp)`` per rank, the last ranks possibly fewer
    or none. A tensor that is not a DTensor is held whole.
    """
    if not isinstance(tensor, DTensor):
        return 0, 0, tensor.shape[0] if tensor.dim() else 1
    (placement,) = tensor.placements
    dim, mesh = placement.dim, tensor.device_mesh
    n = tensor.shape[dim]
    step = math.ceil(n / mesh.size())
    start = min(mesh.get_local_rank() * step, n)
    return dim, start, min(start + step, n)


@torch.no_grad()
def clip_grad_norm(
    params: list[tuple[nn.Parameter, bool]], max_norm: float, *, tp: TPGroup, dp_group: dist.ProcessGroup | None
) -> float:
    """``clip_grad_norm_`` over the unsharded model from local shards.

    ``params`` pairs each parameter with whether TP splits it. Squares of FSDP shards add over the dp group (DDP's
    replicas are whole, so nothing to add); TP-split parameters then add over the TP group, TP-replicated ones
    count once.
    """
    device = local(params[0][0]).device
    sums = torch.zeros(2, dtype=torch.float32, device=device)  # [TP-split, TP-replicated]
    fsdp = False
    for param, tp_split in params:
        if param.grad is None:
            continue
        fsdp = fsdp or isinstance(param.grad, DTensor)
        sums[0 if tp_split else 1] += local(param.grad).float().pow(2).sum()
    if fsdp and dp_group is not None:
        dist.all_reduce(sums, group=dp_group)
    if tp.size > 1:
        split = sums[:1].clone()
        tp.log.add("optim.grad_norm", "all_reduce", "fwd", split)
        dist.all_reduce(split, group=tp.group)
        sums = torch.cat([split, sums[1:]])
    total = sums.sum().sqrt()
    if math.isfinite(max_norm):
        scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for param, _ in params:
            if param.grad is not None:
                local(param.grad).mul_(scale)
    return total.item()
