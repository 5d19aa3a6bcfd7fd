"""The nearest Kronecker product of a matrix (Van Loan & Pitsianis, 1993).

C. F. Van Loan and N. Pitsianis, "Approximation with Kronecker Products", in *Linear Algebra for Large Scale and
Real-Time Applications* (M. S. Moonen, G. H. Golub, B. L. R. De Moor, eds.), Kluwer, 1993, pp. 293-314.

For ``W ∈ R^{(m1·m2)×(n1·n2)}`` seen as an m1×n1 grid of m2×n2 blocks ``W_ij``, the rearrangement ``R(W)`` has one
row per block, ``vec(W_ij)``. Since ``R(A ⊗ B) = vec(A)·vec(B)ᵀ`` and ``R`` only permutes entries,
``‖W − Σ_k A_k ⊗ B_k‖_F = ‖R(W) − Σ_k vec(A_k)·vec(B_k)ᵀ‖_F``: the best sum of ``rank`` Kronecker products is the
truncated SVD of ``R(W)`` (Eckart–Young), and its error is the norm of the discarded singular values. ``vec`` is
row-major throughout, matching ``torch.kron`` and ``reshape``.
"""

from __future__ import annotations

import math

import torch


def _check_shapes(weight: torch.Tensor, *, out_factors: tuple[int, int], in_factors: tuple[int, int]) -> None:
    if weight.ndim != 2 or weight.shape != (math.prod(out_factors), math.prod(in_factors)):
        raise ValueError(
            f"weight of shape {tuple(weight.shape)} does not match out_factors={list(out_factors)} and "
            f"in_factors={list(in_factors)}; allowed: shape (m1·m2, n1·n2)"
        )


def kron_rearrange(weight: torch.Tensor, *, out_factors: tuple[int, int], in_factors: tuple[int, int]) -> torch.Tensor:
    """``R(W)`` of shape ``(m1·n1, m2·n2)``: row ``i·n1 + j`` is the block ``W[i·m2:(i+1)·m2, j·n2:(j+1)·n2]``
    flattened row-major.

    Args:
        weight: ``(m1·m2, n1·n2)``.
        out_factors: ``(m1, m2)``, the row counts of ``A`` and ``B``.
        in_factors: ``(n1, n2)``, the column counts of ``A`` and ``B``.
    """
    _check_shapes(weight, out_factors=out_factors, in_factors=in_factors)
    (m1, m2), (n1, n2) = out_factors, in_factors
    return weight.reshape(m1, m2, n1, n2).permute(0, 2, 1, 3).reshape(m1 * n1, m2 * n2)


def nearest_kronecker(
    weight: torch.Tensor, *, out_factors: tuple[int, int], in_factors: tuple[int, int], rank: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """The best ``W ≈ Σ_{k<rank} A_k ⊗ B_k`` in the Frobenius norm (Van Loan & Pitsianis, 1993).

    The singular values are split evenly between the factors (``A_k = √σ_k·U_k``, ``B_k = √σ_k·V_k``), as in
    :func:`tensorslim.decomp.svd.truncated_svd`, so both factors have the same scale.

    Args:
        weight: ``(m1·m2, n1·n2)``, e.g. an ``nn.Linear`` weight ``(d_out, d_in)``.
        out_factors: ``(m1, m2)``.
        in_factors: ``(n1, n2)``.
        rank: number of Kronecker terms, ``1 ≤ rank ≤ min(m1·n1, m2·n2)``.

    Returns:
        ``(A, B)`` of shapes ``(rank, m1, n1)`` and ``(rank, m2, n2)``, computed in float64 and returned in
        ``weight``'s dtype.
    """
    _check_shapes(weight, out_factors=out_factors, in_factors=in_factors)
    (m1, m2), (n1, n2) = out_factors, in_factors
    limit = min(m1 * n1, m2 * n2)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= limit:
        raise ValueError(f"rank={rank!r} is out of range; allowed 1..{limit} for factors {m1}x{n1} and {m2}x{n2}")
    rearranged = kron_rearrange(weight.detach().to(torch.float64), out_factors=out_factors, in_factors=in_factors)
    u, s, vh = torch.linalg.svd(rearranged, full_matrices=False)
    root = s[:rank].sqrt()
    factor_a = (u[:, :rank] * root).T.reshape(rank, m1, n1)
    factor_b = (root[:, None] * vh[:rank]).reshape(rank, m2, n2)
    return factor_a.to(weight.dtype), factor_b.to(weight.dtype)
