"""Simulated low-precision floating-point formats with stochastic rounding.

The CPU has no fast fp16/bf16/fp8 matrix units, so (as Higham's ``chop`` does in the MATLAB code that preceded
Yang, Shan & Zhang, "Hardware-Efficient Mixed-Precision CP Tensor Decomposition", arXiv:2209.04003) values are
kept in float32 tensors whose entries are *exactly representable* in the target format. Products of such values
are then accumulated in float32, which is what a tensor core with fp32 accumulation does. Buffers that must
persist are stored in the real torch storage dtype (``float16``, ``bfloat16``, ``float8_e4m3fn``), so their byte
counts are the true storage cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["FORMATS", "FloatFormat", "ScaledBuffer", "get_format", "round_to_format"]


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format.

    Attributes:
        name: Public name used by ``precision=``.
        significand_bits: Significand bits *including* the hidden bit (Higham's ``t``).
        emin: Exponent of the smallest normal number.
        max_value: Largest finite value; rounding saturates here.
        dtype: Torch storage dtype holding the format losslessly.
    """

    name: str
    significand_bits: int
    emin: int
    max_value: float
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        """Bytes per stored element."""
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def is_full(self) -> bool:
        """True for float32, which needs no simulation."""
        return self.dtype == torch.float32


FORMATS: dict[str, FloatFormat] = {
    "fp32": FloatFormat("fp32", 24, -126, 3.4028234663852886e38, torch.float32),
    "fp16": FloatFormat("fp16", 11, -14, 65504.0, torch.float16),
    "bf16": FloatFormat("bf16", 8, -126, 3.3895313892515355e38, torch.bfloat16),
    # E4M3 "fn" (no infinities): 3 stored mantissa bits, max 448, as torch.float8_e4m3fn.
    "fp8_e4m3": FloatFormat("fp8_e4m3", 4, -6, 448.0, torch.float8_e4m3fn),
}


def get_format(precision: str) -> FloatFormat:
    """Look a format up by name, with a one-line error for unknown names."""
    if not isinstance(precision, str) or precision not in FORMATS:
        raise ValueError(f"precision={precision!r} is not supported; use one of {sorted(FORMATS)}")
    return FORMATS[precision]


