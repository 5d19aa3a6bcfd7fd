"""Rank-adaptive CoLA, the ``cola-adaptive`` method: CoMERA's rank gates and two stages on CoLA's latent.

Beyond both papers. CoLA (Liu et al., 2025, arXiv 2502.10940, §3) fixes one latent rank r for every projection
``B σ(A x)``. CoMERA (Yang et al., NeurIPS 2024, arXiv 2405.14377, §3) learns TT ranks with a gate per bond, an L1
penalty in an early stage and a λ-switched size objective toward ``S* = ratio·S`` in a late stage. Here every CoLA
projection carries one gate on its rank-r latent, ``y = B (thr(g) ⊙ σ(A x))``
(:meth:`~tensorslim.layers.lowrank.LowRankLinear.enable_gates`), and the same
:class:`~tensorslim.methods.comera.train_hook.CoMERAHook` trains it: dead ranks are sliced out of ``A``'s rows and
``B``'s columns (and their Adam moments) at each stage end, so every layer ends with its own rank.

Differences from ``comera``: the factors and the rest of the model train at the run's learning rate, as in ``cola``
(CoMERA halves the rate of the non-tensorized rest), so a run compares with fixed-rank CoLA on equal terms; gates keep
CoMERA's 10× rate; and the late stage ends by killing the smallest gates until ``S ≤ S*`` when the λ-switch alone
has not got there (``prune_at_end``), so the size lands on the target.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from tensorslim.convert import convert_
from tensorslim.layers.lowrank import CoLAConfig
from tensorslim.methods.comera import CoMERAOptions, stage_hook, staged_method
from tensorslim.methods.comera.train_hook import LR_SCALES, CoMERAHook
from tensorslim.methods.recipes import recipe_for
from tensorslim.methods.registry import MethodContext, register_method
from tensorslim.options import option

# The factors ("cores") and the rest at the run's rate, as fixed-rank CoLA trains them; gates at CoMERA's 10×.
ADAPTIVE_LR_SCALES = {**LR_SCALES, "other": 1.0}


@dataclass(frozen=True, kw_only=True)
class AdaptiveOptions(CoMERAOptions):
    """The starting latent rank and CoMERA's stage settings (the same flags as ``comera``)."""

    rank: int | None = option(None, "starting latent rank (default: the model's CoLA recipe, else d/4)")
    prune_at_end: bool = option(
        True, "kill the smallest gates at the end of the late stage until the size target is met", flag="prune-at-end"
    )


def adaptive_config(context: MethodContext) -> CoLAConfig:
    """CoLA's layer config for the run (the recipe's rank and ``only_lr_act``) with a rank gate per layer."""
    recipe = recipe_for(context.model_name)
    return CoLAConfig(
        rank=context.options.rank or recipe.cola_rank,
        init="svd" if context.pretrained else "random",
        only_lr_act=recipe.only_lr_act,
        rank_gates=True,
    )


def _convert(model: nn.Module, context: MethodContext) -> list:
    return [convert_(model, adaptive_config(context))]


def _hook(context: MethodContext) -> CoMERAHook:
    return stage_hook(context, lr_scales=ADAPTIVE_LR_SCALES)


register_method(
    staged_method(
        name="cola-adaptive",
        help="rank-adaptive CoLA: CoMERA's rank gates and two stages on CoLA's latent (beyond arXiv 2502.10940)",
        convert=_convert,
        hook=_hook,
        options=AdaptiveOptions,
        sliced="A and B",
    )
)
