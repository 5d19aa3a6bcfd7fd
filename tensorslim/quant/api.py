"""``quantize_(model, config, calibration, *, filter_fn=None)``: post-training weight quantization in place.

Modelled on :func:`tensorslim.convert.convert_` (and torchao's ``quantize_``): the config is plain data and
:data:`SOLVERS` maps each config type to the function that quantizes one ``(d_out, d_in)`` weight given its input
Gram matrix. All layers' Gram matrices are collected from the float model in one streaming pass (COMQ release
behaviour), every layer is solved, and only then are the layers replaced by :class:`QuantLinear` /
:class:`QuantConv2d`, so an error leaves the model untouched.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from tensorslim.convert import output_head_ids
from tensorslim.quant.calibration import (
    check_quantizable,
    collect_grams,
    is_quantizable,
    relative_output_error,
    weight_matrix,
)
from tensorslim.quant.comq import COMQConfig, comq_quantize
from tensorslim.quant.gptq import GPTQConfig, gptq_quantize
from tensorslim.quant.qlinear import QuantConv2d, QuantLinear, build_quant_layer
from tensorslim.quant.quantizer import QuantConfig, QuantResult
from tensorslim.quant.rtn import RTNConfig, rtn_quantize
from tensorslim.registry import registered_for

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
    """One quantized layer.

    Attributes:
        rel_output_error: ``‖X(W − Q)ᵀ‖_F / ‖XWᵀ‖_F`` on the calibration inputs (None without calibration).
        rel_weight_error: ``‖W − Q‖_F / ‖W‖_F``.
        seconds: time of the solver alone (Gram collection excluded; it is shared by all methods).
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
        rows.append(f"{len(self.layers)} layers quantized with {self.method}: {before:,} -> {after:,} bytes")
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.table()


def _solver_for(config: object) -> Solver:
    return registered_for(SOLVERS, config, what="quantizer")


def _output_head_ids(model: nn.Module) -> set[int]:
    """The output head stays float by default, as the COMQ release skips the classifier head (compress.md §1.4)."""
    return output_head_ids(model, names=("lm_head", "classifier"))


def select_layers(model: nn.Module, *, filter_fn: FilterFn | None = None) -> dict[str, nn.Module]:
    """The layers :func:`quantize_` would replace.

    Without ``filter_fn``: every quantizable layer but the output head. With it: every module that owns a
    ``weight`` parameter and for which ``filter_fn(module, name)`` is true; each must be quantizable.

    Raises:
        TypeError: ``filter_fn`` chose a layer that cannot be quantized.
        ValueError: nothing to quantize.
    """
    chosen: dict[str, nn.Module] = {}
    if filter_fn is None:
        heads = _output_head_ids(model)
        chosen = {n: m for n, m in model.named_modules() if is_quantizable(m) and id(m) not in heads}
    else:
        for name, module in model.named_modules():
            if isinstance(module._parameters.get("weight"), torch.Tensor) and filter_fn(module, name):
                check_quantizable(module, name)
                chosen[name] = module
    if not chosen:
        raise ValueError("no layer to quantize: the model has no nn.Linear/Conv1D/Conv2d chosen by filter_fn")
    return chosen


def _set_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def _layer_report(
    name: str,
    module: nn.Module,
    result: QuantResult,
    gram: torch.Tensor | None,
    rows: int,
    seconds: float,
    new: QuantLinear,
) -> QuantLayerReport:
    w = weight_matrix(module).to(torch.float64)
    q = result.dequantize(dtype=torch.float64)
    out_err = relative_output_error(w, q, gram) if gram is not None else None
    params = [p for p in module.parameters(recurse=False)]
    return QuantLayerReport(
        name=name,
        kind=type(module).__name__,
        shape=(w.shape[1], w.shape[0]),
        bits=result.grid.bits,
        rows=rows,
        rel_output_error=out_err,
        rel_weight_error=float(torch.linalg.norm(w - q) / torch.linalg.norm(w)),
        seconds=seconds,
        bytes_before=sum(p.numel() * p.element_size() for p in params),
        bytes_after=new.storage_bytes(),
    )


def quantize_(
    model: nn.Module, config: QuantConfig, calibration: Iterable[object] | None, *, filter_fn: FilterFn | None = None
) -> QuantReport:
    """Quantize the weights of ``model``'s linear/conv layers in place.

    Args:
        model: any ``nn.Module`` (our presets, Hugging Face models, a plain CNN).
        config: :class:`RTNConfig`, :class:`GPTQConfig` or :class:`COMQConfig`.
        calibration: an iterable of model inputs (tensor, tuple of positionals, or a mapping of keywords such as
            a dict or a tokenizer's ``BatchEncoding``), streamed once; may be None for RTN only. It should be
            re-iterable only if you call ``quantize_`` again.
        filter_fn: ``(module, qualified_name) -> bool``; when given it alone decides which layers are quantized.

    Returns:
        Per-layer errors (on the calibration inputs), solver times and storage.

    Raises:
        ValueError: no calibration for a data-aware method, empty calibration, nothing to quantize.
        TypeError: unknown config, or ``filter_fn`` chose a layer type that cannot be quantized.
    """
    solver = _solver_for(config)
    layers = select_layers(model, filter_fn=filter_fn)
    if calibration is None and config.needs_calibration:
        raise ValueError(f"{type(config).__name__} needs calibration data; pass an iterable of model inputs")
    grams = collect_grams(model, layers, calibration) if calibration is not None else {}
    report = QuantReport(method=type(config).__name__)
    replacements = {}
    for name, module in layers.items():
        stats = grams.get(name)
        gram = stats.gram if stats is not None else None
        start = time.perf_counter()
        result = solver(weight_matrix(module), gram, config)
        seconds = time.perf_counter() - start
        new = build_quant_layer(module, result)
        report.layers.append(_layer_report(name, module, result, gram, stats.rows if stats else 0, seconds, new))
        replacements[name] = new
    for name, new in replacements.items():
        _set_submodule(model, name, new)
    return report


# --- storage -----------------------------------------------------------------------------------------------------


def _layer_spec(layer: QuantLinear) -> dict[str, object]:
    spec: dict[str, object] = {
        "in": layer.in_features,
        "out": layer.out_features,
        "bits": layer.bits,
        "bias": layer.bias is not None,
    }
    if isinstance(layer, QuantConv2d):
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

    specs = {name: _layer_spec(m) for name, m in model.named_modules() if isinstance(m, QuantLinear)}
    save_model(model, str(path), metadata={METADATA_KEY: json.dumps(specs)})
    return Path(path).stat().st_size


def _shell(spec: dict, dtype: torch.dtype) -> QuantLinear:
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
        _set_submodule(model, name, _shell(spec, dtype))
    load_model(model, str(path))
    return model


def config_summary(config: QuantConfig) -> dict[str, object]:
    return {"method": type(config).__name__, **asdict(config)}
