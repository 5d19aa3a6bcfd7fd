"""Uniform integer grids, rounding onto them, and bit-packing of the integer codes.

A quantized weight row ``w`` is ``scale * (code - zero)`` with integer ``code`` in ``[0, 2**bits - 1]``. The grid is
the asymmetric min/max grid that GPTQ's ``Quantizer`` and COMQ's ``quant.py`` both use (Frantar et al. 2022, §4
"Quantization grid"; Zhang et al. 2024, COMQ §3): ``scale = (max - min) / (2**bits - 1)``, ``zero = round(-min /
scale)``. We take the range over ``[min(w, 0), max(w, 0)]`` as GPTQ does, so 0 is always representable; COMQ's
release takes it over ``[min(w), max(w)]`` and the two agree whenever a row has both signs (every row of the
models we measured).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tensorslim._checks import check_fields

MIN_BITS, MAX_BITS = 2, 8
GRANULARITIES = ("channel", "layer")


def check_bits(bits: int) -> None:
    """Raise a one-line ``ValueError`` unless ``bits`` is an integer in 2..8."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(f"bits={bits!r} is not supported; use an integer from {MIN_BITS} to {MAX_BITS}")


def check_granularity(granularity: str) -> None:
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity={granularity!r} is not supported; use one of {GRANULARITIES}")


@dataclass(frozen=True)
class Grid:
    """Per-row (``channel``) or shared (``layer``) uniform grid.

    Attributes:
        scale: ``(d_out, 1)`` step sizes (all equal for a layer grid), float.
        zero: ``(d_out, 1)`` integer zero points stored as float, in ``[0, maxq]``.
        bits: code width.
    """

    scale: torch.Tensor
    zero: torch.Tensor
    bits: int

    @property
    def maxq(self) -> int:
        return 2**self.bits - 1

    def with_scale(self, scale: torch.Tensor) -> Grid:
        return Grid(scale=scale, zero=self.zero, bits=self.bits)


def minmax_grid(weight: torch.Tensor, *, bits: int, granularity: str = "channel") -> Grid:
    """The min/max grid of a ``(d_out, d_in)`` weight.

    Args:
        weight: ``(d_out, d_in)`` float weight.
        bits: code width, 2..8.
        granularity: ``"channel"`` (one scale and zero per output row, as in both papers) or ``"layer"`` (one for
            the whole matrix: the per-layer variant the COMQ abstract mentions and its release omits).
    """
    check_bits(bits)
    check_granularity(granularity)
    maxq = 2**bits - 1
    if granularity == "channel":
        lo, hi = weight.amin(dim=1, keepdim=True), weight.amax(dim=1, keepdim=True)  # (d_out, 1)
    else:
        lo = weight.amin().expand(weight.shape[0], 1)
        hi = weight.amax().expand(weight.shape[0], 1)
    lo, hi = lo.clamp(max=0), hi.clamp(min=0)
    # an all-zero row gets a unit grid so that codes stay finite (GPTQ does the same with xmin=-1, xmax=+1)
    dead = (hi - lo) == 0
    lo, hi = torch.where(dead, -1.0, lo), torch.where(dead, 1.0, hi)
    scale = (hi - lo) / maxq
    zero = torch.round(-lo / scale)
    return Grid(scale=scale.clone(), zero=zero.clone(), bits=bits)


def quantize_codes(weight: torch.Tensor, grid: Grid) -> torch.Tensor:
    """Nearest codes ``(d_out, d_in)`` as ``uint8`` (round half to even, then clip to the grid)."""
    codes = torch.clamp(torch.round(weight / grid.scale) + grid.zero, 0, grid.maxq)
    return codes.to(torch.uint8)


def dequantize(codes: torch.Tensor, grid: Grid, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``scale * (codes - zero)`` as a ``(d_out, d_in)`` float tensor."""
    return (grid.scale.to(dtype) * (codes.to(dtype) - grid.zero.to(dtype))).to(dtype)


def round_to_grid(weight: torch.Tensor, grid: Grid) -> torch.Tensor:
    """Round-to-nearest onto ``grid``, returned in the weight's dtype."""
    return dequantize(quantize_codes(weight, grid), grid, dtype=weight.dtype)


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack ``uint8`` codes below ``2**bits`` into a flat little-endian bit stream.

    Two int4 codes share a byte, eight int3 codes share three bytes; in general ``ceil(n * bits / 8)`` bytes.
    """
    check_bits(bits)
    flat = codes.reshape(-1).to(torch.int32)  # (n,)
    if flat.numel() and int(flat.max()) >= 2**bits:
        raise ValueError(f"codes do not fit in {bits} bits (max code {int(flat.max())})")
    bit_index = torch.arange(bits, dtype=torch.int32)
    stream = ((flat[:, None] >> bit_index) & 1).reshape(-1)  # (n * bits,) bit j of code i at i * bits + j
    stream = torch.nn.functional.pad(stream, (0, (-stream.numel()) % 8)).reshape(-1, 8)  # (bytes, 8)
    weights = 2 ** torch.arange(8, dtype=torch.int32)
    return (stream * weights).sum(dim=1).to(torch.uint8)


def unpack_codes(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: the first ``numel`` codes as a flat ``uint8`` tensor."""
    check_bits(bits)
    if 8 % bits == 0:  # whole codes per byte (1, 2, 4, 8 bits): one shift and mask per code
        shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)  # code j of a byte at bit j·bits
        return ((packed[:, None] >> shifts) & (2**bits - 1)).reshape(-1)[:numel]
    stream = (packed.to(torch.int32)[:, None] >> torch.arange(8, dtype=torch.int32)) & 1  # (bytes, 8)
    stream = stream.reshape(-1)[: numel * bits].reshape(numel, bits)  # (numel, bits)
    weights = 2 ** torch.arange(bits, dtype=torch.int32)
    return (stream * weights).sum(dim=1).to(torch.uint8)


def packed_nbytes(numel: int, bits: int) -> int:
    return (numel * bits + 7) // 8


@dataclass(frozen=True, kw_only=True)
class QuantConfig:
    """Settings every weight quantizer shares.

    Attributes:
        bits: code width, 2..8.
        granularity: ``"channel"`` (per output row) or ``"layer"`` (one scale and zero for the matrix).
        embeddings: also quantize the token embeddings (rounded to nearest, one grid per token) and the output head
            (by the config's solver), as llama.cpp's quantized formats do; False keeps both float, as GPTQ and the
            COMQ release do.
    """

    bits: int = 4
    granularity: str = "channel"
    embeddings: bool = False

    def __post_init__(self) -> None:
        check_fields(self)
        check_bits(self.bits)
        check_granularity(self.granularity)
        if not isinstance(self.embeddings, bool):
            raise ValueError(f"embeddings={self.embeddings!r} is not supported; use True or False")

    @property
    def needs_calibration(self) -> bool:
        return True


@dataclass(frozen=True)
class QuantResult:
    """One layer's quantization: integer codes ``(d_out, d_in)`` (``uint8``) on ``grid``."""

    codes: torch.Tensor
    grid: Grid

    def dequantize(self, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize(self.codes, self.grid, dtype=dtype)
