"""``QuantLinear`` / ``QuantConv2d``: packed integer codes + scales, dequantized for the matmul.

The packed codes (``uint8`` bit stream, :func:`~tensorslim.quant.quantizer.pack_codes`), the per-row scales and
zero points are buffers, so ``state_dict`` and safetensors files hold the compressed form; ``to_dense()`` is the
explicit way to get a float weight back.

By default (``cache_weight=True``) a layer dequantizes its weight once and keeps the float copy until its codes,
scales or zero points change, so a forward runs at the speed of the dense layer, and memory at run time holds the
float weight next to the packed codes (4.5 bytes per fp32 weight at 4 bits, against 4 dense). With
``cache_weight=False`` (:func:`set_weight_cache`) only the packed codes stay in memory (0.5 bytes per weight) and
every call dequantizes the whole matrix again: on CPU, where PyTorch's int4 matmul kernel has no fast fp32 path, that
made a 4-bit model decode many times slower than dense (``benchmarks/results/inference_60m.md``).

Factored layers keep their factorization: :class:`QuantLowRankLinear` stores CoLA's / SVD's ``A`` and ``B`` as two
:class:`QuantLinear` s and applies σ between them; :class:`QuantTTLinear` stores each TT core as a packed matrix and
contracts the dequantized cores exactly as :class:`~tensorslim.layers.tt.TTLinear` does, never forming ``W``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.functional.lowrank import activation_fn, low_rank_linear
from tensorslim.functional.tt import tt_linear
from tensorslim.layers.lowrank import LowRankLinear
from tensorslim.layers.tt import TTLinear
from tensorslim.quant.quantizer import Grid, QuantResult, dequantize, pack_codes, packed_nbytes, unpack_codes


class QuantLinear(nn.Module):
    """A linear layer ``y = x Wᵀ + b`` whose ``W = scale · (code − zero)`` is stored as packed ``bits``-bit codes.

    Args:
        in_features: ``d_in``.
        out_features: ``d_out``.
        bits: code width, 2..8.
        bias: whether the layer has a bias.
        dtype: compute dtype of the dequantized weight, scales and bias.
    """

    def __init__(
        self, in_features: int, out_features: int, *, bits: int, bias: bool = True, dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__()
        self.in_features, self.out_features, self.bits = in_features, out_features, bits
        numel = in_features * out_features
        self.register_buffer("packed", torch.zeros(packed_nbytes(numel, bits), dtype=torch.uint8))
        self.register_buffer("scale", torch.ones(out_features, 1, dtype=dtype))
        # zero points are integers in [0, 2**bits - 1]; uint8 keeps them exact and small on disk
        self.register_buffer("zero", torch.zeros(out_features, 1, dtype=torch.uint8))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype)) if bias else None
        self.cache_weight = True
        self._cached: tuple[tuple, torch.Tensor] | None = None  # (key of the buffers it came from, weight)

    @classmethod
    def from_result(
        cls, result: QuantResult, *, bias: torch.Tensor | None, dtype: torch.dtype = torch.float32
    ) -> QuantLinear:
        d_out, d_in = result.codes.shape
        layer = cls(d_in, d_out, bits=result.grid.bits, bias=bias is not None, dtype=dtype)
        layer.load_result(result)
        if bias is not None:
            layer.bias.data.copy_(bias.detach().to(dtype))
        return layer

    def load_result(self, result: QuantResult) -> None:
        self.packed.copy_(pack_codes(result.codes, self.bits))
        self.scale.copy_(result.grid.scale.to(self.scale.dtype))
        self.zero.copy_(result.grid.zero.to(torch.uint8))

    @property
    def grid(self) -> Grid:
        return Grid(scale=self.scale, zero=self.zero, bits=self.bits)

    def codes(self) -> torch.Tensor:
        """The ``(d_out, d_in)`` ``uint8`` codes."""
        numel = self.in_features * self.out_features
        return unpack_codes(self.packed, self.bits, numel).view(self.out_features, self.in_features)

    def to_dense(self) -> torch.Tensor:
        """The dequantized ``(d_out, d_in)`` weight."""
        return dequantize(self.codes(), self.grid, dtype=self.scale.dtype)

    def dequantized_weight(self) -> torch.Tensor:
        """The ``(d_out, d_in)`` weight forward multiplies by: the cached dequantized weight while ``cache_weight``
        holds and the codes, scales and zero points are the ones it came from (storage and in-place version),
        else :meth:`to_dense` afresh."""
        if not self.cache_weight:
            self._cached = None
            return self.to_dense()
        key = tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in (self.packed, self.scale, self.zero))
        if self._cached is None or self._cached[0] != key:
            self._cached = None  # free the stale copy before building the new one
            with torch.no_grad():
                self._cached = (key, self.to_dense())
        return self._cached[1]

    def cached_bytes(self) -> int:
        """Bytes of the cached dequantized weight (0 when none is held)."""
        return 0 if self._cached is None else self._cached[1].numel() * self._cached[1].element_size()

    def _apply(self, fn, recurse=True):  # .to() / .half() / .cuda(): the cache belongs to the old buffers
        self._cached = None
        return super()._apply(fn, recurse)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d_in) -> (..., d_out)
        return F.linear(x, self.dequantized_weight(), self.bias)

    def storage_bytes(self) -> int:
        """Bytes of the packed codes, scales, zero points and bias."""
        tensors = [self.packed, self.scale, self.zero] + ([self.bias] if self.bias is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}"


class QuantConv2d(QuantLinear):
    """A ``groups=1`` zero-padded ``Conv2d`` whose ``(out, C·kh·kw)`` kernel matrix is stored as :class:`QuantLinear`.

    The kernel is dequantized and reshaped to ``(out, C, kh, kw)`` in each forward (the codes were fitted on the
    same ``unfold`` layout, see :func:`tensorslim.quant.calibration.layer_inputs`).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: tuple[int, int],
        *,
        bits: int,
        stride: tuple[int, int] = (1, 1),
        padding: tuple[int, int] = (0, 0),
        dilation: tuple[int, int] = (1, 1),
        bias: bool = True,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(in_channels * kernel_size[0] * kernel_size[1], out_channels, bits=bits, bias=bias, dtype=dtype)
        self.in_channels, self.kernel_size = in_channels, tuple(kernel_size)
        self.stride, self.padding, self.dilation = tuple(stride), tuple(padding), tuple(dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, out, H', W')
        kernel = self.dequantized_weight().view(self.out_features, self.in_channels, *self.kernel_size)
        return F.conv2d(x, kernel, self.bias, stride=self.stride, padding=self.padding, dilation=self.dilation)

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_features}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, bits={self.bits}"
        )


