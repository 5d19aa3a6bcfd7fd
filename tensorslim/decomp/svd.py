"""Truncated SVD of a dense matrix into two balanced factors."""

from __future__ import annotations

import torch


def truncated_svd(weight: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Best rank-``r`` factorization ``W ≈ B A`` in the Frobenius norm (Eckart–Young).

    The singular values are split evenly, ``A = √S Vᵀ`` and ``B = U √S``, so both factors have the same scale;
    this keeps the gradients of the two factors balanced when the result is trained further.

    Args:
        weight: matrix of shape ``(d_out, d_in)``.
        rank: number of singular triplets kept, ``1 ≤ rank ≤ min(d_out, d_in)``.

    Returns:
        ``(A, B)`` with shapes ``(rank, d_in)`` and ``(d_out, rank)``, in ``weight``'s dtype.
    """
    if weight.ndim != 2:
        raise ValueError(f"truncated_svd expects a 2-D matrix, got shape {tuple(weight.shape)}")
    if not 1 <= rank <= min(weight.shape):
        raise ValueError(f"rank={rank} is out of range; allowed 1..{min(weight.shape)} for shape {tuple(weight.shape)}")
    # float64 keeps the factorization accurate for float32 weights; the cost is negligible next to training.
    u, s, vh = torch.linalg.svd(weight.detach().to(torch.float64), full_matrices=False)
    root = s[:rank].sqrt()
    weight_a = root[:, None] * vh[:rank]  # (r, d_in)
    weight_b = u[:, :rank] * root[None, :]  # (d_out, r)
    return weight_a.to(weight.dtype), weight_b.to(weight.dtype)


def squared_singular_values(weight: torch.Tensor) -> torch.Tensor:
    """``σ_1² ≥ σ_2² ≥ …`` of a matrix, in float64.

    By Eckart–Young, ``σ_{r+1}²`` is the squared Frobenius error that the best rank-(r+1) approximation removes over
    the best rank-r one, which is what ranks by budget spend parameters on.
    """
    if weight.ndim != 2:
        raise ValueError(f"squared_singular_values expects a 2-D matrix, got shape {tuple(weight.shape)}")
    return torch.linalg.svdvals(weight.detach().to(torch.float64)) ** 2
