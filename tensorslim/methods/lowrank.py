"""Low-rank training methods: CoLA, SVD, CoLA-M, LaX-CoLA, LaX-SVD, plain TT and LaX-TT.

* CoLA (Liu et al., 2025, arXiv 2502.10940): every projection inside the blocks becomes ``B·σ(A·x)``, trained from
  scratch with CoLA's initialization (§2.1) and the recipe's rank and ``only_lr_act`` (§2.2).
* SVD: the same bottleneck without σ (the paper's low-rank baseline).
* CoLA-M (§4): CoLA plus latent checkpointing of every block; the same weights as ``cola``.
* TT: CoMERA's tensor-train layers (Yang et al., 2024, arXiv 2405.14377, §2) with its random init and max rank, but
  no rank gates and no rank-adaptive stages: the plain-TT baseline of LaX-TT.
* LaX (Zhang et al., 2025, arXiv 2505.21732): latent crossing between consecutive blocks with Kronecker gates; on
  CoMERA's TT layers (LaX-TT) the crossing runs at the middle bond, with intra-layer residuals on attention.
  ``--lax-crossing zero`` is the G = 0 ablation: Kronecker crossings with both factors zero and frozen, so the
  crossing adds nothing while the r-dimensional LayerNorm of the crossing layers stays (LaX §3).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from tensorslim._checks import check_fields, require_int
from tensorslim.convert import convert_
from tensorslim.layers.cola_m import CoLAMConfig
from tensorslim.layers.lax import CROSSINGS, LaXCoLAConfig, LaXSVDConfig
from tensorslim.layers.lax_tt import LaXTTConfig, LaXTTLinear
from tensorslim.layers.lowrank import CoLAConfig, SVDConfig
from tensorslim.layers.tt import TTConfig
from tensorslim.methods.recipes import recipe_for
from tensorslim.methods.registry import LINEAR_FAMILIES, Method, MethodContext, register_method
from tensorslim.options import option

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")  # LaX-TT's IntraRes_Pos (q, k, v, out)
TT_RANK = 30  # CoMERA's --max-rank


@dataclass(frozen=True, kw_only=True)
class RankOptions:
    """The one option of the low-rank methods."""

    rank: int | None = option(None, "latent rank (default: the model's recipe, else a quarter of min(d_in, d_out))")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.rank is not None:
            require_int("rank", self.rank)


LAX_TT_CROSSINGS = (*CROSSINGS, "zero")


@dataclass(frozen=True, kw_only=True)
class TTOptions(RankOptions):
    """The TT max rank."""

    rank: int | None = option(None, "TT max rank (default: CoMERA's 30)")


@dataclass(frozen=True, kw_only=True)
class LaXTTOptions(TTOptions):
    """The TT max rank and the kind of LaX crossing."""

    crossing: str = option("kronecker", f"LaX crossing G: one of {', '.join(LAX_TT_CROSSINGS)}", flag="lax-crossing")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.crossing not in LAX_TT_CROSSINGS:
            raise ValueError(f"lax_crossing={self.crossing!r} is unknown; allowed: {list(LAX_TT_CROSSINGS)}")


def _init(context: MethodContext) -> str:
    """Pretrained weights are factorized by SVD; models trained from scratch use the method's random init."""
    return "svd" if context.pretrained else "random"


def _rank(context: MethodContext) -> int | None:
    return context.options.rank or recipe_for(context.model_name).cola_rank


def _converter(make_config):  # noqa: ANN001, ANN202 - (context -> layer config) -> Conversion
    def convert(model: nn.Module, context: MethodContext) -> list:
        return [convert_(model, make_config(context))]

    return convert


def _cola_like(config_type: type) -> Callable[[MethodContext], object]:
    """A CoLA-family layer config (CoLA, CoLA-M, LaX-CoLA) with the recipe's rank and ``only_lr_act`` (CoLA §2.2)."""

    def make(context: MethodContext) -> object:
        only_lr_act = recipe_for(context.model_name).only_lr_act
        return config_type(rank=_rank(context), init=_init(context), only_lr_act=only_lr_act)

    return make