def build_quant_layer(module: nn.Module, result: QuantResult) -> QuantLinear:
    """The quantized replacement of an ``nn.Linear``, HF ``Conv1D`` or ``nn.Conv2d`` (bias and geometry kept)."""
    dtype = next(module.parameters()).dtype
    if isinstance(module, nn.Conv2d):
        return _conv_from_result(module, result, dtype)
    return QuantLinear.from_result(result, bias=module.bias, dtype=dtype)


def _conv_from_result(module: nn.Conv2d, result: QuantResult, dtype: torch.dtype) -> QuantConv2d:
    layer = QuantConv2d(
        module.in_channels,
        module.out_channels,
        module.kernel_size,
        bits=result.grid.bits,
        stride=module.stride,
        padding=module.padding,
        dilation=module.dilation,
        bias=module.bias is not None,
        dtype=dtype,
    )
    layer.load_result(result)
    if module.bias is not None:
        layer.bias.data.copy_(module.bias.detach().to(dtype))
    return layer


class QuantLowRankLinear(nn.Module):
    """``y = B σ(A x) + b`` (CoLA, arXiv 2502.10940 §3; σ = identity for SVD) with ``A`` and ``B`` quantized.

    ``A`` (r, d_in) and ``B`` (d_out, r) are :class:`QuantLinear` s named ``a`` and ``b``; ``b`` holds the bias. The
    product ``B A`` is never formed, as in :class:`~tensorslim.layers.lowrank.LowRankLinear`.

    Args:
        in_features: ``d_in``.
        out_features: ``d_out``.
        rank: ``r``.
        bits: code width of both factors, 2..8.
        activation: σ, as in ``LowRankLinear``.
        bias: whether the layer has a bias.
        dtype: compute dtype of the dequantized factors, scales and bias.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        rank: int,
        *,
        bits: int,
        activation: str = "identity",
        bias: bool = False,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        activation_fn(activation)  # a one-line ValueError for an unknown σ
        self.in_features, self.out_features, self.rank, self.bits = in_features, out_features, rank, bits
        self.activation = activation
        self.a = QuantLinear(in_features, rank, bits=bits, bias=False, dtype=dtype)
        self.b = QuantLinear(rank, out_features, bits=bits, bias=bias, dtype=dtype)

    @property
    def bias(self) -> nn.Parameter | None:
        return self.b.bias

    @classmethod
    def from_results(cls, module: LowRankLinear, result_a: QuantResult, result_b: QuantResult) -> QuantLowRankLinear:
        """The quantized replacement of ``module`` given the quantized ``A`` and ``B`` (bias and σ kept)."""
        layer = cls(
            module.in_features,
            module.out_features,
            module.rank,
            bits=result_a.grid.bits,
            activation=module.activation,
            bias=module.bias is not None,
            dtype=module.weight_a.dtype,
        )
        layer.a.load_result(result_a)
        layer.b.load_result(result_b)
        if module.bias is not None:
            layer.b.bias.data.copy_(module.bias.detach())
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d_in) -> (..., d_out)
        return low_rank_linear(
            x, self.a.dequantized_weight(), self.b.dequantized_weight(), self.b.bias, activation=self.activation
        )

    def storage_bytes(self) -> int:
        """Bytes of both factors' packed codes, scales and zero points, and the bias."""
        return self.a.storage_bytes() + self.b.storage_bytes()

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}, "
            f"activation={self.activation!r}, bits={self.bits}"
        )


