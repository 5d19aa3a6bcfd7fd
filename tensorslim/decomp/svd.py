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


def whitening_factor(gram: torch.Tensor, *, damping: float = 1e-4) -> torch.Tensor:
    """Lower-triangular ``S`` with ``S Sᵀ = G + λI``, in float64 (SVD-LLM, arXiv 2403.07378, §3.1).

    ``G = Σ x xᵀ`` is the Gram matrix of a layer's calibration inputs. SVD-LLM takes its Cholesky factor as is; the
    damping ``λ = damping · mean(diag G)`` is ours: it keeps ``S`` invertible when an input direction never varies on
    the calibration set (rank-deficient ``G``, a constant feature), as GPTQ damps its Hessian.

    Args:
        gram: ``(d_in, d_in)`` symmetric positive semi-definite matrix.
        damping: relative ridge, ``≥ 0``; the ridge grows tenfold (up to 6 times) if the factorization still fails.
    """
    if gram.ndim != 2 or gram.shape[0] != gram.shape[1]:
        raise ValueError(f"gram must be a square matrix, got shape {tuple(gram.shape)}")
    if not damping >= 0:
        raise ValueError(f"damping={damping!r} is invalid; allowed: a number >= 0")
    gram = gram.detach().to(torch.float64)
    gram = (gram + gram.T) / 2
    scale = gram.diagonal().mean().clamp_min(torch.finfo(torch.float64).tiny)
    eye = torch.eye(len(gram), dtype=torch.float64, device=gram.device)
    ridge = damping
    for _ in range(7):
        factor, info = torch.linalg.cholesky_ex(gram + ridge * scale * eye)
        if info.item() == 0:
            return factor
        ridge = max(ridge * 10, 1e-10)
    raise ValueError("the calibration Gram matrix is not positive definite even with damping; check its inputs")


def whitened_svd(weight: torch.Tensor, whitener: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The SVD ``W S = U Σ Vᵀ`` of the weight times the whitening factor (SVD-LLM, arXiv 2403.07378, §3.1), in
    float64: ``(U, σ, Vᵀ)``. With ``S Sᵀ = X Xᵀ`` (inputs as columns), ``‖(W − W') X‖_F = ‖(W − W') S‖_F``, so the
    rank-r truncation ``W' = U_r Σ_r V_rᵀ S⁻¹`` loses exactly ``Σ_{i>r} σ_i²`` of squared output error on the
    calibration inputs (SVD-LLM Theorem 3.2), the least any rank-r matrix can."""
    if weight.ndim != 2 or whitener.shape != (weight.shape[1], weight.shape[1]):
        raise ValueError(
            f"whitener of shape {tuple(whitener.shape)} does not fit a weight of shape {tuple(weight.shape)}; "
            f"allowed: ({weight.shape[1]}, {weight.shape[1]})"
        )
    return torch.linalg.svd(weight.detach().to(torch.float64) @ whitener, full_matrices=False)


def whitened_truncation(weight: torch.Tensor, whitener: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Best rank-``r`` factorization ``W ≈ B A`` for the output error on the calibration inputs that ``whitener``
    (:func:`whitening_factor`) describes: ``A = √Σ_r V_rᵀ S⁻¹``, ``B = U_r √Σ_r`` (SVD-LLM, arXiv 2403.07378, §3.1,
    with the singular values split evenly between the factors as :func:`truncated_svd` does).

    Returns:
        ``(A, B)`` with shapes ``(rank, d_in)`` and ``(d_out, rank)``, in ``weight``'s dtype.
    """
    if not 1 <= rank <= min(weight.shape):
        raise ValueError(f"rank={rank} is out of range; allowed 1..{min(weight.shape)} for shape {tuple(weight.shape)}")
    u, s, vh = whitened_svd(weight, whitener)
    root = s[:rank].sqrt()
    # V_rᵀ S⁻¹ as the solution Z of Z S = V_rᵀ, i.e. Sᵀ Zᵀ = V_r with Sᵀ upper triangular.
    v_unwhite = torch.linalg.solve_triangular(whitener.T.to(torch.float64), vh[:rank].T, upper=True).T  # (r, d_in)
    weight_a = root[:, None] * v_unwhite
    weight_b = u[:, :rank] * root[None, :]
    return weight_a.to(weight.dtype), weight_b.to(weight.dtype)


def aligned_target(
    weight: torch.Tensor, gram: torch.Tensor, cross: torch.Tensor, whitener: torch.Tensor, *, alignment: float = 1.0
) -> torch.Tensor:
    """The dense matrix whose whitened truncation is the best rank-r layer for a compressed model's inputs.

    A layer inside a partly compressed model sees inputs ``x`` (Gram ``G = Σ x xᵀ``) that differ from the original
    model's ``x_f``. SAES-SVD's cumulative-error-aware objective (arXiv 2602.03051, CEALC) asks the compressed layer
    ``M`` to reproduce the original outputs ``W x_f`` from ``x``. Its least-squares solution, ridge-regularised toward
    ``W`` with the damping ``λ`` of ``whitener`` (``S Sᵀ = G + λI``), is

        ``M₀ = W + β · W (C − G)(G + λI)⁻¹``,   ``C = Σ x_f xᵀ``,

    where ``β = alignment`` weighs the original outputs (``β = 1``) against the layer's own outputs on its new
    inputs (``β = 0``: ``M₀ = W``, plain sequential calibration). For any ``M``,
    ``Σ ‖W̃ x − M x‖²`` with ``W̃ x = (1 − β) W x + β W x_f`` equals ``‖(M₀ − M) S‖_F²`` up to a constant (and the
    ridge), so truncating the whitened SVD of ``M₀`` (:func:`whitened_truncation`) gives the best rank-r ``M`` and
    quantizing ``M₀`` against ``G`` (GPTQ/COMQ) the best grid point.

    Args:
        weight: ``(d_out, d_in)`` original weight ``W``.
        gram: ``(d_in, d_in)`` ``G = Σ x xᵀ`` of the compressed model's inputs.
        cross: ``(d_in, d_in)`` ``C = Σ x_f xᵀ``, original inputs against compressed ones, row by row.
        whitener: :func:`whitening_factor` of ``gram``.
        alignment: ``β`` in ``[0, 1]``.

    Returns:
        ``M₀`` ``(d_out, d_in)`` in float64.
    """
    if not 0.0 <= alignment <= 1.0:
        raise ValueError(f"alignment={alignment!r} is invalid; allowed: a number in [0, 1]")
    w = weight.detach().to(torch.float64)
    if alignment == 0.0:
        return w
    drift = w @ (cross.to(torch.float64) - gram.to(torch.float64))  # (d_out, d_in) W (C − G)
    # D (S Sᵀ)⁻¹ as the solution Y of (S Sᵀ) Yᵀ = Dᵀ
    return w + alignment * torch.cholesky_solve(drift.T, whitener.to(torch.float64)).T
