"""``QuantLinear`` / ``QuantConv2d``: packed integer codes + scales, dequantized on the fly in every forward.

The packed codes (``uint8`` bit stream, :func:`~tensorslim.quant.quantizer.pack_codes`), the per-row scales and
zero points are buffers, so ``state_dict`` and safetensors files hold the compressed form; ``to_dense()`` is the
explicit way to get a float weight back.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d_in) -> (..., d_out)
        return F.linear(x, self.to_dense(), self.bias)

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
        kernel = self.to_dense().view(self.out_features, self.in_channels, *self.kernel_size)
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
