"""One tensor- (and data-) parallel optimizer step: loss, backward, DP gradient average, global clipping, AdamW.

Kept apart from the CLI loop so that tests drive exactly the step that ``tensorslim train --tp`` runs.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from tensorslim.distributed.comm import all_reduce_stat
from tensorslim.distributed.parallelize import TPCausalLM


def average_dp_gradients(model: TPCausalLM, group: dist.ProcessGroup | None, *, size: int) -> None:
    """Mean of the gradients over the data-parallel axis: one flat all-reduce (DDP's math, without overlap)."""
    if size == 1:
        return
    grads = [p.grad for p in model.parameters()]
    flat = _flatten_dense_tensors(grads)
    model.tp.log.add("dp.grads", "all_reduce", "bwd", flat)
    dist.all_reduce(flat, group=group)
    flat /= size
    for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
        grad.copy_(synced)


@torch.no_grad()
def clip_grad_norm_tp(model: TPCausalLM, max_norm: float) -> float:
    """``torch.nn.utils.clip_grad_norm_`` over the *unsharded* model: sharded parameters add their squares over
    the TP group, replicated ones (identical on every rank) count once."""
    sharded = torch.zeros((), dtype=torch.float32)
    replicated = torch.zeros((), dtype=torch.float32)
    for name, param in model.named_parameters():
        square = param.grad.float().pow(2).sum()
        if model.specs[name].sharded:
            sharded += square
        else:
            replicated += square
    total = (all_reduce_stat(sharded.reshape(1), model.tp, tag="optim.grad_norm")[0] + replicated).sqrt()
    if math.isfinite(max_norm):
        scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for param in model.parameters():
            param.grad.mul_(scale)
    return total.item()


def train_step(
    model: TPCausalLM,
    optimizer: torch.optim.Optimizer,
    batches: list[torch.Tensor],
    *,
    grad_clip: float,
    dp_group: dist.ProcessGroup | None = None,
    dp_size: int = 1,
) -> tuple[float, float]:
    """One step over this rank's micro-batches ``(b, T)``; returns (mean loss over DP ranks, grad norm)."""
    loss_sum = 0.0
    for batch in batches:
        loss = model.loss(batch)
        (loss / len(batches)).backward()
        loss_sum += loss.item()
    average_dp_gradients(model, dp_group, size=dp_size)
    grad_norm = clip_grad_norm_tp(model, grad_clip if grad_clip > 0 else math.inf)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    mean_loss = torch.tensor([loss_sum / len(batches)])
    if dp_size > 1:
        dist.all_reduce(mean_loss, group=dp_group)
        mean_loss /= dp_size
    return mean_loss.item(), grad_norm
