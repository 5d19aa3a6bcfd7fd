"""One verb to restructure any model: ``convert_(model, config, filter_fn=None)``.

Modelled on torchao's ``quantize_``: the config is plain data, and a registry maps each config type to the transform
that plans and builds the replacement layer. A new layer family adds one line to :data:`TRANSFORMS` and, if it is a
trainable method, one line to :data:`METHODS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from torch import nn

from tensorslim.layers._source import is_dense_linear, linear_shape
from tensorslim.layers.cola_m import CoLAMConfig, CoLAMLinear, finalize_cola_m
from tensorslim.layers.lax import LaXCoLAConfig, LaXConfig, LaXLinear, LaXSVDConfig, finalize_lax, plan_lax
from tensorslim.layers.lax_tt import LaXTTConfig, LaXTTLinear, finalize_lax_tt, plan_lax_tt
from tensorslim.layers.lowrank import CoLAConfig, LowRankConfig, LowRankLinear, SVDConfig
from tensorslim.layers.tt import TTConfig, TTLinear, plan_tt_linear
from tensorslim.layers.tt_embedding import TTEmbedding, TTEmbeddingConfig, is_embedding, plan_tt_embedding

FilterFn = Callable[[nn.Module, str], bool]
T = TypeVar("T")


@dataclass(frozen=True)
class LayerReport:
    """What happens (or would happen) to one layer."""

    name: str
    kind: str  # type of the original module
    old_shape: tuple[int, int]  # (d_in, d_out)
    new_shape: str  # e.g. "768->192->768"
    rank: int
    params_before: int
    params_after: int


@dataclass
class ConversionReport:
    """Per-layer books of a conversion plus the whole model's parameter count before and after."""

    method: str
    layers: list[LayerReport] = field(default_factory=list)
    model_params_before: int = 0

    @property
    def params_before(self) -> int:
        return sum(layer.params_before for layer in self.layers)

    @property
    def params_after(self) -> int:
        return sum(layer.params_after for layer in self.layers)

    @property
    def model_params_after(self) -> int:
        return self.model_params_before - self.params_before + self.params_after

    def table(self) -> str:
        """A plain-text table, one row per converted layer plus totals."""
        rows = [f"{'layer':<48} {'kind':<10} {'shape':<22} {'rank':>5} {'params':>12} {'-> params':>12}"]
        for layer in self.layers:
            shape = f"{layer.old_shape[0]}->{layer.old_shape[1]}"
            rows.append(
                f"{layer.name:<48} {layer.kind:<10} {shape:<22} {layer.rank:>5} "
                f"{layer.params_before:>12,} {layer.params_after:>12,}"
            )
        rows.append(
            f"{len(self.layers)} layers converted with {self.method}: {self.params_before:,} -> "
            f"{self.params_after:,} params; model {self.model_params_before:,} -> {self.model_params_after:,}"
        )
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.table()


@dataclass(frozen=True)
class Transform:
    """How one config family plans and builds replacements.

    Attributes:
        accepts: whether a module is a candidate for this transform.
        plan_layer: the report row for a candidate, computed without building anything.
        build: the replacement module.
        finalize: optional model-level step after all layers are replaced.
    """

    accepts: Callable[[nn.Module], bool]
    plan_layer: Callable[[str, nn.Module, object], LayerReport]
    build: Callable[[nn.Module, object], nn.Module]
    finalize: Callable[[nn.Module, object, ConversionReport], None] | None = None


def _plan_low_rank(name: str, module: nn.Module, config: LowRankConfig) -> LayerReport:
    d_in, d_out = linear_shape(module)
    try:
        rank = config.resolve_rank(d_in, d_out)
    except ValueError as error:
        raise ValueError(f"layer {name!r}: {error}") from None
    has_bias = module.bias is not None
    return LayerReport(
        name=name,
        kind=type(module).__name__,
        old_shape=(d_in, d_out),
        new_shape=f"{d_in}->{rank}->{d_out}",
        rank=rank,
        params_before=d_in * d_out + (d_out if has_bias else 0),
        params_after=LowRankLinear.count_params(d_in, d_out, rank, bias=has_bias),
    )


