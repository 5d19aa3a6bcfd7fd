"""PyTorch's CPU weight-only int8/int4 matmul kernels, fed from our ``scale · (code − zero)`` grids.

Two ATen ops multiply float activations by packed integer weights without ever forming the float weight:

* ``_weight_int4pack_mm_for_cpu(x, W4, group, scales_and_zeros)`` computes ``x Wᵀ`` with
  ``W[n, k] = (q[n, k] − 8) · s[g, n] + m[g, n]`` (``g = k // group``) for unsigned 4-bit ``q`` packed by
  ``_convert_weight_to_int4pack_for_cpu`` into the kernel's blocked layout (``N`` a multiple of 16, ``K`` of 32).
  Our grid ``W = s · (q − z)`` is the same line: ``s · (q − 8) + s · (8 − z)``, so ``m = s · (8 − z)``; a per-row
  grid repeats its ``(s, m)`` in every group, which is exact whatever the group size.
* ``_weight_int8pack_mm(x, W8, s)`` computes ``x (s ⊙ W8)ᵀ`` for signed ``W8`` and one scale per output row, with
  no zero point. Codes of at most 7 bits go in as ``W8 = q − z`` (exact in int8). 8-bit codes span 0..255, so
  ``s · (q − z) = s · (q − 128) + s · (128 − z)``: ``W8 = q − 128`` and the zero point adds the rank-one term
  ``(Σ_k x_k) · s · (128 − z)``, computed in fp32 beside the kernel (``W8`` does not depend on ``z``, so the codes
  are held once, in the kernel's own form).

Both kernels are fast only with bf16 activations (the int4 one is 10-30× slower with fp32 activations; see
docs/deploy.md for the measured table). :func:`kernel_dtype` picks bf16 where the CPU runs PyTorch's vectorized
kernels (AVX2, AVX-512) and fp32 elsewhere; the choice reads the CPU's capabilities, never a timing.
"""

from __future__ import annotations

import math
from functools import cache, lru_cache

import torch

INT4_GROUPS = (256, 128, 64, 32)  # group sizes the int4 kernel accepts, largest (fewest scales) first
INT4_ROW_BLOCK, INT4_COL_BLOCK = 16, 32  # the int4 layout needs N % 16 == 0 and K % 32 == 0: we pad to them
# the int8 kernel's bf16 path reads past the row (wrong results, or a crash) unless K % 16 == 0 (torch 2.13): we pad
INT8_COL_BLOCK = 16
ACTIVATIONS = ("auto", "bfloat16", "float32")
# PyTorch's vectorized CPU builds: their bf16 kernels convert in registers, so bf16 activations run at full speed
# (measured on AVX2 and AVX-512 BF16 in docs/deploy.md); elsewhere (the scalar "DEFAULT" build) fp32 is kept
VECTORIZED = ("AVX2", "AVX512")


@cache
def kernel_dtype(activations: str = "auto") -> torch.dtype:
    """The activation dtype the packed kernels run in.

    Args:
        activations: ``"bfloat16"``, ``"float32"``, or ``"auto"``: bf16 when
            ``torch.backends.cpu.get_cpu_capability()`` names a vectorized build (AVX2, AVX-512), else fp32.
    """
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations={activations!r} is not supported; use one of {ACTIVATIONS}")
    if activations == "auto":
        return torch.bfloat16 if torch.backends.cpu.get_cpu_capability() in VECTORIZED else torch.float32
    return getattr(torch, activations)


def int4_padded_shape(out_features: int, in_features: int) -> tuple[int, int]:
    """``(N, K)`` rounded up to the int4 layout's blocks; the padding rows are dropped and padding columns meet zero
    activations, so their codes never count."""
    return math.ceil(out_features / INT4_ROW_BLOCK) * INT4_ROW_BLOCK, math.ceil(in_features / INT4_COL_BLOCK) * (
        INT4_COL_BLOCK
    )


def int4_group(in_features_padded: int) -> int:
    """The largest group size the kernel accepts that divides the padded ``K``."""
    return next(g for g in INT4_GROUPS if in_features_padded % g == 0)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """``(N, K)`` codes in 0..15 → the kernel's flat ``uint8`` layout of the padded ``(N', K')`` matrix."""
    n, k = codes.shape
    n_pad, k_pad = int4_padded_shape(n, k)
    padded = torch.zeros(n_pad, k_pad, dtype=torch.int32)
    padded[:n, :k] = codes.to(torch.int32)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(padded, 1).reshape(-1)


