"""TT-SVD (Oseledets 2011) into CoMERA's layouts: TT cores for linear layers and TTM cores for embeddings.

CoMERA (Yang et al., NeurIPS 2024, arXiv 2405.14377, tensorization settings of paper p.16; official ``layers.py``):

* linear layers use a plain TT of the weight ``W ∈ R^{d_in×d_out}`` reshaped (row-major) to
  ``[n_1..n_d (input modes), n_{d+1}..n_{2d} (output modes)]``, with 3-way cores ``G_k ∈ R^{r_{k-1}×n_k×r_k}``;
* embeddings use a TT-matrix (TTM) with 4-way cores ``F_k ∈ R^{r_{k-1}×m_k×n_k×r_k}`` over row modes ``m`` and
  column modes ``n``; rows beyond the real vocabulary are zero padding.

The official code initializes randomly and never decomposes a trained weight; ``from_dense`` initialization is our
addition (as tltorch's ``from_linear``). Everything here is a pure function: tensors in, cores out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def full_rank_bounds(dims: Sequence[int]) -> list[int]:
    """The largest useful rank of each internal bond: ``min(∏ dims[:k], ∏ dims[k:])`` for k = 1..len-1."""
    return [min(math.prod(dims[:k]), math.prod(dims[k:])) for k in range(1, len(dims))]


def tt_svd(tensor: torch.Tensor, max_ranks: Sequence[int]) -> list[torch.Tensor]:
    """Decompose ``tensor`` into TT cores by sequential truncated SVDs.

    Args:
        tensor: shape ``(n_1, …, n_d)``.
        max_ranks: the ``d-1`` internal bond ranks. A bond larger than the rank the unfolding allows is filled with
            zero slices so the cores always have the requested shapes.

    Returns:
        ``d`` cores, core k of shape ``(r_{k-1}, n_k, r_k)`` with ``r_0 = r_d = 1``; computed in float64 and
        returned in the input's dtype.
    """
    dims = tuple(tensor.shape)
    if len(max_ranks) != len(dims) - 1:
        raise ValueError(f"max_ranks has {len(max_ranks)} entries; a {len(dims)}-way tensor needs {len(dims) - 1}")
    ranks = [1, *max_ranks, 1]
    rest = tensor.detach().to(torch.float64).reshape(1, -1)  # (r_{k-1}, remaining modes)
    cores = []
    for k, n in enumerate(dims[:-1]):
        unfolding = rest.reshape(ranks[k] * n, -1)  # (r_{k-1}·n_k, ∏ later modes)
        u, s, vh = torch.linalg.svd(unfolding, full_matrices=False)
        keep = min(ranks[k + 1], s.numel())
        core = torch.zeros(ranks[k] * n, ranks[k + 1], dtype=torch.float64, device=tensor.device)
        core[:, :keep] = u[:, :keep]
        cores.append(core.reshape(ranks[k], n, ranks[k + 1]))
        carried = torch.zeros(ranks[k + 1], vh.shape[1], dtype=torch.float64, device=tensor.device)
        carried[:keep] = s[:keep, None] * vh[:keep]
        rest = carried
    cores.append(rest.reshape(ranks[-2], dims[-1], 1))
    return [core.to(tensor.dtype) for core in cores]


def tt_to_full(cores: Sequence[torch.Tensor]) -> torch.Tensor:
    """Contract 3-way TT cores ``(r_{k-1}, n_k, r_k)`` into the full tensor ``(n_1, …, n_d)`` (for tests/debug)."""
    full = cores[0]  # (1, n_1, r_1)
    for core in cores[1:]:
        full = torch.tensordot(full, core, dims=1)  # (1, n_1..n_k, r_k)
    return full.reshape([core.shape[1] for core in cores])


def tt_matrix_svd(
    weight: torch.Tensor, in_factors: Sequence[int], out_factors: Sequence[int], max_ranks: Sequence[int]
) -> list[torch.Tensor]:
    """CoMERA-layout TT cores of ``weight`` (shape ``(d_in, d_out)``, i.e. ``y = x @ weight``).

    Args:
        weight: ``(∏ in_factors, ∏ out_factors)``; note the orientation is the transpose of ``nn.Linear.weight``.
        in_factors: input modes ``n_1..n_d``.
        out_factors: output modes ``n_{d+1}..n_{2d}``.
        max_ranks: the ``len(in_factors)+len(out_factors)-1`` internal ranks.
    """
    if weight.shape != (math.prod(in_factors), math.prod(out_factors)):
        raise ValueError(
            f"weight of shape {tuple(weight.shape)} does not match in_factors={list(in_factors)} and "
            f"out_factors={list(out_factors)}"
        )
    return tt_svd(weight.reshape(*in_factors, *out_factors), max_ranks)


def ttm_svd(
    table: torch.Tensor, row_factors: Sequence[int], col_factors: Sequence[int], max_ranks: Sequence[int]
) -> list[torch.Tensor]:
    """TTM cores ``(r_{k-1}, m_k, n_k, r_k)`` of an embedding table, zero-padding rows up to ``∏ row_factors``.

    Args:
        table: ``(rows, ∏ col_factors)`` with ``rows ≤ ∏ row_factors``.
        row_factors: row modes ``m_1..m_d`` (row index = row-major mixed radix over them).
        col_factors: column modes ``n_1..n_d``, as many as ``row_factors``.
        max_ranks: the ``d-1`` internal ranks.
    """
    rows, cols = table.shape
    padded_rows = math.prod(row_factors)
    if len(row_factors) != len(col_factors) or rows > padded_rows or cols != math.prod(col_factors):
        raise ValueError(
            f"table of shape {tuple(table.shape)} does not fit row_factors={list(row_factors)} (product must be "
            f">= rows) and col_factors={list(col_factors)} (product must equal columns, same length)"
        )
    d = len(row_factors)
    padded = torch.zeros(padded_rows, cols, dtype=table.dtype, device=table.device)
    padded[:rows] = table.detach()
    # (m_1..m_d, n_1..n_d) → (m_1, n_1, m_2, n_2, …) → merged modes m_k·n_k, TT-SVD, then split each mode again.
    interleaved = padded.reshape(*row_factors, *col_factors).permute(*[i for k in range(d) for i in (k, d + k)])
    merged = interleaved.reshape([m * n for m, n in zip(row_factors, col_factors, strict=True)])
    cores = tt_svd(merged, max_ranks)
    return [
        core.reshape(core.shape[0], m, n, core.shape[-1])
        for core, m, n in zip(cores, row_factors, col_factors, strict=True)
    ]


def ttm_to_full(cores: Sequence[torch.Tensor]) -> torch.Tensor:
    """Contract 4-way TTM cores into the (padded) table ``(∏ m_k, ∏ n_k)`` (for tests/debug)."""
    full = cores[0]  # (1, M, N, r)
    for core in cores[1:]:
        r0, m_acc, n_acc, _ = full.shape
        _, m, n, r1 = core.shape
        merged = torch.tensordot(full, core, dims=1)  # (r0, M, N, m, n, r1)
        full = merged.permute(0, 1, 3, 2, 4, 5).reshape(r0, m_acc * m, n_acc * n, r1)
    return full.reshape(full.shape[1], full.shape[2])
