"""COMQ: coordinate-wise minimization post-training quantization (Zhang et al. 2024, arXiv 2403.07134).

The layer objective is ``‖XWᵀ − XQᵀ‖²_F = Σ_rows (w − q)ᵀ H (w − q)`` with ``H = XᵀX`` (COMQ §3, eq. (2)), which
splits into one problem per output row. Each step minimizes it along one coordinate ``i`` of every row at once:
the exact 1-D minimizer is ``w_i + H[i,:]·r₋ᵢ / H_ii`` (``r = w − q`` with coordinate ``i`` taken out), and on a 1-D
quadratic the nearest grid point of that minimizer is the best grid point, so no step can increase the objective
once all coordinates lie on the grid (COMQ §3.1, "only dot products and rounding").

Faithful to the release (``AozhongZhang/COMQ`` ``quant.py``, compress.md §1.1–1.2): ``Q`` starts at the float ``W``
(the first sweep is sequential error feedback onto the current coordinate); the greedy order sorts each row's
coordinates by ``‖X_{:,i}‖₂ · |W_ji|`` descending (COMQ §3.2), computed once from the float weights; per-channel
min/max grids.

Where we deviate or go beyond:
    * Defaults (our choice, measured in ``experiments/results/quant_comq_defaults.json``): the descent starts from
      GPTQ's solution (arXiv 2210.17323, Alg. 1) and makes one cyclic sweep plus the scale update. Coordinate steps
      never raise the objective, so on the calibration data the result is never worse than GPTQ; from ``Q = W``
      (the release, ``init="float"``) one greedy sweep ends about 10 % above GPTQ's layer error on MiniLM.
    * Gram form: ``Xᵢᵀu = H[i,:](w − q)``, so each step costs O(d_in) per row and ``X`` is never stored
      (compress.md §1.2, checked identical to the residual form in ``tests/unit/test_comq.py``).
    * Scale update: the paper treats the scales as coordinates too (COMQ §3, "all the scaling factors and
      bit-codes"), but the release never updates them. After each sweep we set each row's scale to its
      least-squares optimum with the codes fixed, ``δ* = cᵀHw / cᵀHc`` with ``c = code − zero`` (compress.md §1.3),
      summed over rows for a layer-wide scale.
    * ``granularity="layer"`` (one scale for the matrix; the abstract's "scaling factor", absent in the release).
    * The grid includes 0 (GPTQ's convention), see :mod:`tensorslim.quant.quantizer`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from tensorslim.quant.gptq import GPTQConfig, gptq_quantize, prepare_gram
from tensorslim.quant.quantizer import Grid, QuantConfig, QuantResult, minmax_grid
from tensorslim.quant.rtn import RTNConfig, rtn_quantize

ORDERS = ("greedy", "cyclic")
INITS = ("gptq", "rtn", "float")


@dataclass(frozen=True, kw_only=True)
class COMQConfig(QuantConfig):
    """COMQ settings.

    The defaults are ours, chosen on held-out MiniLM text (``docs/quantization.md``): coordinate descent starts from
    GPTQ's solution and makes one cyclic sweep with the scale update. ``init="float", order="greedy",
    update_scale=False`` is the released algorithm.

    Attributes:
        init: where the coordinate descent starts: ``"gptq"`` (GPTQ's codes and grid, arXiv 2210.17323 Alg. 1),
            ``"rtn"`` (nearest codes) or ``"float"`` (``Q = W``, the release: its first sweep is error feedback onto
            the current coordinate). Coordinate steps never raise the objective, so the result is never worse than
            the start on the calibration data.
        order: ``"greedy"`` (per-row order by ``‖X_i‖·|W_ji|``, COMQ §3.2) or ``"cyclic"`` (natural column order).
        sweeps: passes over all coordinates (the release's ``--iters``, default 1).
        update_scale: after each sweep, set the scales to their least-squares optimum (COMQ §3; not in the
            release).
    """

    init: str = "gptq"
    order: str = "cyclic"
    sweeps: int = 1
    update_scale: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.init not in INITS:
            raise ValueError(f"init={self.init!r} is not supported; use one of {INITS}")
        if self.order not in ORDERS:
            raise ValueError(f"order={self.order!r} is not supported; use one of {ORDERS}")
        if isinstance(self.sweeps, bool) or not isinstance(self.sweeps, int) or self.sweeps < 1:
            raise ValueError(f"sweeps={self.sweeps!r} must be an integer >= 1")


def coordinate_order(weight: torch.Tensor, gram: torch.Tensor, order: str) -> torch.Tensor:
    """``(d_out, d_in)`` column indices visited by each row, step by step."""
    d_out, d_in = weight.shape
    if order == "cyclic":
        return torch.arange(d_in).expand(d_out, d_in)
    importance = torch.sqrt(torch.diagonal(gram))[None, :] * weight.abs()  # (d_out, d_in)
    return torch.argsort(importance, dim=1, descending=True, stable=True)


def layer_objective(weight: torch.Tensor, quantized: torch.Tensor, gram: torch.Tensor) -> float:
    """``Σ_rows (w − q)ᵀ H (w − q) = ‖X(W − Q)ᵀ‖²_F``."""
    r = (weight - quantized).to(torch.float64)
    return float(((r @ gram.to(torch.float64)) * r).sum())


def optimal_scale(
    weight: torch.Tensor, codes: torch.Tensor, grid: Grid, gram: torch.Tensor, *, granularity: str
) -> torch.Tensor:
    """The least-squares scales for fixed codes: ``argmin_δ Σ (w − δc)ᵀH(w − δc)``, ``c = code − zero``.

    Rows (or a layer) whose optimum is not positive keep their scale: a non-positive step would flip or collapse
    the grid.

    Returns:
        ``(d_out, 1)`` scales.
    """
    c = codes.to(torch.float64) - grid.zero  # (d_out, d_in) centred integer codes
    ch = c @ gram  # (d_out, d_in)
    num, den = (ch * weight).sum(dim=1, keepdim=True), (ch * c).sum(dim=1, keepdim=True)  # (d_out, 1)
    if granularity == "layer":
        num, den = num.sum().expand_as(num), den.sum().expand_as(den)
    safe = (den > 0) & (num > 0)
    return torch.where(safe, num / torch.where(safe, den, 1.0), grid.scale)


def _sparse_rows(cols: torch.Tensor, values: torch.Tensor, d_in: int) -> torch.Tensor:
    """A CSR ``(d_out, d_in)`` matrix with ``values[j, s]`` at ``(j, cols[j, s])`` (distinct columns per row)."""
    d_out, b = cols.shape
    sorted_cols, order = cols.sort(dim=1)
    crow = torch.arange(0, d_out * b + 1, b)
    with warnings.catch_warnings():  # "CSR support is in beta": the one op we use is tested against dense
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(
            crow,
            sorted_cols.reshape(-1),
            values.gather(1, order).reshape(-1),
            size=(d_out, d_in),
            check_invariants=False,
        )


def comq_sweep(
    w: torch.Tensor,
    h: torch.Tensor,
    residual: torch.Tensor,
    codes: torch.Tensor,
    grid: Grid,
    perm: torch.Tensor,
    *,
    block: int = 32,
) -> None:
    """One pass over all coordinates, updating ``residual = W − Q`` (d_out, d_in) and ``codes`` in place.

    The feedback ``H[i,:]·r₋ᵢ`` of every step is split, GPTQ-style, into a lazy part ``G = R H`` brought up to
    date once per block of ``block`` steps (a sparse-times-dense product: each row changed ``block`` coordinates),
    and the corrections from coordinates already changed inside the block, read from a small per-row gather
    ``H[p_j(t), p_j(s)]`` (d_out, block, block). Gathering a full row of ``H`` per step instead costs
    O(d_out·d_in) scattered reads per step and was about 5x slower on CPU. With the cyclic order all rows share
    the coordinate, so the lazy part is one dense GEMM per block and the in-block part one ``(b, b)`` block of
    ``H``, as in GPTQ. This is our implementation choice; it computes exactly the release's coordinate steps
    (tested against its loop for both orders).
    """
    d_out, d_in = w.shape
    h_diag = torch.diagonal(h)
    scale, zero = grid.scale[:, 0], grid.zero[:, 0]  # (d_out,)
    row_start = torch.arange(d_out) * d_in  # (d_out,)
    flat_r, flat_w, flat_c = residual.view(-1), w.reshape(-1), codes.view(-1)
    shared = bool((perm == perm[:1]).all())  # cyclic order: every row visits the same coordinate at each step
    lazy_all = None if shared else residual @ h if bool(residual.any()) else torch.zeros_like(residual)
    for start in range(0, d_in, block):
        # block tensors are laid out (step, row) so that every per-step slice is contiguous
        cols = perm[:, start : start + block].T.contiguous()  # (b, d_out) coordinate of row j at step t
        at = row_start + cols  # (b, d_out) flat positions
        if shared:  # one dense GEMM per block, as GPTQ's lazy batch update: (R H)[:, block]
            lazy = (residual @ h[:, cols[:, 0]]).T  # (b, d_out)
            h_block = h[cols[:, 0]][:, cols[:, 0], None]  # (b, b, 1) broadcast over rows
        else:  # (R H)[j, p_j(t)] kept up to date lazily, and a per-row gather of H[p_j(t), p_j(s)]
            lazy = lazy_all.T.gather(0, cols)  # (b, d_out)
            h_block = torch.take(h, cols[:, None, :] * d_in + cols[None, :, :])  # (b, b, d_out)
        inner = torch.zeros_like(lazy)  # Σ_s H[p_j(t), p_j(s)] Δr_j(s) over the coordinates already visited
        r_start, w_block, diag = flat_r[at], flat_w[at], h_diag[cols]  # (b, d_out)
        # exact 1-D minimizer w_i + (H[i,:]·r − H_ii r_i)/H_ii, with the lazy, in-block and own terms
        base = w_block - r_start + lazy / diag
        r_block, c_block = torch.empty_like(lazy), torch.empty_like(lazy)
        for t in range(cols.shape[0]):
            target = base[t] + inner[t] / diag[t]
            code = torch.clamp(torch.round(target / scale) + zero, 0, grid.maxq)
            r_block[t] = w_block[t] - scale * (code - zero)
            c_block[t] = code
            inner[t + 1 :].addcmul_(h_block[t, t + 1 :], r_block[t] - r_start[t])
        flat_r[at] = r_block
        flat_c[at] = c_block.to(torch.uint8)
        if not shared and start + block < d_in:
            lazy_all += _sparse_rows(cols.T, (r_block - r_start).T, d_in) @ h


def start_point(w: torch.Tensor, gram: torch.Tensor, config: COMQConfig) -> tuple[torch.Tensor, torch.Tensor, Grid]:
    """Where coordinate descent starts: ``(residual W − Q, codes, grid)``, residual (d_out, d_in) float64.

    ``init="float"`` starts at ``Q = W`` (zero residual); its codes are written by the first sweep.
    """
    common = {"bits": config.bits, "granularity": config.granularity}
    if config.init == "gptq":
        start = gptq_quantize(w, gram, GPTQConfig(**common))
    elif config.init == "rtn":
        start = rtn_quantize(w, None, RTNConfig(**common))
    else:  # the release: Q = W, codes filled in by the first sweep
        grid = minmax_grid(w, bits=config.bits, granularity=config.granularity)
        return torch.zeros_like(w), torch.zeros_like(w, dtype=torch.uint8), grid
    codes = start.codes.clone()
    return w - start.dequantize(dtype=torch.float64), codes, start.grid


def comq_quantize(weight: torch.Tensor, gram: torch.Tensor, config: COMQConfig) -> QuantResult:
    """Quantize a ``(d_out, d_in)`` weight given its input Gram matrix ``H = XᵀX`` (d_in, d_in).

    Returns:
        The codes and the (possibly updated) grid.
    """
    w, h = prepare_gram(weight, gram)
    residual, codes, grid = start_point(w, gram, config)
    perm = coordinate_order(w, h, config.order)
    for _ in range(config.sweeps):
        comq_sweep(w, h, residual, codes, grid, perm)
        if config.update_scale:
            grid = grid.with_scale(optimal_scale(w, codes, grid, h, granularity=config.granularity))
            residual = w - grid.scale * (codes.to(torch.float64) - grid.zero)
    return QuantResult(codes=codes, grid=grid)
