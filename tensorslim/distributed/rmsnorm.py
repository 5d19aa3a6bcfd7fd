"""RMSNorm on a residual stream sharded along d (BOOST §3.2, "online RMSNorm").

With x split as ``x = [x_0 … x_{p-1}]`` over the hidden dimension, ``RMSNorm(x) A`` needs the global
``Σ x²``. Two exact ways to get it:

- **online** (BOOST): normalize locally, run the row-parallel projection, undo the local scale, then sum the partial
  projection and the partial ``Σ x_i²`` in *one* all-reduce (the two are concatenated, so the statistic rides along
  with the latent; BOOST's released code keeps them as two all-reduces). Because the per-token scale commutes with
  the linear map, ``H / rms_global`` equals ``RMSNorm(x) A`` exactly (BOOST's online RMSNorm).
- **sync** (reference): all-reduce ``Σ x_i²`` first, normalize, then project. One extra (tiny) collective.

Both return the same values as single-process RMSNorm followed by the projection, to fp32 rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tensorslim.distributed.comm import TPGroup, reduce_latent


def online_partial(x: torch.Tensor, gamma: torch.Tensor, weight_a: torch.Tensor, *, eps: float) -> torch.Tensor:
    """The local half of online RMSNorm + row-parallel A; communication-free.

    Args:
        x: the local shard of the residual stream, ``(..., d/p)``.
        gamma: the local shard of the RMSNorm gain, ``(d/p,)``.
        weight_a: the row-parallel shard of A (possibly grouped, e.g. q/k/v → 3r), ``(k, d/p)``.
        eps: the norm's epsilon (applied with the *local* width here; it cancels in :func:`online_finish`).

    Returns:
        ``(..., k + 1)``: the partial projection ``(x_i γ_i) A_iᵀ`` and, last, the partial ``Σ x_i²``.
    """
    x32 = x.float()
    sumsq = x32.pow(2).sum(-1, keepdim=True)  # (..., 1)
    rms_local = torch.sqrt(sumsq / x.shape[-1] + eps)  # (..., 1)
    # Normalizing locally first keeps the GEMM input at unit scale (what BOOST does for bf16); the scale is
    # undone right after, so the partial sums of different ranks share one scale and can be added.
    partial = F.linear(((x32 / rms_local) * gamma).to(x.dtype), weight_a) * rms_local  # (..., k)
    return torch.cat([partial, sumsq.to(partial.dtype)], dim=-1)  # (..., k + 1)


def online_finish(summed: torch.Tensor, *, d_model: int, eps: float) -> torch.Tensor:
    """Divide the all-reduced projection by the global RMS: ``(..., k + 1)`` → ``RMSNorm(x) A``, ``(..., k)``."""
    return summed[..., :-1] * rms_scale(summed[..., -1:], d_model=d_model, eps=eps)


def rms_scale(sumsq: torch.Tensor, *, d_model: int, eps: float) -> torch.Tensor:
    """``1 / RMS`` from the all-reduced ``Σ x²`` over the full width ``d_model``."""
    return torch.rsqrt(sumsq / d_model + eps)


def online_rmsnorm_linear(
    x: torch.Tensor, gamma: torch.Tensor, weight_a: torch.Tensor, tp: TPGroup, *, d_model: int, eps: float, tag: str
) -> torch.Tensor:
    """``RMSNorm(x) Aᵀ`` for a d-sharded ``x`` with one all-reduce of ``k + 1`` elements per token (BOOST §3.2)."""
    summed = reduce_latent(online_partial(x, gamma, weight_a, eps=eps), tp, tag=tag)
    return online_finish(summed, d_model=d_model, eps=eps)


def sync_rmsnorm(
    x: torch.Tensor, gamma: torch.Tensor, tp: TPGroup, *, d_model: int, eps: float, tag: str
) -> torch.Tensor:
    """Reference: all-reduce ``Σ x_i²`` (one element per token), then normalize the local shard exactly.

    The statistic's consumers are sharded, so its backward is an all-reduce as well.
    """
    x32 = x.float()
    sumsq = reduce_latent(x32.pow(2).sum(-1, keepdim=True), tp, tag=tag)  # (..., 1)
    return gamma * (x32 * torch.rsqrt(sumsq / d_model + eps)).to(x.dtype)


def sync_rmsnorm_linear(
    x: torch.Tensor, gamma: torch.Tensor, weight_a: torch.Tensor, tp: TPGroup, *, d_model: int, eps: float, tag: str
) -> torch.Tensor:
    """``RMSNorm(x) Aᵀ`` via :func:`sync_rmsnorm` and a row-parallel projection: two all-reduces."""
    normed = sync_rmsnorm(x, gamma, tp, d_model=d_model, eps=eps, tag=f"{tag}.stat")
    return reduce_latent(F.linear(normed, weight_a), tp, tag=tag)