def _drop_gate_activation(model: nn.Module, config: LowRankConfig, report: ConversionReport) -> None:
    """CoLA's ``only_lr_act``: gated MLPs whose projections became low rank lose their own activation (§2.2)."""
    if not config.only_lr_act:
        return
    converted = {layer.name for layer in report.layers}
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if hasattr(module, "act_fn") and f"{prefix}gate_proj" in converted and f"{prefix}up_proj" in converted:
            module.act_fn = nn.Identity()


TRANSFORMS: dict[type, Transform] = {
    LowRankConfig: Transform(is_dense_linear, _plan_low_rank, LowRankLinear.from_dense, _drop_gate_activation),
    CoLAMConfig: Transform(is_dense_linear, _plan_low_rank, CoLAMLinear.from_dense, finalize_cola_m),
    LaXConfig: Transform(is_dense_linear, plan_lax, LaXLinear.from_dense, finalize_lax),
    TTConfig: Transform(is_dense_linear, plan_tt_linear, TTLinear.from_dense),
    LaXTTConfig: Transform(is_dense_linear, plan_lax_tt, LaXTTLinear.from_dense, finalize_lax_tt),
    TTEmbeddingConfig: Transform(is_embedding, plan_tt_embedding, TTEmbedding.from_dense),
}

METHODS: dict[str, type] = {
    "cola": CoLAConfig,
    "svd": SVDConfig,
    "cola-m": CoLAMConfig,
    "lax-cola": LaXCoLAConfig,
    "lax-svd": LaXSVDConfig,
}


def registered_for(registry: dict[type, T], config: object, *, what: str) -> T:
    """The registry entry of ``config``'s class or its nearest registered base class."""
    for cls in type(config).__mro__:
        if cls in registry:
            return registry[cls]
    known = sorted(cls.__name__ for cls in registry)
    raise TypeError(f"config of type {type(config).__name__} has no registered {what}; known: {known}")


def _transform_for(config: object) -> Transform:
    return registered_for(TRANSFORMS, config, what="transform")


def output_head_ids(model: nn.Module, *, names: tuple[str, ...] = ("lm_head",)) -> set[int]:
    """Ids of the output head(s): modules called one of ``names`` and ``get_output_embeddings()``.

    They stay dense by default, as in CoLA (only the projections inside blocks are replaced).
    """
    heads = {id(module) for name, module in model.named_modules() if name.split(".")[-1] in names}
    get_head = getattr(model, "get_output_embeddings", None)
    if callable(get_head) and isinstance(get_head(), nn.Module):
        heads.add(id(get_head()))
    return heads


def _candidates(model: nn.Module, transform: Transform, filter_fn: FilterFn | None) -> list[tuple[str, nn.Module]]:
    heads = output_head_ids(model) if filter_fn is None else set()
    chosen = []
    for name, module in model.named_modules(remove_duplicate=True):
        if not transform.accepts(module) or id(module) in heads:
            continue
        if filter_fn is None or filter_fn(module, name):
            chosen.append((name, module))
    return chosen


def _count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def plan(model: nn.Module, config: object, *, filter_fn: FilterFn | None = None) -> ConversionReport:
    """What :func:`convert_` would do, without touching the model (works on ``meta``-device models).

    Args:
        model: any ``nn.Module``.
        config: a registered config, e.g. ``CoLAConfig()``.
        filter_fn: ``(module, qualified_name) -> bool``; when given, it alone decides which candidate layers are
            converted. When None, every candidate except the output head (``lm_head`` /
            ``get_output_embeddings()``) is converted.
    """
    transform = _transform_for(config)
    report = ConversionReport(method=type(config).__name__, model_params_before=_count_params(model))
    for name, module in _candidates(model, transform, filter_fn):
        report.layers.append(transform.plan_layer(name, module, config))
    return report


def _set_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def convert_(model: nn.Module, config: object, *, filter_fn: FilterFn | None = None) -> ConversionReport:
    """Replace the matching layers of ``model`` in place and return the report of :func:`plan`.

    All layers are planned (and validated) before the first one is replaced, so a bad config leaves the model
    untouched.
    """
    report = plan(model, config, filter_fn=filter_fn)
    transform = _transform_for(config)
    targets = dict(_candidates(model, transform, filter_fn))
    for layer in report.layers:
        _set_submodule(model, layer.name, transform.build(targets[layer.name], config))
    if transform.finalize is not None:
        transform.finalize(model, config, report)
    return report
