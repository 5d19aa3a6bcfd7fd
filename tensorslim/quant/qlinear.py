"""``QuantLinear`` / ``QuantConv2d``: packed integer codes + scales, multiplied by PyTorch's int4/int8 CPU kernels.

A weight is ``scale · (code − zero)`` with one scale and zero point per output row. Files (``state_dict``,
safetensors) always hold the portable form: the codes as a little-endian bit stream (``packed``,
:func:`~tensorslim.quant.quantizer.pack_codes`), the scales and the zero points; ``to_dense()`` is the explicit way
to get a float weight back.

In memory a 4-bit or 8-bit layer on CPU keeps ``packed`` in the layout of the kernel it runs on
(:mod:`tensorslim.quant.kernels`), so the weight is held once, in 0.5 or 1 byte per weight, and never dequantized:

* ``layout="int4pack"`` (4 bits): ``_weight_int4pack_mm_for_cpu``'s blocked layout, rows and columns padded to its
  16×32 blocks;
* ``layout="int8"`` (8 bits): ``code − 128`` as ``int8``, for ``_weight_int8pack_mm``, rows padded to 16 columns;
* ``layout="stream"`` (2, 3, 5, 6, 7 bits, or off CPU): the file's bit stream; the forward then derives the kernel
  operand (4-bit codes for ≤ 4 bits, int8 above) once and keeps it beside the stream.

``state_dict()`` converts back to the stream and ``load_state_dict`` converts from it, so files do not depend on the
kernel. With :func:`set_weight_cache` ``(model, True)`` a layer instead dequantizes its weight once, keeps the float
copy (4 bytes per fp32 weight) and multiplies with ``F.linear``: dense speed and numerics, dense memory. Every
derived tensor (kernel operand, scale table, float copy) is rebuilt when the codes, scales or zero points it came
from change (a new tensor, an in-place write, ``load_state_dict``, an optimizer step, a device move).

Factored layers keep their factorization: :class:`QuantLowRankLinear` stores CoLA's / SVD's ``A`` and ``B`` as two
:class:`QuantLinear` s (each on the kernels) and applies σ between them; :class:`QuantTTLinear` stores each TT core
as a packed matrix and contracts the dequantized cores exactly as :class:`~tensorslim.layers.tt.TTLinear` does,
never forming ``W`` (a TT contraction is not a matrix product with the input, so the cores do not use the kernels;
they are small).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Iterable
from typing import NamedTuple, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.functional.lowrank import activation_fn
from tensorslim.functional.tt import tt_linear
from tensorslim.layers.lowrank import LowRankLinear
from tensorslim.layers.tt import TTLinear
from tensorslim.quant import kernels
from tensorslim.quant.quantizer import Grid, QuantResult, dequantize, pack_codes, packed_nbytes, unpack_codes

KERNEL_FLOATS = (torch.float32, torch.bfloat16)  # the activation and scale dtypes the kernels serve
_Layer = TypeVar("_Layer", bound=nn.Module)


class KernelOperands(NamedTuple):
    """What :mod:`~tensorslim.quant.kernels` multiplies by: ``kind`` (``"int4"`` or ``"int8"``), the kernel's 2-D
    weight, its scale table (int4: the ``(s, m)`` groups; int8: the row scales), the 8-bit zero point's ``(1, d_out)``
    offset or None, and whether the weight was derived (a ``stream`` layer) rather than a view of ``packed``."""

    kind: str
    weight: torch.Tensor
    table: torch.Tensor
    offset: torch.Tensor | None
    derived_weight: bool


class _Source(NamedTuple):
    """What a derived tensor of a :class:`QuantLinear` came from: the codes' storage, the buffers' dtypes, and
    snapshots (:func:`_snapshot`) of the scales, the zero points and, where the derived tensor copies them, the
    codes."""

    packed_ptr: int
    dtypes: tuple[torch.dtype, torch.dtype]
    scale: bytes | torch.Tensor
    zero: bytes | torch.Tensor
    packed: bytes | torch.Tensor | None


def _snapshot(tensor: torch.Tensor) -> bytes | torch.Tensor:
    """A copy of ``tensor``'s values to compare with later: its raw bytes where it is a contiguous CPU tensor (read
    and compared in a fraction of a microsecond for a layer's row scales, several times faster than ``torch.equal``),
    else a clone."""
    if tensor.is_cpu and tensor.is_contiguous():
        return ctypes.string_at(tensor.data_ptr(), tensor.nbytes)
    return tensor.detach().clone()


def _unchanged(snapshot: bytes | torch.Tensor, tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` holds the values :func:`_snapshot` recorded (the dtype is compared by the caller)."""
    if type(snapshot) is bytes:
        contiguous_cpu = tensor.is_cpu and tensor.is_contiguous()
        return contiguous_cpu and ctypes.string_at(tensor.data_ptr(), tensor.nbytes) == snapshot
    return snapshot.device == tensor.device and torch.equal(snapshot, tensor)


