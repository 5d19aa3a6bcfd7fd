"""One tensor- (and data-) parallel optimizer step: loss, backward (DDP averages over dp), global clipping, AdamW.

Kept apart from the CLI loop so that tests drive exactly the step that ``tensorslim train --tp`` runs.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from tensorslim.distributed.comm import CommLog, all_reduce_stat
from tensorslim.distributed.parallelize import TPCausalLM


def _logged_allreduce(state: tuple[dist.ProcessGroup, CommLog], bucket):
    """DDP's own all-reduce hook, plus an entry in the TP model's communication log.

    ``bucket`` (a ``dist.GradBucket``) and the returned future stay unannotated: DDP inspects the annotations and
    rejects the string form that ``from __future__ import annotations`` gives them.
    """
    group, log = state
    log.add("dp.grads", "all_reduce", "bwd", bucket.buffer())
    return default_hooks.allreduce_hook(group, bucket)


def data_parallel(model: TPCausalLM, group: dist.ProcessGroup | None, *, size: int) -> nn.Module:
    """Wrap ``model`` in DDP over the data-parallel axis of the mesh (the TP model itself when ``size`` is 1).

    DDP's bucketed gradient all-reduces run on the dp group during backward, next to the TP collectives.
    """
    if size == 1:
        return model
    ddp = DistributedDataParallel(model, process_group=group)  # the model has no buffers
    ddp.register_comm_hook((group, model.tp.log), _logged_allreduce)
    return ddp


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
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: list[torch.Tensor],
    *,
    grad_clip: float,
    dp_group: dist.ProcessGroup | None = None,
    dp_size: int = 1,
) -> tuple[float, float]:
    """One step over this rank's micro-batches ``(b, T)``; returns (mean loss over DP ranks, grad norm).

    ``model`` is a :class:`TPCausalLM` or its :func:`data_parallel` wrapper.
    """
    tp_model: TPCausalLM = model.module if isinstance(model, DistributedDataParallel) else model
    loss_sum = 0.0
    for i, batch in enumerate(batches):
        last = i == len(batches) - 1
        # DDP reduces gradients once, on the last micro-batch
        sync = contextlib.nullcontext() if last or tp_model is model else model.no_sync()
        with sync:
            loss = tp_model.loss_from_logits(model(batch), batch)
            (loss / len(batches)).backward()
        loss_sum += loss.item()
    grad_norm = clip_grad_norm_tp(tp_model, grad_clip if grad_clip > 0 else math.inf)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    mean_loss = torch.tensor([loss_sum / len(batches)])
    if dp_size > 1:
        dist.all_reduce(mean_loss, group=dp_group)
        mean_loss /= dp_size
    return mean_loss.item(), grad_norm
