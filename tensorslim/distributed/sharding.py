"""Where each local tensor-parallel parameter comes from in the single-process (TP=1) state dict.

BOOST §4: weights are created from the *unsharded* tensors and then split, so a TP=p
run starts from exactly the TP=1 weights. The same specs run backwards to write full (unsharded) checkpoints,
which any TP degree, including the single-process trainer, can resume from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from tensorslim.distributed.comm import TPGroup, gather_untracked

Grouping = Literal["none", "cat", "stack"]


@dataclass(frozen=True, kw_only=True)
class ShardSpec:
    """One local parameter.

    Attributes:
        sources: names in the TP=1 state dict, in grouping order.
        grouping: ``"none"`` (one source), ``"cat"`` (concatenated along dim 0, e.g. q/k/v A factors → ``(3r, d)``)
            or ``"stack"`` (a new leading dim, e.g. q/k/v B factors → ``(3, d, r)`` for a batched GEMM).
        dim: the dimension of the grouped tensor split over TP ranks; None when replicated.
    """

    sources: tuple[str, ...]
    grouping: Grouping = "none"
    dim: int | None = None

    @property
    def sharded(self) -> bool:
        return self.dim is not None


def group(full: dict[str, torch.Tensor], spec: ShardSpec) -> torch.Tensor:
    """The grouped full tensor of ``spec`` from a TP=1 state dict."""
    parts = [full[name] for name in spec.sources]
    if spec.grouping == "cat":
        return torch.cat(parts, dim=0)
    if spec.grouping == "stack":
        return torch.stack(parts, dim=0)
    return parts[0]


def ungroup(tensor: torch.Tensor, spec: ShardSpec) -> dict[str, torch.Tensor]:
    """Inverse of :func:`group`."""
    if spec.grouping == "cat":
        return dict(zip(spec.sources, tensor.chunk(len(spec.sources), dim=0), strict=True))
    if spec.grouping == "stack":
        return dict(zip(spec.sources, tensor.unbind(0), strict=True))
    return {spec.sources[0]: tensor}


def local_shard(full: dict[str, torch.Tensor], spec: ShardSpec, *, rank: int, size: int) -> torch.Tensor:
    """This rank's contiguous slice of the grouped tensor (a copy)."""
    grouped = group(full, spec)
    if spec.dim is None:
        return grouped.clone()
    return grouped.chunk(size, dim=spec.dim)[rank].clone()


def full_tensors(local: dict[str, torch.Tensor], specs: dict[str, ShardSpec], tp: TPGroup) -> dict[str, torch.Tensor]:
    """Gather local tensors (parameters, gradients or optimizer moments) back into TP=1 names and shapes.

    A collective over the TP group: every rank must call it with the same keys in the same order.
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in local.items():
        spec = specs[name]
        whole = tensor.detach().clone() if spec.dim is None else gather_untracked(tensor, tp, dim=spec.dim)
        out.update({key: value.contiguous() for key, value in ungroup(whole, spec).items()})
    return out
