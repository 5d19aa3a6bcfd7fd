"""Stateless Kronecker-factored linear map ``y = (Σ_k A_k ⊗ B_k) x + b`` that never forms ``A_k ⊗ B_k``.

With ``x`` reshaped row-major to ``X ∈ R^{n1×n2}``, ``(A ⊗ B)·vec(X) = vec(A·X·Bᵀ)`` (Van Loan & Pitsianis, 1993,
"Approximation with Kronecker Products"; the identity behind their rearrangement). Each term costs two skinny GEMMs
instead of one ``(m1·m2)×(n1·n2)`` GEMM. The two contraction orders, B first (``X·Bᵀ`` then ``A·(·)``) or A first,
differ in FLOPs when the factors are unbalanced; :func:`kron_order` picks the cheaper one.
"""

from __future__ import annotations

from typing import Literal

import torch

Order = Literal["a_first", "b_first"]


def _order_flops(
    *, in_factors: tuple[int, int], out_factors: tuple[int, int], rank: int, tokens: int
) -> dict[str, int]:
    (m1, m2), (n1, n2) = out_factors, in_factors
    return {
        "a_first": 2 * tokens * rank * m1 * n2 * (n1 + m2),  # X·Aᵀ over n1, then ·Bᵀ over (k, n2)
        "b_first": 2 * tokens * rank * m2 * n1 * (n2 + m1),  # X·Bᵀ over n2, then ·Aᵀ over (k, n1)
    }


def kron_order(*, in_factors: tuple[int, int], out_factors: tuple[int, int], rank: int) -> Order:
    """The contraction order with fewer FLOPs (``"a_first"`` on a tie)."""
    costs = _order_flops(in_factors=in_factors, out_factors=out_factors, rank=rank, tokens=1)
    return "a_first" if costs["a_first"] <= costs["b_first"] else "b_first"


def kron_linear_flops(
    *, in_factors: tuple[int, int], out_factors: tuple[int, int], rank: int, tokens: int, order: Order | None = None
) -> int:
    """Matmul FLOPs of :func:`kron_linear` on ``tokens`` rows, as ``torch.utils.flop_counter`` counts them."""
    factors = {"in_factors": in_factors, "out_factors": out_factors, "rank": rank}
    return _order_flops(**factors, tokens=tokens)[order or kron_order(**factors)]


def kron_linear(
    x: torch.Tensor,
    factor_a: torch.Tensor,
    factor_b: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    order: Order | None = None,
) -> torch.Tensor:
    """``y = (Σ_k A_k ⊗ B_k) x + b`` (``nn.Linear`` convention: the weight is ``Σ_k A_k ⊗ B_k``, ``(d_out, d_in)``).

    Args:
        x: ``(..., n1·n2)``.
        factor_a: ``A``, shape ``(rank, m1, n1)``.
        factor_b: ``B``, shape ``(rank, m2, n2)``.
        bias: optional ``(m1·m2,)``.
        order: ``"a_first"`` or ``"b_first"``; default: :func:`kron_order`.

    Returns:
        ``(..., m1·m2)``.
    """
    rank, m1, n1 = factor_a.shape
    _, m2, n2 = factor_b.shape
    order = order or kron_order(in_factors=(n1, n2), out_factors=(m1, m2), rank=rank)
    lead = x.shape[:-1]
    grid = x.reshape(-1, n1, n2)  # (N, n1, n2)
    tokens = grid.shape[0]
    if order == "a_first":
        mixed = grid.transpose(1, 2).reshape(tokens * n2, n1) @ factor_a.reshape(rank * m1, n1).T  # (N·n2, k·m1)
        mixed = mixed.reshape(tokens, n2, rank, m1).permute(0, 3, 2, 1).reshape(tokens * m1, rank * n2)
        out = mixed @ factor_b.transpose(1, 2).reshape(rank * n2, m2)  # (N·m1, m2)
        out = out.reshape(tokens, m1 * m2)
    elif order == "b_first":
        mixed = grid.reshape(tokens * n1, n2) @ factor_b.reshape(rank * m2, n2).T  # (N·n1, k·m2)
        mixed = mixed.reshape(tokens, n1, rank, m2).permute(0, 3, 2, 1).reshape(tokens * m2, rank * n1)
        out = mixed @ factor_a.transpose(1, 2).reshape(rank * n1, m1)  # (N·m2, m1)
        out = out.reshape(tokens, m2, m1).transpose(1, 2).reshape(tokens, m1 * m2)
    else:
        raise ValueError(f"order={order!r} is unknown; allowed: 'a_first' or 'b_first'")
    if bias is not None:
        out = out + bias
    return out.reshape(*lead, m1 * m2)
