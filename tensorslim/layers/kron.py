"""Kronecker-factored linear layer ``y = (Σ_k A_k ⊗ B_k) x + b``.

The weight ``W ∈ R^{d_out×d_in}`` with ``d_out = m1·m2`` and ``d_in = n1·n2`` is a sum of ``rank`` Kronecker
products of ``A_k ∈ R^{m1×n1}`` and ``B_k ∈ R^{m2×n2}``: ``rank·(m1·n1 + m2·n2)`` parameters instead of
``d_out·d_in``. ``from_dense`` takes the nearest such sum in the Frobenius norm, by the rearrangement and SVD of
Van Loan & Pitsianis ("Approximation with Kronecker Products", 1993; :mod:`tensorslim.decomp.kron`). The forward
never forms ``A_k ⊗ B_k``: it computes ``A_k·X·B_kᵀ`` on the ``n1×n2`` reshape of ``x``
(:mod:`tensorslim.functional.kron`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from tensorslim._checks import check_fields
from tensorslim.decomp.kron import nearest_kronecker
from tensorslim.decomp.shapes import check_factors, factorize
from tensorslim.functional.kron import kron_linear, kron_linear_flops, kron_order
from tensorslim.layers._source import (
    dense_linear,
    factored_like,
    is_dense_linear,
    replacement_report,
    require_weights,
    resolve_for,
    uniform_bias_,
)
from tensorslim.registry import LayerReport, Transform, register_transform

Init = Literal["nkp", "random"]


def _check_pair(name: str, factors: object) -> None:
    if not (
        isinstance(factors, tuple | list)
        and len(factors) == 2
        and all(isinstance(f, int) and not isinstance(f, bool) and f >= 1 for f in factors)
    ):
        raise ValueError(f"{name}={factors!r} is invalid; allowed: None or a pair of integers >= 1")


def _split(name: str, n: int) -> tuple[int, int]:
    """The balanced pair ``(a, b)``, ``a ≤ b``, ``a·b = n`` (768 → (24, 32)), by :func:`factorize`."""
    try:
        return factorize(n, 2)  # type: ignore[return-value]
    except ValueError:
        raise ValueError(
            f"{name}={n} has no split into two factors > 1; allowed: explicit factors such as (1, {n})"
        ) from None


@dataclass(frozen=True, kw_only=True)
class KronConfig:
    """How ``convert_`` turns a dense linear layer into a :class:`KronLinear`.

    Attributes:
        rank: number of Kronecker terms (1: a single ``A ⊗ B``).
        in_factors: ``(n1, n2)`` with ``n1·n2 = d_in`` (columns of ``A`` and ``B``); default: the most balanced
            pair, ascending (768 → (24, 32)).
        out_factors: ``(m1, m2)`` with ``m1·m2 = d_out`` (rows of ``A`` and ``B``); default: as ``in_factors``.
        init: ``"nkp"`` takes the nearest Kronecker product of the dense weight (Van Loan & Pitsianis, 1993);
            ``"random"`` draws fresh factors (for training from scratch, and for ``meta``-device models).
    """

    rank: int = 1
    in_factors: tuple[int, int] | None = None
    out_factors: tuple[int, int] | None = None
    init: Init = "nkp"

    def __post_init__(self) -> None:
        check_fields(self)
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"rank={self.rank!r} is invalid; allowed: an integer >= 1")
        for name in ("in_factors", "out_factors"):
            if getattr(self, name) is not None:
                _check_pair(name, getattr(self, name))
        if self.init not in ("nkp", "random"):
            raise ValueError(f"init={self.init!r} is invalid; allowed: 'nkp' or 'random'")

    def resolve(self, d_in: int, d_out: int) -> tuple[tuple[int, int], tuple[int, int], int]:
        """``(in_factors, out_factors, rank)`` for a ``d_in → d_out`` layer; raises a one-line ``ValueError``."""
        in_factors = tuple(self.in_factors) if self.in_factors else _split("d_in", d_in)
        out_factors = tuple(self.out_factors) if self.out_factors else _split("d_out", d_out)
        check_factors("in_factors", in_factors, at_least=d_in)
        check_factors("out_factors", out_factors, at_least=d_out)
        limit = min(in_factors[0] * out_factors[0], in_factors[1] * out_factors[1])
        if self.rank > limit:
            raise ValueError(
                f"rank={self.rank} is out of range for factors {out_factors[0]}x{in_factors[0]} and "
                f"{out_factors[1]}x{in_factors[1]}; allowed 1..{limit}"
            )
        return in_factors, out_factors, self.rank


class KronLinear(nn.Module):
    """``y = (Σ_k A_k ⊗ B_k) x + b`` with ``A ∈ R^{rank×m1×n1}``, ``B ∈ R^{rank×m2×n2}``; ``A ⊗ B`` is never formed.

    Args:
        in_factors: ``(n1, n2)``, ``in_features = n1·n2``.
        out_factors: ``(m1, m2)``, ``out_features = m1·m2``.
        rank: number of Kronecker terms, ``1 ≤ rank ≤ min(m1·n1, m2·n2)``.
        bias: learn an additive bias.
    """

    def __init__(
        self,
        in_factors: tuple[int, int],
        out_factors: tuple[int, int],
        rank: int = 1,
        *,
        bias: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        _check_pair("in_factors", in_factors)
        _check_pair("out_factors", out_factors)
        (n1, n2), (m1, m2) = in_factors, out_factors
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= min(m1 * n1, m2 * n2):
            raise ValueError(f"rank={rank!r} is out of range; allowed 1..{min(m1 * n1, m2 * n2)}")
        self.in_factors, self.out_factors, self.rank = (n1, n2), (m1, m2), rank
        self.in_features, self.out_features = n1 * n2, m1 * m2
        self.order = kron_order(in_factors=self.in_factors, out_factors=self.out_factors, rank=rank)
        factory = {"device": device, "dtype": dtype}
        self.factor_a = nn.Parameter(torch.empty(rank, m1, n1, **factory))
        self.factor_b = nn.Parameter(torch.empty(rank, m2, n2, **factory))
        self.bias = nn.Parameter(torch.empty(self.out_features, **factory)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Both factors ~ N(0, σ²) with σ = (rank·d_in)^{-1/4}, so the entries of ``W`` have variance ``1/d_in``
        (LeCun-normal; the paper has no training init); bias ~ U(±1/√d_in) as ``nn.Linear``."""
        std = (self.rank * self.in_features) ** -0.25
        with torch.no_grad():
            self.factor_a.normal_(0.0, std)
            self.factor_b.normal_(0.0, std)
        uniform_bias_(self.bias, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kron_linear(x, self.factor_a, self.factor_b, self.bias, order=self.order)  # (..., d_out)

    @classmethod
    def from_dense(cls, module: nn.Module, config: KronConfig | None = None) -> KronLinear:
        """Build from an ``nn.Linear`` or GPT-2 ``Conv1D``: the nearest sum of ``rank`` Kronecker products
        (``init="nkp"``, exact when the weight is such a sum) or fresh random factors; the bias is copied."""
        config = config or KronConfig()
        layer, (in_factors, out_factors, rank), weight = factored_like(cls, module, config)  # weight: (d_out, d_in)
        if config.init == "nkp":
            require_weights(weight, config.init)
            factor_a, factor_b = nearest_kronecker(weight, out_factors=out_factors, in_factors=in_factors, rank=rank)
            with torch.no_grad():
                layer.factor_a.copy_(factor_a)
                layer.factor_b.copy_(factor_b)
                if module.bias is not None:
                    layer.bias.copy_(module.bias)
        return layer

    def weight_matrix(self) -> torch.Tensor:
        """``W = Σ_k A_k ⊗ B_k`` of shape ``(d_out, d_in)`` (export and tests only; the forward never forms it)."""
        return sum(torch.kron(a, b) for a, b in zip(self.factor_a, self.factor_b, strict=True))

    def to_dense(self) -> nn.Linear:
        """The equivalent ``nn.Linear``."""
        with torch.no_grad():
            return dense_linear(self.weight_matrix(), self.bias)

    @staticmethod
    def count_params(in_factors: tuple[int, int], out_factors: tuple[int, int], rank: int, *, bias: bool) -> int:
        """``rank·(m1·n1 + m2·n2)`` (+ ``m1·m2`` for the bias)."""
        (n1, n2), (m1, m2) = in_factors, out_factors
        return rank * (m1 * n1 + m2 * n2) + (m1 * m2 if bias else 0)

    def num_params(self) -> int:
        return self.count_params(self.in_factors, self.out_factors, self.rank, bias=self.bias is not None)

    def flops(self, tokens: int) -> int:
        """Forward matmul FLOPs for ``tokens`` rows as ``torch.utils.flop_counter`` counts them: two GEMMs in the
        cheaper order, ``2·tokens·rank·m1·n2·(n1 + m2)`` (A first) or ``2·tokens·rank·m2·n1·(n2 + m1)`` (B first)."""
        return kron_linear_flops(
            in_factors=self.in_factors, out_factors=self.out_factors, rank=self.rank, tokens=tokens, order=self.order
        )

    def extra_repr(self) -> str:
        (n1, n2), (m1, m2) = self.in_factors, self.out_factors
        return f"A={m1}x{n1}, B={m2}x{n2}, rank={self.rank}, bias={self.bias is not None}, order={self.order!r}"


def plan_kron(name: str, module: nn.Module, config: KronConfig) -> LayerReport:
    """The ``convert_`` report row for replacing a dense linear layer by a :class:`KronLinear` (nothing built)."""
    in_factors, out_factors, rank = resolve_for(name, module, config.resolve)
    (n1, n2), (m1, m2) = in_factors, out_factors
    return replacement_report(
        name,
        module,
        new_shape=f"Kron {m1}x{n1} ⊗ {m2}x{n2} r={rank}",
        rank=rank,
        params_after=KronLinear.count_params(in_factors, out_factors, rank, bias=module.bias is not None),
    )


def describe_kron(model: nn.Module, name: str, layer: KronLinear) -> tuple[KronConfig, dict[str, Any]]:
    """The config that rebuilds ``layer`` with its factor shapes and rank."""
    config = KronConfig(rank=layer.rank, in_factors=layer.in_factors, out_factors=layer.out_factors, init="random")
    return config, {}


register_transform(
    KronConfig,
    Transform(is_dense_linear, plan_kron, KronLinear.from_dense, layer_type=KronLinear, describe=describe_kron),
)