def _kernel_layout(bits: int, device: torch.device) -> str:
    """The in-memory layout of ``packed``: the kernel's own where it holds the codes in the stream's bytes."""
    if device.type != "cpu":
        return "stream"
    return {4: "int4pack", 8: "int8"}.get(bits, "stream")


class QuantLinear(nn.Module):
    """A linear layer ``y = x Wᵀ + b`` whose ``W = scale · (code − zero)`` is stored as packed ``bits``-bit codes.

    Args:
        in_features: ``d_in``.
        out_features: ``d_out``.
        bits: code width, 2..8.
        bias: whether the layer has a bias.
        dtype: dtype of the scales, the bias and the output (and of the dequantized weight).

    Attributes:
        cache_weight: multiply by a cached dequantized float weight (``F.linear``) instead of the packed kernels.
        activations: the kernels' activation dtype: ``"auto"`` (:func:`~tensorslim.quant.kernels.kernel_dtype`),
            ``"bfloat16"`` or ``"float32"``.
    """

    def __init__(
        self, in_features: int, out_features: int, *, bits: int, bias: bool = True, dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__()
        self.in_features, self.out_features, self.bits = in_features, out_features, bits
        self.layout = self._layout_on(torch.device("cpu"))
        self.register_buffer("packed", self._to_layout(torch.zeros(out_features, in_features, dtype=torch.uint8)))
        self.register_buffer("scale", torch.ones(out_features, 1, dtype=dtype))
        # zero points are integers in [0, 2**bits - 1]; uint8 keeps them exact and small on disk
        self.register_buffer("zero", torch.zeros(out_features, 1, dtype=torch.uint8))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype)) if bias else None
        self.cache_weight = False
        self.activations = "auto"
        self._cached: tuple[_Source, torch.Tensor] | None = None  # (the buffers it came from, float weight)
        self._operands: tuple[_Source, torch.dtype, KernelOperands] | None = None  # (source, activations, operands)
        self._register_state_dict_hook(_stream_in_state_dict)
        self._register_load_state_dict_pre_hook(_layout_from_state_dict, with_module=True)

    @classmethod
    def from_result(
        cls, result: QuantResult, *, bias: torch.Tensor | None, dtype: torch.dtype = torch.float32
    ) -> QuantLinear:
        d_out, d_in = result.codes.shape
        layer = cls(d_in, d_out, bits=result.grid.bits, bias=bias is not None, dtype=dtype)
        return _filled(layer, [(layer, result)], bias)

    def load_result(self, result: QuantResult) -> None:
        self.packed.copy_(self._to_layout(result.codes))
        self.scale.copy_(result.grid.scale.to(self.scale.dtype))
        self.zero.copy_(result.grid.zero.to(torch.uint8))

    # --- layouts -----------------------------------------------------------------------------------------------

    def _layout_on(self, device: torch.device) -> str:
        return _kernel_layout(self.bits, device)

    def _to_layout(self, codes: torch.Tensor) -> torch.Tensor:
        """``(d_out, d_in)`` codes → ``packed`` in this layer's layout."""
        if self.layout == "int4pack":
            return kernels.pack_int4(codes)
        if self.layout == "int8":
            return kernels.int8_weight(codes).reshape(-1)
        return pack_codes(codes, self.bits)

    def _stream(self) -> torch.Tensor:
        """``packed`` as the portable bit stream of the files."""
        return self.packed if self.layout == "stream" else pack_codes(self.codes(), self.bits)

    @property
    def grid(self) -> Grid:
        return Grid(scale=self.scale, zero=self.zero, bits=self.bits)

    def codes(self) -> torch.Tensor:
        """The ``(d_out, d_in)`` ``uint8`` codes."""
        shape = (self.out_features, self.in_features)
        if self.layout == "int4pack":
            return kernels.unpack_int4(self.packed, *shape).to(self.packed.device)
        if self.layout == "int8":
            return kernels.int8_codes(self.packed.view(self.out_features, -1), self.in_features)
        return unpack_codes(self.packed, self.bits, math.prod(shape)).view(shape)

    def to_dense(self) -> torch.Tensor:
        """The dequantized ``(d_out, d_in)`` weight."""
        return dequantize(self.codes(), self.grid, dtype=self.scale.dtype)

    # --- derived tensors -----------------------------------------------------------------------------------------

    def _codes_and_grid(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``packed``, ``scale``, ``zero`` from the buffer table: read on every call, and several times faster than
        ``nn.Module.__getattr__`` (through which they are read where one was made a parameter, to learn it)."""
        buffers = self._buffers
        try:
            return buffers["packed"], buffers["scale"], buffers["zero"]
        except KeyError:
            return self.packed, self.scale, self.zero

    def _source(self, *, codes: bool) -> _Source:
        """What a derived tensor comes from: the codes' storage (a kernel layout's operand is a view of it), the
        dtypes, and snapshots of the values (the codes only where the derived tensor copies them). Values are
        compared rather than in-place version counters because a write through ``.data`` bumps no version."""
        packed, scale, zero = self._codes_and_grid()
        return _Source(
            packed.data_ptr(), (scale.dtype, zero.dtype), _snapshot(scale), _snapshot(zero),
            _snapshot(packed) if codes else None,
        )  # fmt: skip

    def _is_source(self, source: _Source) -> bool:
        """Whether the buffers still hold what ``source`` recorded: run on every call, so spelled out flat (two
        byte-string comparisons of ``d_out`` scales and zero points; the codes only for a derived copy of them)."""
        packed, scale, zero = self._codes_and_grid()
        return (
            packed.data_ptr() == source.packed_ptr
            and (scale.dtype, zero.dtype) == source.dtypes
            and _unchanged(source.scale, scale)
            and _unchanged(source.zero, zero)
            and (source.packed is None or _unchanged(source.packed, packed))
        )

    def dequantized_weight(self) -> torch.Tensor:
        """The dequantized ``(d_out, d_in)`` weight: the cached copy while ``cache_weight`` holds and the codes,
        scales and zero points are the ones it came from, else :meth:`to_dense` afresh."""
        if not self.cache_weight:
            self._cached = None
            return self.to_dense()
        if self._cached is None or not self._is_source(self._cached[0]):
            self._cached = None  # free the stale copy before building the new one
            with torch.no_grad():
                self._cached = (self._source(codes=True), self.to_dense())
        return self._cached[1]

    def cached_bytes(self) -> int:
        """Bytes of the tensors derived from the buffers and held between calls (float copy, kernel operands, and
        the copies of the buffers that tell whether they are still current)."""
        held, sources = [], []
        if self._cached is not None:
            sources.append(self._cached[0])
            held.append(self._cached[1])
        if self._operands is not None:
            source, _, operands = self._operands
            sources.append(source)
            held += [t for t in (operands.table, operands.offset) if t is not None]
            held += [operands.weight] if operands.derived_weight else []
        held += [t for source in sources for t in (source.scale, source.zero, source.packed) if t is not None]
        return sum(len(t) if type(t) is bytes else t.nbytes for t in held)  # tensors, and snapshots as bytes

    def _kernel_operands(self, dtype: torch.dtype) -> KernelOperands:
        """The kernel's operands for ``dtype`` activations, rebuilt when the buffers change."""
        if self._operands is None or self._operands[1] != dtype or not self._is_source(self._operands[0]):
            self._operands = None  # free the stale operands before building new ones
            with torch.no_grad():
                source = self._source(codes=self.layout == "stream")  # a stream layer's weight copies the codes
                self._operands = (source, dtype, self._build_operands(dtype))
        return self._operands[2]

    def _build_operands(self, dtype: torch.dtype) -> KernelOperands:
        codes = self.codes() if self.layout == "stream" else None  # a stream layer derives the kernel's weight
        if self.layout == "int4pack" or (codes is not None and self.bits <= 4):
            packed = self.packed if codes is None else kernels.pack_int4(codes)
            n_pad, k_pad = kernels.int4_padded_shape(self.out_features, self.in_features)
            table = kernels.int4_scales_and_zeros(self.scale, self.zero, in_features=self.in_features, dtype=dtype)
            return KernelOperands("int4", packed.view(n_pad, k_pad // 2), table, None, codes is not None)
        scale = self.scale.reshape(-1).float()
        if codes is not None:  # at most 7 bits: q − z fits in int8, no offset
            weight = kernels.int8_weight(codes, self.zero.to(torch.int32)).view(torch.int8)
            return KernelOperands("int8", weight, scale.to(dtype), None, True)
        offset = (scale * (128 - self.zero.reshape(-1).float())).view(1, -1)  # the zero point's share, (1, d_out)
        weight = self.packed.view(self.out_features, -1).view(torch.int8)
        return KernelOperands("int8", weight, scale.to(dtype), offset, False)

    def kernel_matmul(self, x: torch.Tensor, *, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x Wᵀ (+ bias)`` on the packed kernel for ``(M, d_in)`` ``x``: ``(M, d_out)`` in the kernel's activation
        dtype, or fp32 where an 8-bit zero point's term or an fp32 bias is added (the addition is the cast). Chained
        layers (CoLA's ``A`` then ``B``) pass this result on without converting it back and forth."""
        dtype = kernels.kernel_dtype(self.activations)
        operands = self._kernel_operands(dtype)
        if operands.kind == "int4":
            return kernels.int4_mm(
                x.to(dtype), operands.weight, operands.table, out_features=self.out_features, bias=bias
            )
        return kernels.int8_mm(x, operands.weight, operands.table, operands.offset, bias=bias)

    def _kernel_forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.kernel_matmul(x.reshape(-1, self.in_features), bias=self.bias).to(self.scale.dtype)  # (M, d_out)
        return y.view(*x.shape[:-1], self.out_features)

    def _uses_kernel(self, x: torch.Tensor) -> bool:
        """The kernels serve inference on CPU in fp32/bf16; gradients and other dtypes take the float weight."""
        needs_grad = torch.is_grad_enabled() and x.requires_grad
        return (
            not (self.cache_weight or needs_grad)
            and x.is_cpu
            and x.dtype in KERNEL_FLOATS
            and self.scale.dtype in KERNEL_FLOATS
        )

    def _apply(self, fn, recurse=True):  # .to() / .half() / .cuda(): derived tensors belong to the old buffers
        self._cached = self._operands = None
        layout = self._layout_on(fn(torch.empty(0, dtype=torch.uint8)).device)
        if layout == self.layout:
            return super()._apply(fn, recurse)
        codes = self.codes().cpu()  # a kernel layout lives on CPU only: re-lay the codes for the new device
        out = super()._apply(fn, recurse)
        self.layout = layout
        self.packed = self._to_layout(codes).to(self.packed.device)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d_in) -> (..., d_out)
        if self._uses_kernel(x):
            return self._kernel_forward(x)
        return F.linear(x, self.dequantized_weight(), self.bias)

    def storage_bytes(self) -> int:
        """Bytes of the packed codes (as in files), scales, zero points and bias."""
        tensors = [self.scale, self.zero] + ([self.bias] if self.bias is not None else [])
        codes = packed_nbytes(self.in_features * self.out_features, self.bits)
        return codes + sum(t.numel() * t.element_size() for t in tensors)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}"


def _stream_in_state_dict(module: QuantLinear, state: dict, prefix: str, local_metadata: dict) -> None:
    """``state_dict`` holds the portable bit stream whatever the in-memory layout."""
    if module.layout != "stream":
        state[prefix + "packed"] = module._stream()


def _layout_from_state_dict(module: QuantLinear, state: dict, prefix: str, *args) -> None:
    """``load_state_dict`` reads the bit stream into the in-memory layout (a stream of the wrong size is left for
    ``load_state_dict``'s own size error)."""
    key = prefix + "packed"
    stream = state.get(key)
    numel = module.in_features * module.out_features
    if module.layout == "stream" or stream is None or stream.numel() != packed_nbytes(numel, module.bits):
        return
    codes = unpack_codes(stream.to(torch.uint8).cpu(), module.bits, numel).view(module.out_features, -1)
    state[key] = module._to_layout(codes)


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


class QuantEmbedding(QuantLinear):
    """An ``nn.Embedding`` whose ``(num_embeddings, embedding_dim)`` table is stored as packed codes, one grid per row
    (per token), as llama.cpp's quantized formats store ``token_embd``.

    A lookup unpacks and dequantizes only the rows it reads, so the table stays packed in memory (the bit stream
    layout: a row is a whole number of bytes when ``embedding_dim · bits`` is a multiple of 8, else the table is
    dequantized for the lookup). ``in_features`` is ``embedding_dim``, ``out_features`` ``num_embeddings``.
    """

    def __init__(
        self, num_embeddings: int, embedding_dim: int, *, bits: int, dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__(embedding_dim, num_embeddings, bits=bits, bias=False, dtype=dtype)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim

    def _layout_on(self, device: torch.device) -> str:
        return "stream"  # rows are gathered from the stream; no matmul kernel is involved

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (...) -> (..., d)
        row_bytes, leftover = divmod(self.embedding_dim * self.bits, 8)
        if self.cache_weight or leftover:
            return F.embedding(ids, self.dequantized_weight())
        rows = self.packed.view(self.num_embeddings, row_bytes)[ids]  # (..., row_bytes)
        codes = unpack_codes(rows.reshape(-1), self.bits, ids.numel() * self.embedding_dim)
        codes = codes.view(*ids.shape, self.embedding_dim)
        return (self.scale[ids] * (codes.to(self.scale.dtype) - self.zero[ids].to(self.scale.dtype))).to(
            self.scale.dtype
        )

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, bits={self.bits}"


def build_quant_layer(module: nn.Module, result: QuantResult) -> QuantLinear:
    """The quantized replacement of an ``nn.Linear``, HF ``Conv1D``, ``nn.Conv2d`` or ``nn.Embedding`` (bias and
    geometry kept)."""
    dtype = next(module.parameters()).dtype
    if isinstance(module, nn.Conv2d):
        return _conv_from_result(module, result, dtype)
    if isinstance(module, nn.Embedding):
        layer = QuantEmbedding(module.num_embeddings, module.embedding_dim, bits=result.grid.bits, dtype=dtype)
        layer.load_result(result)
        return layer
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
    return _filled(layer, [(layer, result)], module.bias)


def _filled(layer: _Layer, codes: Iterable[tuple[QuantLinear, QuantResult]], bias: torch.Tensor | None) -> _Layer:
    """``layer`` with each of its packed matrices loaded from its quantization result and ``bias`` (the source
    layer's, or None) copied into ``layer.bias`` in the layer's dtype."""
    for matrix, result in codes:
        matrix.load_result(result)
    if bias is not None:
        layer.bias.data.copy_(bias.detach())  # copy_ casts to the layer's dtype
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
        self._sigma = activation_fn(activation)  # a one-line ValueError for an unknown σ
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
        return _filled(layer, [(layer.a, result_a), (layer.b, result_b)], module.bias)  # the bias is b's

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d_in) -> (..., d_out)
        sigma = self._sigma
        if not (self.a._uses_kernel(x) and self.b._uses_kernel(x)):
            return self.b(sigma(self.a(x)))  # (..., r) in between
        # both factors on the kernels: σ(A x) stays in the kernels' activation dtype between them (bf16 rounds the
        # product once, where B's kernel would round its input anyway)
        hidden = sigma(self.a.kernel_matmul(x.reshape(-1, self.in_features)))  # (M, r)
        y = self.b.kernel_matmul(hidden, bias=self.bias).to(self.b.scale.dtype)  # (M, d_out)
        return y.view(*x.shape[:-1], self.out_features)

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
        return _filled(layer, zip(layer.cores, results, strict=True), module.bias)

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


def set_kernel_activations(model: nn.Module, activations: str) -> int:
    """Set the packed kernels' activation dtype (``"auto"``, ``"bfloat16"`` or ``"float32"``, see
    :func:`~tensorslim.quant.kernels.kernel_dtype`) of every :class:`QuantLinear` in ``model``; returns how many."""
    kernels.kernel_dtype(activations)  # a one-line ValueError for an unknown name, before anything changes
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    for layer in layers:
        layer.activations = activations
    return len(layers)