def _tt_init(context: MethodContext) -> str:
    """Pretrained weights are decomposed by TT-SVD; from scratch, CoMERA's Gaussian init."""
    return "tt_svd" if context.pretrained else "random"


def _tt(context: MethodContext) -> TTConfig:
    return TTConfig(rank=context.options.rank or TT_RANK, init=_tt_init(context))


def _convert_lax_tt(model: nn.Module, context: MethodContext) -> list:
    """LaX-TT; ``crossing="zero"`` builds Kronecker crossings, then zeroes and freezes both factors (G ≡ 0)."""
    zero = context.options.crossing == "zero"
    config = LaXTTConfig(
        rank=context.options.rank or TT_RANK,
        init=_tt_init(context),
        intra_res=ATTENTION,
        crossing="kronecker" if zero else context.options.crossing,
    )
    report = convert_(model, config)
    if zero:
        for layer in model.modules():
            if isinstance(layer, LaXTTLinear) and layer.crossing is not None:
                with torch.no_grad():
                    for param in layer.crossing.parameters():
                        param.zero_().requires_grad_(False)
    return [report]


_LOW_RANK_TP = ("btp", "vanilla")
# Why these methods run data-parallel only (DDP or FSDP2), not tensor-parallel.
_LAX_NOTE = (
    "TP: the BTP/vanilla blocks have no latent crossing between blocks (LaX §3); data parallelism runs LaX itself"
)
_COLA_M_NOTE = (
    "TP: --method cola with --tp-style btp recomputes the latents the same way (BOOST §3.4); data parallelism runs "
    "CoLA-M itself"
)
_TT_NOTE = (
    "TP: a TT layer contracts its cores in sequence and has no r-wide latent to cut at (BOOST §3.1 needs one); "
    "data parallelism runs the TT model itself"
)
# The rank-r methods: one record each, differing in the config they convert to and how they run in parallel.
_RANK_METHODS = (
    (
        "cola",
        "CoLA: every block projection becomes B·σ(A·x) (arXiv 2502.10940)",
        _cola_like(CoLAConfig),
        {"tensor_parallel": _LOW_RANK_TP},
    ),
    (
        "svd",
        "plain low-rank B·A projections (CoLA's SVD baseline)",
        lambda c: SVDConfig(rank=_rank(c), init=_init(c)),
        {"tensor_parallel": _LOW_RANK_TP},
    ),
    (
        "cola-m",
        "CoLA-M: CoLA with only the rank-r latents checkpointed (arXiv 2502.10940 §4)",
        _cola_like(CoLAMConfig),
        {"parallel_note": _COLA_M_NOTE, "families": LINEAR_FAMILIES},
    ),
    (
        "lax-cola",
        "LaX on CoLA: latent crossing between consecutive blocks (arXiv 2505.21732)",
        _cola_like(LaXCoLAConfig),
        {"parallel_note": _LAX_NOTE},
    ),
    (
        "lax-svd",
        "LaX on SVD layers (arXiv 2505.21732)",
        lambda c: LaXSVDConfig(rank=_rank(c), init=_init(c)),
        {"parallel_note": _LAX_NOTE},
    ),
)
for _name, _help, _config, _parallel in _RANK_METHODS:
    register_method(Method(name=_name, help=_help, convert=_converter(_config), options=RankOptions, **_parallel))
register_method(
    Method(
        name="tt",
        help="plain TT layers: CoMERA's init and max rank, no rank gates or stages (arXiv 2405.14377)",
        convert=_converter(_tt),
        options=TTOptions,
        parallel_note=_TT_NOTE,
    )
)
register_method(
    Method(
        name="lax-tt",
        help="LaX on CoMERA's TT layers: crossing at the middle bond (arXiv 2505.21732)",
        convert=_convert_lax_tt,
        options=LaXTTOptions,
        families=("llama",),  # its intra-layer residuals name LLaMA's attention projections
        parallel_note=_TT_NOTE,
    )
)
