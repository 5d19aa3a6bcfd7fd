"""Round-to-nearest (RTN): the data-free baseline (GPTQ's ``--nearest``; Frantar et al. 2022, §5)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tensorslim.quant.quantizer import QuantConfig, QuantResult, minmax_grid, quantize_codes


@dataclass(frozen=True, kw_only=True)
class RTNConfig(QuantConfig):
    """Round every weight to the nearest point of its min/max grid; needs no calibration data."""

    @property
    def needs_calibration(self) -> bool:
        return False


def rtn_quantize(weight: torch.Tensor, gram: torch.Tensor | None, config: RTNConfig) -> QuantResult:
    """Quantize a ``(d_out, d_in)`` weight by rounding; ``gram`` is ignored (kept for a common signature)."""
    del gram
    w = weight.detach().to(torch.float64)
    grid = minmax_grid(w, bits=config.bits, granularity=config.granularity)
    return QuantResult(codes=quantize_codes(w, grid), grid=grid)
