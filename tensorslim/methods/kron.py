"""Kronecker-factored training: every block projection becomes a sum of ``rank`` Kronecker products ``A ⊗ B``
(:mod:`tensorslim.layers.kron`); pretrained weights start from their nearest Kronecker product (Van Loan &
Pitsianis, 1993), models trained from scratch from random factors."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from tensorslim.convert import convert_
from tensorslim.layers.kron import KronConfig
from tensorslim.methods.lowrank import RankOptions
from tensorslim.methods.registry import Method, MethodContext, register_method
from tensorslim.options import option


@dataclass(frozen=True, kw_only=True)
class KronOptions(RankOptions):
    """The number of Kronecker terms per layer (checked as the low-rank methods' rank)."""

    rank: int | None = option(None, "Kronecker terms per layer (default: 1)")


def _convert(model: nn.Module, context: MethodContext) -> list:
    config = KronConfig(rank=context.options.rank or 1, init="nkp" if context.pretrained else "random")
    return [convert_(model, config)]


register_method(
    Method(
        name="kron",
        help="Kronecker-factored projections A ⊗ B (Van Loan & Pitsianis 1993)",
        convert=_convert,
        options=KronOptions,
    )
)