def tt_core_matrix(core: torch.Tensor) -> torch.Tensor:
    """A TT core ``(r_{k-1}, n_k, r_k)`` viewed as the ``(r_{k-1}, n_k·r_k)`` matrix that is quantized.

    Each row (one left-bond index) gets its own grid under ``granularity="channel"``: ``r_{k-1}`` scales per core, so
    the first core (``r_0 = 1``) shares one grid.
    """
    return core.reshape(core.shape[0], -1)


class QuantTTLinear(nn.Module):
    """``y = x W + b`` with ``W`` in CoMERA's TT format (arXiv 2405.14377) and every core quantized.

    Core ``k`` is a :class:`QuantLinear` holding the ``(r_{k-1}, n_k·r_k)`` matrix of :func:`tt_core_matrix`; the
    forward dequantizes the cores and contracts them with :func:`~tensorslim.functional.tt.tt_linear`, so ``W`` is
    never formed.

    Args:
        in_factors: input modes (∏ = ``d_in``).
        out_factors: output modes (∏ = ``d_out``).
        ranks: full rank list ``(1, r_1, …, 1)``.
        bits: code width of every core, 2..8.
        bias: whether the layer has a bias.
        dtype: compute dtype of the dequantized cores, scales and bias.
    """

    def __init__(
        self,
        in_factors: tuple[int, ...],
        out_factors: tuple[int, ...],
        ranks: tuple[int, ...],
        *,
        bits: int,
        bias: bool = True,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.in_factors, self.out_factors, self.ranks = tuple(in_factors), tuple(out_factors), tuple(ranks)
        dims = self.in_factors + self.out_factors
        if len(self.ranks) != len(dims) + 1:
            raise ValueError(f"ranks={list(self.ranks)} needs {len(dims) + 1} entries for modes {list(dims)}")
        self.in_features, self.out_features, self.bits = math.prod(self.in_factors), math.prod(self.out_factors), bits
        self.cores = nn.ModuleList(
            QuantLinear(n * r1, r0, bits=bits, bias=False, dtype=dtype)
            for r0, n, r1 in zip(self.ranks[:-1], dims, self.ranks[1:], strict=True)
        )
        self.bias = nn.Parameter(torch.zeros(self.out_features, dtype=dtype)) if bias else None

    @classmethod
    def from_results(cls, module: TTLinear, results: list[QuantResult]) -> QuantTTLinear:
        """The quantized replacement of ``module`` given its quantized core matrices (gates already folded in)."""
        dtype = module.cores[0].dtype
        layer = cls(
            module.in_factors,
            module.out_factors,
            module.ranks,
            bits=results[0].grid.bits,
            bias=module.bias is not None,
            dtype=dtype,
        )
        for core, result in zip(layer.cores, results, strict=True):
            core.load_result(result)
        if module.bias is not None:
            layer.bias.data.copy_(module.bias.detach().to(dtype))
        return layer

    def dequantized_cores(self) -> list[torch.Tensor]:
        """The ``(r_{k-1}, n_k, r_k)`` cores from their codes (cached: :meth:`QuantLinear.dequantized_weight`)."""
        dims = self.in_factors + self.out_factors
        return [
            core.dequantized_weight().view(r0, n, r1)
            for core, r0, n, r1 in zip(self.cores, self.ranks[:-1], dims, self.ranks[1:], strict=True)
        ]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d_in) -> (..., d_out)
        return tt_linear(x, self.dequantized_cores(), self.bias, n_in=len(self.in_factors))

    def storage_bytes(self) -> int:
        """Bytes of every core's packed codes, scales and zero points, and the bias."""
        bias = self.bias.numel() * self.bias.element_size() if self.bias is not None else 0
        return sum(core.storage_bytes() for core in self.cores) + bias

    def extra_repr(self) -> str:
        return (
            f"in_factors={list(self.in_factors)}, out_factors={list(self.out_factors)}, ranks={list(self.ranks)}, "
            f"bits={self.bits}, bias={self.bias is not None}"
        )


def set_weight_cache(model: nn.Module, enabled: bool) -> int:
    """Turn the dequantized-weight cache of every :class:`QuantLinear` in ``model`` on or off (off frees the copies);
    returns how many layers were set."""
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    for layer in layers:
        layer.cache_weight = enabled
        if not enabled:
            layer._cached = None
    return len(layers)
