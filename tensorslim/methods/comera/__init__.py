"""CoMERA (Yang et al., NeurIPS 2024, arXiv 2405.14377): rank-adaptive tensor-train training, the ``comera`` method.

Every projection becomes a 6-core TT layer of max rank 30 with a rank gate per TT bond (§3). BERT-family models are
tensorized as in the paper's experiments (:func:`~tensorslim.methods.comera.tensorize.comera_`, §5: also the TTM word
embedding; the other embeddings stay dense). Training runs CoMERA's two stages (§3) in the one trainer through
:class:`~tensorslim.methods.comera.train_hook.CoMERAHook`.

Modules: :mod:`~tensorslim.methods.comera.gates` (rank gates, size, truncation, rank report),
:mod:`~tensorslim.methods.comera.objective` (the two-stage loss), :mod:`~tensorslim.methods.comera.optim` (the three
AdamW groups), :mod:`~tensorslim.methods.comera.train_hook` (the stages in the trainer),
:mod:`~tensorslim.methods.comera.tensorize` (the BERT recipe) and :mod:`~tensorslim.methods.comera.static` (pieces
of the CUDA-graph step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import nn

from tensorslim._checks import check_fields, require_int
from tensorslim.convert import convert_
from tensorslim.layers.tt import TTConfig
from tensorslim.methods.comera.gates import (
    enable_gates,
    format_rank_report,
    gate_penalty,
    model_size,
    prune_to_size_,
    rank_report,
    truncate_,
)
from tensorslim.methods.comera.objective import CoMERAConfig, CoMERAObjective
from tensorslim.methods.comera.optim import build_optimizer, param_groups
from tensorslim.methods.comera.tensorize import comera_
from tensorslim.methods.comera.train_hook import CoMERAHook
from tensorslim.methods.lowrank import TT_RANK
from tensorslim.methods.registry import LINEAR_FAMILIES, Method, MethodContext, register_method
from tensorslim.options import option

__all__ = [
    "CoMERAConfig",
    "CoMERAHook",
    "CoMERAObjective",
    "CoMERAOptions",
    "build_optimizer",
    "comera_",
    "enable_gates",
    "format_rank_report",
    "gate_penalty",
    "model_size",
    "param_groups",
    "prune_to_size_",
    "rank_report",
    "truncate_",
]


@dataclass(frozen=True, kw_only=True)
class CoMERAOptions:
    """CoMERA's rank and the two stages' settings."""

    rank: int | None = option(None, "TT max rank (default: CoMERA's 30)")
    target_ratio: float = option(0.5, "CoMERA: late-stage target size S*/S, in (0, 1]", flag="comera-target-ratio")
    late_fraction: float = option(0.5, "CoMERA: share of steps in the late stage", flag="comera-late-fraction")
    gamma: float = option(0.01, "CoMERA: weight of the rank penalty (early stage)", flag="comera-gamma")
    target_loss: float | None = option(
        None,
        "CoMERA: late-stage loss target L* (default: mean task loss of the last tenth of the early stage)",
        flag="comera-target-loss",
    )
    freeze_at_target: bool = option(
        True, "CoMERA: freeze the rank gates once the late stage reaches S*", flag="comera-freeze-at-target"
    )
    truncate_every: int = option(
        0, "CoMERA: also slice dead ranks out every this many steps (0: stage ends only)", flag="comera-truncate-every"
    )
    prune_at_end: bool = option(
        False,
        "kill the smallest gates at the end of the late stage until the size target is met (not in CoMERA)",
        flag="prune-at-end",
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if self.rank is not None:
            require_int("rank", self.rank)
        if not 0 < self.target_ratio <= 1:
            raise ValueError(f"comera_target_ratio={self.target_ratio} is invalid; allowed: (0, 1]")
        if not 0 <= self.late_fraction < 1:
            raise ValueError(f"comera_late_fraction={self.late_fraction} is invalid; allowed: [0, 1)")
        if not 0 <= self.gamma < math.inf:
            raise ValueError(f"comera_gamma={self.gamma} is invalid; allowed: a finite number >= 0")
        if self.target_loss is not None and not self.target_loss > 0:
            raise ValueError(f"comera_target_loss={self.target_loss} is invalid; allowed: a number > 0")
        require_int("comera_truncate_every", self.truncate_every, minimum=0)
        if not isinstance(self.prune_at_end, bool):
            raise ValueError(f"prune_at_end={self.prune_at_end!r} is invalid; allowed: True or False")


def _convert(model: nn.Module, context: MethodContext) -> list:
    rank = context.options.rank or TT_RANK
    init = "tt_svd" if context.pretrained else "random"
    if context.family == "bert":
        return list(comera_(model, rank=rank, init=init, rank_gates=False))
    return [convert_(model, TTConfig(rank=rank, init=init))]


def stage_hook(context: MethodContext, **extra: Any) -> CoMERAHook:
    """The two-stage hook from the run's :class:`CoMERAOptions` (``extra``: further :class:`CoMERAHook` arguments)."""
    options: CoMERAOptions = context.options
    return CoMERAHook(
        context.steps,
        late_fraction=options.late_fraction,
        config=CoMERAConfig(gamma=options.gamma, target_ratio=options.target_ratio),
        target_loss=options.target_loss,
        freeze_at_target=options.freeze_at_target,
        truncate_every=options.truncate_every,
        prune_at_end=options.prune_at_end,
        run_dir=context.run_dir,
        **extra,
    )


def staged_method(*, sliced: str, note: str = "", **fields: Any) -> Method:
    """A method trained in CoMERA's two rank-adaptive stages (``fields``: name, help, convert, hook, options). It
    applies to the linear families and runs on one data-parallel rank: its stages slice dead ranks out of
    ``sliced`` between steps, which DDP's buckets and FSDP2's shards cannot follow."""
    return Method(
        **fields,
        data_parallel=(),
        parallel_note=f"its stages slice dead ranks out of {sliced} between steps, which DDP's buckets and FSDP2's "
        f"shards (fixed when the model is wrapped) cannot follow{note}",
        families=LINEAR_FAMILIES,
    )


register_method(
    staged_method(
        name="comera",
        help="CoMERA: TT layers with rank gates, trained in two rank-adaptive stages (arXiv 2405.14377)",
        convert=_convert,
        hook=stage_hook,
        options=CoMERAOptions,
        sliced="the TT cores",
        note="; the plain TT layers ('tt', 'lax-tt') run data-parallel",
    )
)
