"""GPTQ (Frantar, Ashkboos, Hoefler, Alistarh 2022, arXiv 2210.17323): the baseline users know.

Algorithm 1 of the paper: quantize one column at a time in a fixed order and spread its error over the columns not
yet quantized through the upper Cholesky factor of ``H⁻¹``, with lazy batch updates of ``blocksize`` columns (§4
"Step 2") and dampening ``percdamp · mean(diag H)`` (§4 "Step 3"). ``act_order`` visits columns by decreasing
``diag H`` (the reference code's ``--act-order``). The grid is fixed from the float weights before the first column,
as in the reference code with ``groupsize=-1``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tensorslim.quant.quantizer import QuantConfig, QuantResult, minmax_grid, quantize_codes


@dataclass(frozen=True, kw_only=True)
class GPTQConfig(QuantConfig):
    """GPTQ settings (reference defaults).

    Attributes:
        percdamp: dampening added to ``diag H`` as a fraction of its mean.
        blocksize: columns per lazy batch update.
        act_order: quantize columns in order of decreasing ``diag H``.
    """

    percdamp: float = 0.01
    blocksize: int = 128
    act_order: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.percdamp >= 0:
            raise ValueError(f"percdamp={self.percdamp!r} must be >= 0")
        if self.blocksize < 1:
            raise ValueError(f"blocksize={self.blocksize!r} must be >= 1")


def prepare_gram(weight: torch.Tensor, gram: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 copies of ``W`` and ``H`` with dead inputs (``H_ii = 0``) neutralized as in the GPTQ code.

    A dead input never reaches the output, so its weights are set to 0 and ``H_ii`` to 1 to keep ``H`` invertible.
    """
    w = weight.detach().to(torch.float64).clone()  # (d_out, d_in)
    h = gram.to(torch.float64).clone()  # (d_in, d_in)
    dead = torch.diagonal(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    return w, h


def _upper_inverse_cholesky(h: torch.Tensor, percdamp: float) -> torch.Tensor:
    """Upper Cholesky factor ``U`` of ``(H + λI)⁻¹`` (``UᵀU = H⁻¹``), whose rows drive the error feedback."""
    h = h + percdamp * torch.diagonal(h).mean() * torch.eye(h.shape[0], dtype=h.dtype)
    h_inv = torch.cholesky_inverse(torch.linalg.cholesky(h))
    return torch.linalg.cholesky(h_inv, upper=True)


def gptq_quantize(weight: torch.Tensor, gram: torch.Tensor, config: GPTQConfig) -> QuantResult:
    """Quantize a ``(d_out, d_in)`` weight given its input Gram matrix ``H = XᵀX`` (d_in, d_in)."""
    w, h = prepare_gram(weight, gram)
    grid = minmax_grid(w, bits=config.bits, granularity=config.granularity)
    d_in = w.shape[1]
    perm = torch.argsort(torch.diagonal(h), descending=True) if config.act_order else torch.arange(d_in)
    w, h = w[:, perm], h[perm][:, perm]
    u = _upper_inverse_cholesky(h, config.percdamp)  # (d_in, d_in)
    codes = torch.zeros_like(w, dtype=torch.uint8)
    for start in range(0, d_in, config.blocksize):
        stop = min(start + config.blocksize, d_in)
        block = w[:, start:stop].clone()  # (d_out, b)
        errors = torch.zeros_like(block)
        u_block = u[start:stop, start:stop]
        for i in range(stop - start):
            col = block[:, i : i + 1]  # (d_out, 1)
            code = quantize_codes(col, grid)
            q = grid.scale * (code.to(torch.float64) - grid.zero)
            err = (col - q) / u_block[i, i]
            block[:, i:] -= err @ u_block[i : i + 1, i:]  # feedback inside the block
            errors[:, i : i + 1] = err
            codes[:, start + i : start + i + 1] = code
        w[:, stop:] -= errors @ u[start:stop, stop:]  # lazy batch update of the rest
    inverse = torch.argsort(perm)
    return QuantResult(codes=codes[:, inverse].contiguous(), grid=grid)