@lru_cache(maxsize=4)  # a few weight shapes of a model (4 bytes per weight each): reading codes back is rare
def _int4_positions(n_pad: int, k_pad: int) -> torch.Tensor:
    """For each nibble of the packed layout (byte-major, low nibble first), the flat index ``n·K' + k`` it holds.

    The layout is a fixed permutation of the codes; packing the base-16 digits of every index (each digit is a valid
    4-bit code) and reading them back recovers it without knowing the kernel's block sizes."""
    index = torch.arange(n_pad * k_pad, dtype=torch.int32)
    positions = torch.zeros(n_pad * k_pad, dtype=torch.int32)
    for digit in range(math.ceil(math.log(max(index.numel(), 2), 16))):
        plane = ((index >> (4 * digit)) & 15).view(n_pad, k_pad).to(torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(plane, 1).reshape(-1)
        nibbles = torch.stack([packed & 15, packed >> 4], dim=1).reshape(-1).to(torch.int32)
        positions |= nibbles << (4 * digit)
    return positions


def unpack_int4(packed: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """Inverse of :func:`pack_int4`: the ``(N, K)`` ``uint8`` codes."""
    n_pad, k_pad = int4_padded_shape(out_features, in_features)
    nibbles = torch.stack([packed & 15, packed >> 4], dim=1).reshape(-1)
    codes = torch.empty(n_pad * k_pad, dtype=torch.uint8)
    codes[_int4_positions(n_pad, k_pad).long()] = nibbles.cpu()
    return codes.view(n_pad, k_pad)[:out_features, :in_features]


def int4_scales_and_zeros(scale: torch.Tensor, zero: torch.Tensor, *, in_features: int, dtype: torch.dtype):
    """The kernel's ``(K' / group, N', 2)`` ``(s, s · (8 − z))`` table for per-row ``scale``/``zero`` ``(N, 1)``."""
    n = scale.shape[0]
    n_pad, k_pad = int4_padded_shape(n, in_features)
    s = scale.reshape(-1).to(torch.float32)
    table = torch.zeros(n_pad, 2)
    table[:n, 0], table[:n, 1] = s, s * (8 - zero.reshape(-1).to(torch.float32))
    return table.to(dtype).unsqueeze(0).expand(k_pad // int4_group(k_pad), n_pad, 2).contiguous()


def int4_mm(
    x: torch.Tensor, weight: torch.Tensor, table: torch.Tensor, *, out_features: int, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x Wᵀ (+ bias)`` for ``(M, K)`` ``x`` in ``table``'s dtype and the int4-packed ``W`` viewed as
    ``(N', K' / 2)``: ``(M, N)`` in ``table``'s dtype, or in the promoted dtype of ``bias`` and ``table`` (fp32 for an
    fp32 bias: the addition is the cast). Pads and slices only where ``W``'s shape is off the kernel's blocks."""
    k_pad = 2 * weight.shape[1]
    if x.shape[1] != k_pad:
        x = torch.nn.functional.pad(x, (0, k_pad - x.shape[1]))
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, weight, k_pad // table.shape[0], table)  # (M, N')
    y = y if y.shape[1] == out_features else y[:, :out_features]
    return y if bias is None else torch.add(bias, y)


def _int8_padded(in_features: int) -> int:
    return math.ceil(in_features / INT8_COL_BLOCK) * INT8_COL_BLOCK


def int8_weight(codes: torch.Tensor, center: torch.Tensor | int = 128) -> torch.Tensor:
    """``(N, K)`` codes → ``q − center`` as ``int8``, stored as its ``uint8`` bit pattern, ``(N, K')`` with ``K``
    padded to a multiple of 16 (padding columns meet zero activations).

    ``center`` is 128 for 8-bit codes (0..255 → −128..127; the zero point then needs :func:`int8_linear`'s offset)
    or the ``(N, 1)`` zero points for codes of at most 7 bits, whose ``q − z`` fits in int8 with no offset."""
    n, k = codes.shape
    weight = torch.zeros(n, _int8_padded(k), dtype=torch.uint8)
    weight[:, :k] = (codes.to(torch.int32) - center).to(torch.int8).view(torch.uint8)
    return weight


def int8_codes(weight: torch.Tensor, in_features: int) -> torch.Tensor:
    """Inverse of :func:`int8_weight` with ``center=128``: the ``(N, K)`` codes."""
    return weight[:, :in_features] ^ 0x80  # q − 128 in two's complement is q with its top bit flipped


def int8_mm(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor | None,
    *,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x Wᵀ (+ bias)`` for ``W = s · (q − center) + offset`` with ``weight`` from :func:`int8_weight`.

    Args:
        x: ``(M, K)`` activations (any float dtype: the kernel reads them in ``scale``'s dtype).
        weight: ``(N, K')`` ``int8`` view of ``q − center``.
        scale: ``(N,)`` in the kernel's activation dtype.
        offset: ``(1, N)`` fp32 ``s · (center − z)``, or None where ``center`` is the zero point.
        bias: ``(N,)`` or None.

    Returns:
        ``(M, N)``: fp32 where ``offset`` is added (the zero point's rank-one term ``(Σ_k x_k) · offset`` and the
        bias in one ``addmm`` in fp32 from ``x`` as given, then the kernel's product added in place), else in
        ``scale``'s dtype or the promoted dtype of ``bias`` and ``scale``.
    """
    low = x.to(scale.dtype)
    if low.shape[1] != weight.shape[1]:
        low = torch.nn.functional.pad(low, (0, weight.shape[1] - low.shape[1]))
    y = torch.ops.aten._weight_int8pack_mm(low, weight, scale)  # (M, N)
    if offset is None:
        return y if bias is None else torch.add(bias, y)
    row_sums = x.sum(dim=-1, keepdim=True, dtype=torch.float32)  # (M, 1)
    rank_one = row_sums * offset if bias is None else torch.addmm(bias.float(), row_sums, offset)  # (M, N)
    return rank_one.add_(y)
