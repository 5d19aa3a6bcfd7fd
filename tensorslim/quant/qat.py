"""Quantization-aware training of tensor-compressed layers with learnable scales (tensor.md §4.2).

The quantizer is the released QAT-TT one (``utils_tensor_layers.py`` L9-57): symmetric, uniform, one learnable
scale ``s`` per tensor, ``q = s · clamp(round(x/s), Q_n, Q_p)`` with ``Q_n = −2^{b−1}``, ``Q_p = 2^{b−1} − 1``, and
the LSQ straight-through backward (Esser et al. 2020, "Learned Step Size Quantization", §2, eq. (3)):
``∂q/∂x = 1`` inside the clip range and 0 outside; ``∂q/∂s = round(x/s) − x/s`` inside and ``Q_n`` or ``Q_p``
outside. Like the release we omit LSQ's gradient scale ``1/sqrt(N·Q_p)`` by default (``grad_scale=True`` adds it).

Modes (the release's ``--qat``):
    * ``"weight"`` (1): every TT / TTM core is fake-quantized to ``bits`` (4) through a parametrization; the
      contraction runs in full precision.
    * ``"weight+activation"`` (2): also the layer input at ``bits`` (4, as released), every partial product of the
      left/right core chains and the latent ``x·L`` at ``bits_intermediate`` (8); the output stays float.

Scales: cores ``s = max|G| / Q_p`` (release init). Activation scales: the release starts them at the constants
``1/Q_p``, which presumes inputs in [−1, 1]; BERT hidden states are not, so we initialize each activation scale from
the first batch it sees (``max|x| / Q_p``), the same rule as for the cores. That is a deviation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils import parametrize

from tensorslim._checks import check_fields
from tensorslim.layers.tt import TTLinear
from tensorslim.layers.tt_embedding import TTEmbedding
from tensorslim.registry import LayerReport, Transform, register_transform

QAT_MODES = ("weight", "weight+activation")


def qrange(bits: int) -> tuple[int, int]:
    """``(Q_n, Q_p)`` of a signed ``bits``-bit symmetric grid."""
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


class _LSQ(torch.autograd.Function):
    """Fake quantization with the LSQ straight-through backward (Esser et al. 2020, eq. (3))."""

    @staticmethod
    def forward(ctx, x, scale, q_n, q_p, grad_factor):  # x (...), scale () -> (...)
        v = x / scale
        inside = (v >= q_n) & (v <= q_p)
        ctx.save_for_backward(v, inside)
        ctx.q_n, ctx.q_p, ctx.grad_factor = q_n, q_p, grad_factor
        return torch.clamp(torch.round(v), q_n, q_p) * scale

    @staticmethod
    def backward(ctx, grad):
        v, inside = ctx.saved_tensors
        grad_x = grad * inside
        local = torch.where(inside, torch.round(v) - v, torch.clamp(v, ctx.q_n, ctx.q_p))  # ∂q/∂s per element
        grad_scale = (grad * local).sum().reshape(()) * ctx.grad_factor
        return grad_x, grad_scale, None, None, None


def lsq_quantize(x: torch.Tensor, scale: torch.Tensor, *, bits: int, grad_scale: bool = False) -> torch.Tensor:
    """``s · clamp(round(x/s), Q_n, Q_p)`` with the LSQ gradients to ``x`` and ``s`` (scalar ``scale``)."""
    q_n, q_p = qrange(bits)
    factor = 1.0 / math.sqrt(x.numel() * q_p) if grad_scale else 1.0
    return _LSQ.apply(x, scale, q_n, q_p, factor)


class LearnedScaleQuantizer(nn.Module):
    """One learnable scale; usable as a parametrization of a core or as an activation quantizer.

    Args:
        bits: code width (2..8).
        init: tensor to initialize the scale from (``max|init| / Q_p``); None initializes lazily from the first input.
        grad_scale: multiply the scale gradient by LSQ's ``1/sqrt(N·Q_p)`` (off in the release).
    """

    def __init__(self, *, bits: int, init: torch.Tensor | None = None, grad_scale: bool = False) -> None:
        super().__init__()
        if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
            raise ValueError(f"bits={bits!r} is not supported; use an integer from 2 to 8")
        self.bits, self.grad_scale = bits, grad_scale
        self.scale = nn.Parameter(torch.ones(()))
        self.register_buffer("initialized", torch.tensor(False))
        if init is not None:
            self.init_from(init)

    @torch.no_grad()
    def init_from(self, x: torch.Tensor) -> None:
        if x.is_meta:  # a meta model (the books) has no values: the scale stays to be set by real data
            return
        amax = x.detach().abs().max()
        self.scale.fill_(float(amax) / qrange(self.bits)[1] if amax > 0 else 1.0)
        self.initialized.fill_(True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_meta and not bool(self.initialized):
            self.init_from(x)
        return lsq_quantize(x, self.scale.to(x.dtype), bits=self.bits, grad_scale=self.grad_scale)

    def extra_repr(self) -> str:
        return f"bits={self.bits}"


@dataclass(frozen=True, kw_only=True)
class QATConfig:
    """QAT-TT settings (release defaults: ``bit_cores = 4``, ``bit_intermediate = 8``).

    Attributes:
        mode: ``"weight"`` or ``"weight+activation"``.
        bits: width of the cores (and of the layer input in ``weight+activation`` mode).
        bits_intermediate: width of the chain products and of ``x·L`` in ``weight+activation`` mode.
        grad_scale: LSQ's scale-gradient factor (not in the release).
    """

    mode: str = "weight"
    bits: int = 4
    bits_intermediate: int = 8
    grad_scale: bool = False

    def __post_init__(self) -> None:
        check_fields(self)
        if self.mode not in QAT_MODES:
            raise ValueError(f"mode={self.mode!r} is not supported; use one of {QAT_MODES}")
        for name in ("bits", "bits_intermediate"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= 8:
                raise ValueError(f"{name}={value!r} is not supported; use an integer from 2 to 8")


def _quantize_cores(layer: TTLinear | TTEmbedding, config: QATConfig) -> None:
    for index, core in enumerate(layer.cores):
        quantizer = LearnedScaleQuantizer(bits=config.bits, init=core, grad_scale=config.grad_scale)
        parametrize.register_parametrization(layer.cores, str(index), quantizer)


def _chain_left(cores: Sequence[torch.Tensor], quant: nn.Module | None) -> torch.Tensor:
    """``L`` (d_in, r) by merging cores left to right, fake-quantizing every partial product."""
    left = cores[0].reshape(cores[0].shape[1], cores[0].shape[2])  # (n_1, r_1)
    for core in cores[1:]:
        r, n, r_next = core.shape
        left = (left @ core.reshape(r, n * r_next)).reshape(-1, r_next)  # (n_1..n_k, r_k)
        left = quant(left) if quant is not None else left
    return left


def _chain_right(cores: Sequence[torch.Tensor], quant: nn.Module | None) -> torch.Tensor:
    """``R`` (r, d_out) by merging cores right to left, fake-quantizing every partial product."""
    right = cores[-1].reshape(cores[-1].shape[0], cores[-1].shape[1])  # (r_{last-1}, n_last)
    for core in reversed(cores[:-1]):
        r_prev, n, r = core.shape
        right = (core.reshape(r_prev * n, r) @ right).reshape(r_prev, -1)  # (r_prev, n_k..n_last)
        right = quant(right) if quant is not None else right
    return right


class ActivationQuantTT(nn.Module):
    """Forward of a (core-quantized) :class:`TTLinear` with the release's activation quantizers (mode 2).

    ``y = Q8(Q4(x) · L) · R + b`` with ``L``/``R`` built by chains whose partial products pass through one shared
    8-bit quantizer (``scale_intermediate``), as in ``utils_tensor_layers.py`` L128-208.
    """

    def __init__(self, layer: TTLinear, config: QATConfig) -> None:
        super().__init__()
        self.layer = layer
        self.quant_input = LearnedScaleQuantizer(bits=config.bits, grad_scale=config.grad_scale)
        self.quant_intermediate = LearnedScaleQuantizer(bits=config.bits_intermediate, grad_scale=config.grad_scale)
        self.quant_latent = LearnedScaleQuantizer(bits=config.bits_intermediate, grad_scale=config.grad_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d_in) -> (..., d_out)
        cores = self.layer.effective_cores()
        n_in = self.layer.n_in
        left = _chain_left(cores[:n_in], self.quant_intermediate)  # (d_in, r)
        right = _chain_right(cores[n_in:], self.quant_intermediate)  # (r, d_out)
        latent = self.quant_latent(self.quant_input(x) @ left)  # (..., r)
        out = latent @ right
        return out if self.layer.bias is None else out + self.layer.bias


def prepare_qat_(model: nn.Module, config: QATConfig) -> list[str]:
    """Turn every :class:`TTLinear` / :class:`TTEmbedding` of ``model`` into its QAT form, in place.

    Cores get a learnable-scale parametrization (``layer.parametrizations.cores``); in ``weight+activation``
    mode each TTLinear is also wrapped by :class:`ActivationQuantTT`. Returns the names of the layers touched.
    QAT is a family of :mod:`tensorslim.registry`: this is ``convert_(model, config)`` (``plan`` previews it,
    ``save_pretrained`` records it).

    Raises:
        ValueError: the model has no TT layer, or is in QAT form already.
    """
    from tensorslim.convert import convert_

    if not isinstance(config, QATConfig):
        raise TypeError(f"config of type {type(config).__name__} is invalid; allowed: QATConfig")
    return [layer.name for layer in convert_(model, config).layers]


def _in_qat_form(layer: nn.Module) -> bool:
    """A TT layer whose cores are fake-quantized (changed in place by :func:`prepare_qat_`)."""
    return isinstance(layer, TTLinear | TTEmbedding) and parametrize.is_parametrized(layer.cores)


def _select_tt(model: nn.Module, config: QATConfig) -> list[tuple[str, nn.Module]]:
    del config
    return [(name, m) for name, m in model.named_modules() if isinstance(m, TTLinear | TTEmbedding)]


def _check_tt(model: nn.Module, config: QATConfig, layers: list[tuple[str, nn.Module]]) -> None:
    del model, config
    if not layers:
        raise ValueError("prepare_qat_ found no TTLinear/TTEmbedding layer; convert_ the model with TTConfig first")
    quantized = [name for name, layer in layers if _in_qat_form(layer)]
    if quantized:
        raise ValueError(f"layers {quantized[:3]} are in QAT form already; allowed: prepare_qat_ a model once")


def _wraps_activations(layer: nn.Module, config: QATConfig) -> bool:
    return config.mode == "weight+activation" and isinstance(layer, TTLinear)


def _plan_qat(name: str, layer: TTLinear | TTEmbedding, config: QATConfig) -> LayerReport:
    """One learned scale per core, and three activation scales when the layer input is quantized too."""
    before = sum(p.numel() for p in layer.parameters())
    scales = len(layer.cores) + (3 if _wraps_activations(layer, config) else 0)
    linear = isinstance(layer, TTLinear)
    shape = (layer.in_features, layer.out_features) if linear else (layer.num_embeddings, layer.embedding_dim)
    return LayerReport(
        name=name,
        kind=type(layer).__name__,
        old_shape=shape,
        new_shape=f"{config.bits}-bit cores ({config.mode})",
        rank=max(layer.ranks),
        params_before=before,
        params_after=before + scales,
    )


def _build_qat(layer: TTLinear | TTEmbedding, config: QATConfig) -> nn.Module:
    _quantize_cores(layer, config)
    return ActivationQuantTT(layer, config) if _wraps_activations(layer, config) else layer


def _describe_qat(model: nn.Module, name: str, layer: nn.Module) -> tuple[QATConfig, dict]:
    """The widths read off the quantizers; the scales are parameters (in the weights file)."""
    del model, name
    tt = layer.layer if isinstance(layer, ActivationQuantTT) else layer
    core = tt.cores.parametrizations["0"][0]
    if isinstance(layer, ActivationQuantTT):
        config = QATConfig(
            mode="weight+activation",
            bits=core.bits,
            bits_intermediate=layer.quant_intermediate.bits,
            grad_scale=core.grad_scale,
        )
    else:
        config = QATConfig(mode="weight", bits=core.bits, grad_scale=core.grad_scale)
    return config, {}


def qat_bits(model: nn.Module, *, float_bits: int = 32) -> tuple[int, int]:
    """``(bits of the QAT model, bits of its parameters in float)``.

    Quantized cores count their code width per entry; every other parameter, the learned scales included, counts
    ``float_bits`` (the float baseline leaves the scales out, since a float model has none).
    """
    widths: dict[int, int] = {}
    scales: set[int] = set()
    for module in model.modules():
        if isinstance(module, LearnedScaleQuantizer):
            scales.add(id(module.scale))
        if parametrize.is_parametrized(module):
            for plist in module.parametrizations.values():
                widths[id(plist.original)] = plist[0].bits
    quantized = sum(p.numel() * widths.get(id(p), float_bits) for p in model.parameters())
    baseline = sum(p.numel() * float_bits for p in model.parameters() if id(p) not in scales)
    return quantized, baseline


register_transform(
    QATConfig,
    Transform(
        accepts=lambda module: isinstance(module, TTLinear | TTEmbedding),
        plan_layer=_plan_qat,
        build=_build_qat,
        layer_type=ActivationQuantTT,
        describe=_describe_qat,
        select=_select_tt,
        check=_check_tt,
        grows=True,
        wraps=("layer",),
        owns=_in_qat_form,
    ),
)