def round_to_format(
    x: torch.Tensor,
    fmt: FloatFormat,
    *,
    stochastic: bool = True,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Round float32 values onto the grid of ``fmt`` (subnormals included, saturating at ``max_value``).

    Stochastic rounding picks the upper neighbour with probability equal to the distance from the lower one
    (in ulps), so ``E[round(x)] = x`` inside the range; this is ``chop``'s ``round=5`` mode used by the
    reference MATLAB code. Nearest rounding is round-half-to-even, identical to a torch dtype cast in range.

    Args:
        x: Values to round, any shape, float32.
        fmt: Target format.
        stochastic: Stochastic (True) or nearest (False) rounding.
        generator: Source of the uniform random numbers for stochastic rounding.

    Returns:
        A float32 tensor of the same shape whose entries are exactly representable in ``fmt``.
    """
    if fmt.is_full:
        return x
    x64 = x.double()  # float64 so that scaling by 2^-q below is exact for every format we support
    _, exp = torch.frexp(x64)  # |x| = m 2^exp, m in [0.5, 1)
    # ulp exponent q: floor(log2|x|) - (t - 1), floored at the subnormal spacing 2^(emin - t + 1).
    q = torch.clamp(exp - 1, min=fmt.emin) - (fmt.significand_bits - 1)
    ulp = torch.exp2(q.to(torch.float64))  # exact power of two (float64 covers 2^-133 .. 2^127)
    scaled = x64 / ulp  # integer part = significand, exact
    if stochastic:
        low = torch.floor(scaled)
        u = torch.rand(scaled.shape, generator=generator, dtype=torch.float64, device=x.device)
        k = low + (u < (scaled - low)).to(torch.float64)
    else:
        k = torch.round(scaled)  # half to even, like IEEE casts
    out = (k * ulp).clamp_(-fmt.max_value, fmt.max_value)
    return out.to(torch.float32)


def _pow2_scale(amax: float, fmt: FloatFormat) -> float:
    """Power-of-two scale s with amax * s <= max_value / 2, leaving headroom for stochastic round-up."""
    if fmt.max_value > 1e38 or amax == 0.0 or not math.isfinite(amax):
        return 1.0  # fp32 and bf16 share fp32's exponent range: nothing to gain from scaling
    return 2.0 ** math.floor(math.log2(fmt.max_value / (2.0 * amax)))


def quantize_scaled(x: torch.Tensor, fmt: FloatFormat, **rounding: Any) -> torch.Tensor:
    """Round ``x`` to ``fmt`` under a transient per-tensor power-of-two scale and return the dequantized values
    (``rounding``: ``stochastic`` and ``generator`` as :func:`round_to_format` takes them).

    Scaling by a power of two is exact, so it changes nothing but the range: it keeps small residuals and
    gradients out of the subnormals of fp8 (min subnormal 2^-9). This mirrors the per-tensor scaling of FP8
    training recipes; the reference MATLAB code used an unscaled custom format instead (our deviation).
    """
    if fmt.is_full:
        return x
    s = _pow2_scale(float(x.abs().max()) if x.numel() else 0.0, fmt)
    return round_to_format(x * s, fmt, **rounding) / s


class ScaledBuffer:
    """A persistent 2-D buffer stored in ``fmt.dtype`` with one power-of-two float32 scale.

    Rows are read and written in blocks (block SGD touches only sampled rows). On a write the scale is
    re-chosen from the whole buffer's magnitude; rescaling stored values by a power of two is exact except
    where it pushes values into the subnormal range, where it rounds to nearest.
    """

    def __init__(self, values: torch.Tensor, fmt: FloatFormat, *, generator: torch.Generator | None) -> None:
        self.fmt = fmt
        self._gen = generator
        self.scale = _pow2_scale(float(values.abs().max()) if values.numel() else 0.0, fmt)
        self.data = round_to_format(values.float() * self.scale, fmt, generator=generator).to(fmt.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of the stored data plus the float32 scale (none for fp32)."""
        return self.data.numel() * self.fmt.nbytes + (0 if self.fmt.is_full else 4)

    def dequantize(self) -> torch.Tensor:
        """The whole buffer as float32."""
        return self.data.float() / self.scale

    def read(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows ``rows`` (any integer index shape) as float32."""
        return self.data[rows].float() / self.scale

    def write(self, rows: torch.Tensor, values: torch.Tensor, *, stochastic: bool = True) -> None:
        """Store float32 ``values`` at 1-D ``rows``, rounded stochastically (default) or to nearest."""
        if self.fmt.is_full:
            self.data[rows] = values
            return
        amax = max(
            float(values.abs().max()) if values.numel() else 0.0, float(self.data.float().abs().max()) / self.scale
        )
        new_scale = _pow2_scale(amax, self.fmt)
        if new_scale != self.scale:
            rescaled = self.data.float() * (new_scale / self.scale)
            self.data = round_to_format(rescaled, self.fmt, stochastic=False).to(self.fmt.dtype)
            self.scale = new_scale
        rounded = round_to_format(values * self.scale, self.fmt, stochastic=stochastic, generator=self._gen)
        self.data[rows] = rounded.to(self.fmt.dtype)

    def add_compensated(self, rows: torch.Tensor, delta: torch.Tensor, compensation: ScaledBuffer) -> None:
        """``self[rows] += delta`` with Kahan compensation; the running sum is ``self − compensation``.

        ``compensation`` (same shape, also stored in a low format) holds what the last rounding of each entry
        added too much, so an update smaller than half an ulp is not lost but carried into the next one
        (Kahan 1965; the compensated bf16 weight update of Zamirai et al., arXiv:2010.06192). The stored
        value is rounded to nearest, so it stays the nearest format value of the running sum. The compensation
        is rounded stochastically: rounded to nearest, the same update repeated drifts the sum by the same
        rounding error every time (our choice; measured in ``tests/unit/test_cp_mixed.py``).
        """
        old = self.read(rows)
        corrected = delta - compensation.read(rows)
        self.write(rows, old + corrected, stochastic=False)
        # (new - old) is exact in float32 when the scale is unchanged: two format values a few ulps apart.
        compensation.write(rows, (self.read(rows) - old) - corrected)
