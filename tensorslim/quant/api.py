"""``quantize_(model, config, calibration, *, filter_fn=None)``: post-training weight quantization in place.

Modelled on :func:`tensorslim.convert.convert_` (and torchao's ``quantize_``): the config is plain data and
:data:`SOLVERS` maps each config type to the function that quantizes one ``(d_out, d_in)`` weight given its input
Gram matrix. All layers' Gram matrices are collected from the float model in one streaming pass (COMQ release
behaviour), every layer is solved, and only then are the layers replaced by :class:`QuantLinear` /
:class:`QuantConv2d` (factored layers by :class:`QuantLowRankLinear` / :class:`QuantTTLinear`, one quantized
matrix per factor), so an error leaves the model untouched.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from tensorslim.convert import output_head_ids
from tensorslim.layers.lowrank import LowRankLinear
from tensorslim.layers.tt import TTLinear
from tensorslim.quant.calibration import (
    SUPPORTED,
    GramStats,
    QuantTarget,
    check_quantizable,
    collect_grams,
    is_quantizable,
    quant_targets,
    relative_output_error,
)
from tensorslim.quant.comq import COMQConfig, comq_quantize
from tensorslim.quant.gptq import GPTQConfig, gptq_quantize
from tensorslim.quant.qlinear import (
    QuantConv2d,
    QuantEmbedding,
    QuantLinear,
    QuantLowRankLinear,
    QuantTTLinear,
    build_quant_layer,
)
from tensorslim.quant.quantizer import QuantConfig, QuantResult
from tensorslim.quant.rtn import RTNConfig, rtn_quantize
from tensorslim.registry import (
    LayerReport,
    Transform,
    register_transform,
    registered_for,
    set_submodule,
    unchanged_on_error,
)

FilterFn = Callable[[nn.Module, str], bool]
Solver = Callable[[torch.Tensor, torch.Tensor | None, QuantConfig], QuantResult]

SOLVERS: dict[type, Solver] = {
    RTNConfig: rtn_quantize,
    GPTQConfig: gptq_quantize,
    COMQConfig: comq_quantize,
}
METADATA_KEY = "tensorslim.quant"


@dataclass(frozen=True)
class QuantLayerReport:
    """One quantized matrix: a dense layer's weight or one factor of a factored layer.

    Attributes:
        name: the layer's name; a factor adds ``.A`` / ``.B`` (low rank) or ``.cores.k`` (TT).
        method: the solver used for this matrix (TT cores are always ``RTNConfig``: they have no input of their own).
        rel_output_error: ``‖X(W − Q)ᵀ‖_F / ‖XWᵀ‖_F`` on the calibration inputs of this matrix (for CoLA's ``B``,
            ``X = σ(A x)``); None without calibration or for a TT core.
        rel_weight_error: ``‖W − Q‖_F / ‖W‖_F``.
        seconds: time of the solver alone (Gram collection excluded; it is shared by all methods).
        bytes_before: float bytes of the matrix (plus the layer's bias on its last matrix).
        bytes_after: packed codes, scales and zero points (plus the bias on the last matrix); the rows of one layer
            sum to its ``storage_bytes()``.
        layer: the name of the layer the matrix belongs to (``name`` itself for a dense layer).
    """

    name: str
    kind: str
    shape: tuple[int, int]  # (d_in, d_out) of the weight matrix
    bits: int
    rows: int
    rel_output_error: float | None
    rel_weight_error: float
    seconds: float
    bytes_before: int
    bytes_after: int
    method: str = ""
    layer: str = ""


@dataclass
class QuantReport:
    method: str
    layers: list[QuantLayerReport] = field(default_factory=list)

    def table(self) -> str:
        rows = [f"{'layer':<44} {'shape':<12} {'bits':>4} {'out err':>9} {'w err':>8} {'s':>7} {'bytes':>20}"]
        for r in self.layers:
            err = f"{r.rel_output_error:.4f}" if r.rel_output_error is not None else "-"
            rows.append(
                f"{r.name:<44} {r.shape[0]}x{r.shape[1]:<7} {r.bits:>4} {err:>9} {r.rel_weight_error:>8.4f} "
                f"{r.seconds:>7.2f} {r.bytes_before:>9,}->{r.bytes_after:<9,}"
            )
        before, after = sum(r.bytes_before for r in self.layers), sum(r.bytes_after for r in self.layers)
        layers = len({r.layer for r in self.layers})
        notes = [f"{len(self.layers)} matrices"] if len(self.layers) != layers else []
        rtn = sum(r.method != self.method for r in self.layers)
        notes += [f"{rtn} TT cores or embeddings by RTNConfig: no layer input of their own"] if rtn else []
        note = f" ({'; '.join(notes)})" if notes else ""
        rows.append(f"{layers} layers quantized with {self.method}{note}: {before:,} -> {after:,} bytes")
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.table()

    def bytes_after(self) -> int:
        """Bytes of everything that was quantized, as stored (codes, scales, zero points, biases)."""
        return sum(r.bytes_after for r in self.layers)


def _solver_for(config: object) -> Solver:
    return registered_for(SOLVERS, config, what="quantizer")


def _output_head_ids(model: nn.Module) -> set[int]:
    """The output head stays float by default, as the COMQ release skips the classifier head (compress.md §1.4)."""
    return output_head_ids(model, names=("lm_head", "classifier"))


def select_layers(
    model: nn.Module, *, filter_fn: FilterFn | None = None, embeddings: bool = False
) -> dict[str, nn.Module]:
    """The layers :func:`quantize_` would replace.

    Without ``filter_fn``: every quantizable layer (dense, or CoLA/SVD ``LowRankLinear`` and ``TTLinear``) but the
    output head, and with ``embeddings`` the output head and every ``nn.Embedding`` too. With it: every module
    that owns a ``weight`` parameter, or is (a subclass of) one of those factored layers, and for which
    ``filter_fn(module, name)`` is true; each must be quantizable.

    Raises:
        TypeError: ``filter_fn`` chose a layer that cannot be quantized.
        ValueError: nothing to quantize.
    """
    chosen: dict[str, nn.Module] = {}
    if filter_fn is None:
        heads = set() if embeddings else _output_head_ids(model)
        chosen = {
            n: m
            for n, m in model.named_modules()
            if is_quantizable(m) and id(m) not in heads and (embeddings or not isinstance(m, nn.Embedding))
        }
    else:
        for name, module in model.named_modules():
            owns_weight = isinstance(module._parameters.get("weight"), torch.Tensor)
            # subclasses of the factored layers are candidates too, so that choosing one is a TypeError
            factored = isinstance(module, LowRankLinear | TTLinear)
            if (owns_weight or factored) and filter_fn(module, name):
                check_quantizable(module, name)
                chosen[name] = module
    if not chosen:
        raise ValueError(f"no layer to quantize: the model has no {SUPPORTED} chosen by filter_fn")
    return chosen


def _nbytes(tensors: Iterable[torch.Tensor | None]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _stored_matrices(layer: nn.Module) -> list[QuantLinear]:
    """The packed matrices of a quantized layer, in the order of :func:`quant_targets`."""
    if isinstance(layer, QuantLowRankLinear):
        return [layer.a, layer.b]
    if isinstance(layer, QuantTTLinear):
        return list(layer.cores)
    return [layer]


def _build(module: nn.Module, results: list[QuantResult]) -> QuantLinear | QuantLowRankLinear | QuantTTLinear:
    if isinstance(module, LowRankLinear):
        return QuantLowRankLinear.from_results(module, *results)
    if isinstance(module, TTLinear):
        return QuantTTLinear.from_results(module, results)
    return build_quant_layer(module, results[0])


def _layer_reports(
    name: str,
    module: nn.Module,
    new: nn.Module,
    solved: list[tuple[QuantTarget, QuantResult, GramStats | None, float, str]],
) -> list[QuantLayerReport]:
    """One row per matrix; a bias the packed matrices do not hold (TT) is booked on the last row."""
    rows = []
    stored = _stored_matrices(new)
    for k, ((target, result, stats, seconds, method), packed) in enumerate(zip(solved, stored, strict=True)):
        w = target.weight.to(torch.float64)
        q = result.dequantize(dtype=torch.float64)
        last = k == len(stored) - 1
        outside_bias = last and isinstance(new, QuantTTLinear)
        bias = getattr(module, "bias", None) if last else None
        rows.append(
            QuantLayerReport(
                name=target.name,
                kind=type(module).__name__,
                shape=(w.shape[1], w.shape[0]),
                bits=result.grid.bits,
                rows=stats.rows if stats else 0,
                rel_output_error=relative_output_error(w, q, stats.gram) if stats is not None else None,
                rel_weight_error=float(torch.linalg.norm(w - q) / torch.linalg.norm(w)),
                seconds=seconds,
                bytes_before=_nbytes([target.weight, bias]),
                bytes_after=packed.storage_bytes() + (_nbytes([new.bias]) if outside_bias else 0),
                method=method,
                layer=name,
            )
        )
    return rows


def quantize_(
    model: nn.Module, config: QuantConfig, calibration: Iterable[object] | None, *, filter_fn: FilterFn | None = None
) -> QuantReport:
    """Quantize the weights of ``model``'s linear/conv layers, and the factors of its factored layers, in place.

    Dense layers become :class:`QuantLinear` / :class:`QuantConv2d`. A CoLA/SVD ``LowRankLinear`` (arXiv 2502.10940
    §3) becomes a :class:`QuantLowRankLinear`: ``A`` is solved on the layer input ``x`` and ``B`` on ``σ(A x)``, both
    from the float model. A ``TTLinear`` (CoMERA, arXiv 2405.14377) becomes a :class:`QuantTTLinear` whose cores are
    rounded to nearest whatever the config: a core has no input of its own for GPTQ/COMQ to reconstruct (the report
    names the solver used for every matrix).

    Args:
        model: any ``nn.Module`` (our presets, Hugging Face models, a plain CNN, a converted model).
        config: :class:`RTNConfig`, :class:`GPTQConfig` or :class:`COMQConfig`.
        calibration: an iterable of model inputs (tensor, tuple of positionals, or a mapping of keywords such as
            a dict or a tokenizer's ``BatchEncoding``), streamed once; may be None for RTN only. It should be
            re-iterable only if you call ``quantize_`` again.
        filter_fn: ``(module, qualified_name) -> bool``; when given it alone decides which layers are quantized.

    Returns:
        Per-matrix errors (on the calibration inputs), solver times and storage.

    Raises:
        ValueError: no calibration for a data-aware method, empty calibration, nothing to quantize.
        TypeError: unknown config, or ``filter_fn`` chose a layer type that cannot be quantized.
    """
    solver = _solver_for(config)
    layers = select_layers(model, filter_fn=filter_fn, embeddings=config.embeddings)
    targets = {name: quant_targets(name, module) for name, module in layers.items()}
    with_inputs = {t.name: t for ts in targets.values() for t in ts if t.inputs is not None}
    if calibration is None and config.needs_calibration and with_inputs:
        raise ValueError(f"{type(config).__name__} needs calibration data; pass an iterable of model inputs")
    grams = collect_grams(model, with_inputs, calibration) if calibration is not None and with_inputs else {}
    rtn = RTNConfig(bits=config.bits, granularity=config.granularity)
    report = QuantReport(method=type(config).__name__)
    replacements = {}
    for name, module in layers.items():
        solved = []
        for target in targets[name]:
            stats = grams.get(target.name)
            solve, settings = (solver, config) if target.inputs is not None else (rtn_quantize, rtn)
            start = time.perf_counter()
            result = solve(target.weight, stats.gram if stats is not None else None, settings)
            solved.append((target, result, stats, time.perf_counter() - start, type(settings).__name__))
        new = _build(module, [result for _, result, *_ in solved])
        report.layers.extend(_layer_reports(name, module, new, solved))
        replacements[name] = new
    with unchanged_on_error(model):
        for name, new in replacements.items():
            set_submodule(model, name, new)
    return report


# --- storage -----------------------------------------------------------------------------------------------------


QUANT_LAYERS = (QuantLinear, QuantLowRankLinear, QuantTTLinear)  # QuantConv2d is a QuantLinear


def layer_spec(layer: QuantLinear | QuantLowRankLinear | QuantTTLinear) -> dict[str, object]:
    """The JSON-able layout of a quantized layer (kind, shapes, bits, bias) that :func:`quant_shell` rebuilds."""
    if isinstance(layer, QuantLowRankLinear):
        return {
            "kind": "lowrank",
            "in": layer.in_features,
            "out": layer.out_features,
            "rank": layer.rank,
            "activation": layer.activation,
            "bits": layer.bits,
            "bias": layer.bias is not None,
        }
    if isinstance(layer, QuantTTLinear):
        return {
            "kind": "tt",
            "in_factors": list(layer.in_factors),
            "out_factors": list(layer.out_factors),
            "ranks": list(layer.ranks),
            "bits": layer.bits,
            "bias": layer.bias is not None,
        }
    spec: dict[str, object] = {
        "in": layer.in_features,
        "out": layer.out_features,
        "bits": layer.bits,
        "bias": layer.bias is not None,
    }
    if isinstance(layer, QuantEmbedding):
        spec["kind"] = "embedding"
    elif isinstance(layer, QuantConv2d):
        spec.update(
            kind="conv2d",
            in_channels=layer.in_channels,
            kernel_size=layer.kernel_size,
            stride=layer.stride,
            padding=layer.padding,
            dilation=layer.dilation,
        )
    else:
        spec["kind"] = "linear"
    return spec


def save_quantized(model: nn.Module, path: str | Path) -> int:
    """Write ``model``'s state (packed codes, scales, everything else) to a safetensors file.

    The layout of every quantized layer goes into the header metadata, so :func:`load_quantized` can rebuild the
    shells on a float model of the same architecture. Returns the size of the file in bytes.
    """
    from safetensors.torch import save_model

    specs: dict[str, dict[str, object]] = {}
    for name, module in model.named_modules():  # parents first: a factored layer's matrices are not listed again
        inside = any(name.startswith(f"{outer}.") for outer in specs)
        if isinstance(module, QUANT_LAYERS) and not inside:
            specs[name] = layer_spec(module)
    save_model(model, str(path), metadata={METADATA_KEY: json.dumps(specs)})
    return Path(path).stat().st_size


def quant_shell(spec: dict, dtype: torch.dtype) -> QuantLinear | QuantLowRankLinear | QuantTTLinear:
    """An empty quantized layer of the layout :func:`layer_spec` wrote, ready for its state dict."""
    if spec["kind"] == "lowrank":
        return QuantLowRankLinear(
            spec["in"],
            spec["out"],
            spec["rank"],
            bits=spec["bits"],
            activation=spec["activation"],
            bias=spec["bias"],
            dtype=dtype,
        )
    if spec["kind"] == "tt":
        return QuantTTLinear(
            tuple(spec["in_factors"]),
            tuple(spec["out_factors"]),
            tuple(spec["ranks"]),
            bits=spec["bits"],
            bias=spec["bias"],
            dtype=dtype,
        )
    if spec["kind"] == "embedding":
        return QuantEmbedding(spec["out"], spec["in"], bits=spec["bits"], dtype=dtype)
    if spec["kind"] == "conv2d":
        return QuantConv2d(
            spec["in_channels"],
            spec["out"],
            tuple(spec["kernel_size"]),
            bits=spec["bits"],
            stride=tuple(spec["stride"]),
            padding=tuple(spec["padding"]),
            dilation=tuple(spec["dilation"]),
            bias=spec["bias"],
            dtype=dtype,
        )
    return QuantLinear(spec["in"], spec["out"], bits=spec["bits"], bias=spec["bias"], dtype=dtype)


def load_quantized(model: nn.Module, path: str | Path) -> nn.Module:
    """Replace the layers named in ``path``'s metadata by quantized shells and load the file into ``model``.

    Loading never unpickles (safetensors). ``model`` must have the architecture that was saved.
    """
    from safetensors import safe_open
    from safetensors.torch import load_model

    with safe_open(str(path), framework="pt") as handle:
        raw = (handle.metadata() or {}).get(METADATA_KEY)
    if raw is None:
        raise ValueError(f"{path} has no {METADATA_KEY!r} metadata; was it written by save_quantized?")
    dtype = next(model.parameters()).dtype
    for name, spec in json.loads(raw).items():
        set_submodule(model, name, quant_shell(spec, dtype))
    load_model(model, str(path))
    return model


# --- the registry family: convert_(model, RTNConfig(bits=4)) ------------------------------------------------------


def _convertible(module: nn.Module) -> bool:
    """What ``convert_`` quantizes: the quantizable layers but token tables (``quantize_`` with ``embeddings=True``)."""
    return is_quantizable(module) and not isinstance(module, nn.Embedding)


def _plan_quant_layer(name: str, module: nn.Module, config: QuantConfig) -> LayerReport:
    """The books of one layer quantized in place of its float weights; nothing is solved yet.

    Only round to nearest runs layer by layer without data: GPTQ and COMQ need the calibration inputs of
    :func:`quantize_`, which this path refuses with a one-line error before the model is touched.
    """
    if config.needs_calibration:
        raise ValueError(
            f"{type(config).__name__} needs calibration data; allowed: RTNConfig with convert_, or "
            "quantize_(model, config, calibration)"
        )
    if config.embeddings:
        raise ValueError("embeddings=True is for quantize_; allowed with convert_: embeddings=False")
    targets = quant_targets(name, module)
    bias = getattr(module, "bias", None)
    return LayerReport(
        name=name,
        kind=type(module).__name__,
        old_shape=(targets[0].weight.shape[1], targets[-1].weight.shape[0]),
        new_shape=f"{config.bits}-bit codes",
        rank=0,
        params_before=sum(p.numel() for p in module.parameters()),
        params_after=bias.numel() if isinstance(bias, nn.Parameter) else 0,  # codes and scales are buffers
    )


def _build_quant_layer(module: nn.Module, config: QuantConfig) -> nn.Module:
    rtn = RTNConfig(bits=config.bits, granularity=config.granularity)
    return _build(module, [rtn_quantize(target.weight, None, rtn) for target in quant_targets("", module)])


def _describe_quant_layer(model: nn.Module, name: str, layer: nn.Module) -> tuple[RTNConfig, dict[str, object]]:
    """Codes carry no trace of their solver: the config names the width, the state the layout and the dtype of the
    scales (what :func:`_shell` rebuilds)."""
    del model, name
    dtype = next(t.dtype for t in layer.state_dict().values() if t.is_floating_point())
    return RTNConfig(bits=layer.bits), {**layer_spec(layer), "dtype": str(dtype).removeprefix("torch.")}


def _shell(state: dict) -> nn.Module:
    """An empty quantized layer of the recorded layout (also as the first manifests recorded a dense, conv or
    embedding layer: ``in_features``/``out_features`` and no ``kind``)."""
    if "kind" not in state:
        kind = "embedding" if state.get("embedding") else "conv2d" if "kernel_size" in state else "linear"
        state = {**state, "kind": kind, "in": state["in_features"], "out": state["out_features"]}
    return quant_shell(state, getattr(torch, state["dtype"]))


register_transform(
    QuantConfig,
    Transform(
        accepts=_convertible,
        plan_layer=_plan_quant_layer,
        build=_build_quant_layer,
        layer_type=QUANT_LAYERS,
        describe=_describe_quant_layer,
        shell=_shell,
    ),
)
