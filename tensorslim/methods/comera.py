"""CoMERA (Yang et al., NeurIPS 2024, arXiv 2405.14377): rank-adaptive tensor-train training.

Every projection becomes a 6-core TT layer of max rank 30 (§3.1), with a rank gate per TT bond (§2.1). BERT-family
models also get CoMERA's TTM word embedding (§3.2; the other embeddings stay dense). Training runs CoMERA's two stages
(§2.2-2.3) through :class:`tensorslim.comera.train_hook.CoMERAHook`.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from tensorslim._checks import require_int
from tensorslim.convert import convert_
from tensorslim.layers.tt import TTConfig
from tensorslim.methods.lowrank import TT_RANK
from tensorslim.methods.registry import Method, MethodContext, register_method
from tensorslim.options import option


@dataclass(frozen=True, kw_only=True)
class CoMERAOptions:
    """CoMERA's rank and the two stages' settings."""

    rank: int | None = option(None, "TT max rank (default: CoMERA's 30)")
    target_ratio: float = option(0.5, "CoMERA: late-stage target size S*/S, in (0, 1]", flag="comera-target-ratio")
    late_fraction: float = option(0.5, "CoMERA: share of steps in the late stage", flag="comera-late-fraction")
    gamma: float = option(0.01, "CoMERA: weight of the rank penalty (early stage)", flag="comera-gamma")
    target_loss: float | None = option(
        None, "CoMERA: late-stage loss target L* (default: end-of-early-stage loss)", flag="comera-target-loss"
    )

    def __post_init__(self) -> None:
        if self.rank is not None:
            require_int("rank", self.rank)
        if not 0 < self.target_ratio <= 1:
            raise ValueError(f"comera_target_ratio={self.target_ratio} is invalid; allowed: (0, 1]")
        if not 0 <= self.late_fraction < 1:
            raise ValueError(f"comera_late_fraction={self.late_fraction} is invalid; allowed: [0, 1)")
        if not self.gamma >= 0:
            raise ValueError(f"comera_gamma={self.gamma} is invalid; allowed: a number >= 0")
        if self.target_loss is not None and not self.target_loss > 0:
            raise ValueError(f"comera_target_loss={self.target_loss} is invalid; allowed: a number > 0")


def _convert(model: nn.Module, context: MethodContext) -> list:
    rank = context.options.rank or TT_RANK
    init = "tt_svd" if context.pretrained else "random"
    if context.family == "bert":
        from tensorslim.models.bert import comera_

        return list(comera_(model, rank=rank, init=init, rank_gates=False))
    return [convert_(model, TTConfig(rank=rank, init=init))]


def _hook(context: MethodContext):  # noqa: ANN202 - a CoMERAHook
    from tensorslim.comera.objective import CoMERAConfig
    from tensorslim.comera.train_hook import CoMERAHook

    options: CoMERAOptions = context.options
    return CoMERAHook(
        context.steps,
        late_fraction=options.late_fraction,
        config=CoMERAConfig(gamma=options.gamma, target_ratio=options.target_ratio),
        target_loss=options.target_loss,
        run_dir=context.run_dir,
    )


register_method(
    Method(
        name="comera",
        help="CoMERA: TT layers with rank gates, trained in two rank-adaptive stages (arXiv 2405.14377)",
        convert=_convert,
        hook=_hook,
        options=CoMERAOptions,
    )
)
