"""One verb to restructure any model: ``convert_(model, config, filter_fn=None)``.

Modelled on torchao's ``quantize_``: the config is plain data, and :mod:`tensorslim.registry` maps each config type
to the transform that plans and builds the replacement layer. Layer families register themselves, so this module
imports none of them: a config object exists only once its family's module is imported, which registers it.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from tensorslim._checks import require_module
from tensorslim.functional.threads import one_thread
from tensorslim.registry import (
    TRANSFORMS,
    ConversionReport,
    Transform,
    set_submodule,
    transform_for,
    unchanged_on_error,
)

FilterFn = Callable[[nn.Module, str], bool]


# Output heads of common Hugging Face and tensorslim models: a module under one of these names stays dense by default.
HEAD_NAMES = ("lm_head", "classifier", "score", "qa_outputs", "cls", "seq_relationship", "head")
# A rank derived from ``rank_ratio`` below this (e.g. 1 for a 384 -> 2 classifier) is no bottleneck but a loss.
MIN_RATIO_RANK = 8


def output_head_ids(model: nn.Module, *, names: tuple[str, ...] = HEAD_NAMES) -> set[int]:
    """Ids of the output heads: modules with a name component in ``names``, and ``get_output_embeddings()``.

    They stay dense by default, as in CoLA (only the projections inside blocks are replaced).
    """
    heads = {id(module) for name, module in model.named_modules() if set(name.split(".")) & set(names)}
    get_head = getattr(model, "get_output_embeddings", None)
    if callable(get_head) and isinstance(get_head(), nn.Module):
        heads.add(id(get_head()))
    return heads


def _candidates(
    model: nn.Module,
    transform: Transform,
    config: object,
    filter_fn: FilterFn | None,
    skipped: list[tuple[str, str]] | None = None,
) -> list[tuple[str, nn.Module]]:
    if transform.select is not None:  # the config names its layers
        return [
            (name, module)
            for name, module in transform.select(model, config)
            if filter_fn is None or filter_fn(module, name)
        ]
    heads = output_head_ids(model) if filter_fn is None else set()
    targets = None
    if filter_fn is None and transform.default_targets is not None:
        targets = {id(module) for module in transform.default_targets(model)}
    chosen = []
    for name, module in model.named_modules(remove_duplicate=True):
        if not transform.accepts(module):
            continue
        if id(module) in heads:
            if skipped is not None:
                skipped.append((name, "output head"))
        elif targets is not None and id(module) not in targets:
            if skipped is not None:
                skipped.append((name, "not a default target of this layer family"))
        elif filter_fn is None or filter_fn(module, name):
            chosen.append((name, module))
    return chosen


def _count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _plan(
    model: nn.Module, config: object, filter_fn: FilterFn | None, allow_larger: bool
) -> tuple[ConversionReport, Transform, dict[str, object]]:
    """The report of :func:`plan`, the transform, and the config each planned layer is built with."""
    require_module(model)
    transform = transform_for(config)
    if filter_fn is not None and not callable(filter_fn):
        raise TypeError(f"filter_fn of type {type(filter_fn).__name__} is invalid; allowed: (module, name) -> bool")
    if not isinstance(allow_larger, bool):
        raise TypeError(f"allow_larger={allow_larger!r} is invalid; allowed: True or False")
    report = ConversionReport(
        method=type(config).__name__,
        model_params_before=_count_params(model),
        model_trainable_before=sum(p.numel() for p in model.parameters() if p.requires_grad),
        freezes=transform.freezes,
    )
    candidates = _candidates(model, transform, config, filter_fn, report.skipped)
    budget = getattr(config, "budget", None)
    layer_configs = dict.fromkeys((name for name, _ in candidates), config)
    if budget is not None:
        if transform.allocate is None:
            allowed = sorted(cls.__name__ for cls, known in TRANSFORMS.items() if known.allocate is not None)
            raise ValueError(f"budget= is not supported for {type(config).__name__}; allowed: {allowed}")
        if not candidates:
            raise ValueError(f"budget={budget!r} has no layer to spend it on; allowed: a model with candidate layers")
        with one_thread():  # the decompositions behind an allocation: see convert_
            allocation = transform.allocate(model, candidates, config)
        layer_configs, report.budget = allocation.configs, allocation.use
    # A budget already chose every rank within its limit; dropping a layer afterwards would misstate the books.
    ratio_rank = budget is None and getattr(config, "rank", 0) is None and hasattr(config, "rank_ratio")
    for name, module in candidates:
        layer = transform.plan_layer(name, module, layer_configs[name])
        if filter_fn is None and ratio_rank and layer.rank < MIN_RATIO_RANK:
            report.skipped.append((name, f"rank {layer.rank} from rank_ratio is below {MIN_RATIO_RANK}"))
            continue
        # A budget's allocation spends what the user granted, layer by layer; a rank the user chose must pay off.
        if layer.params_after > layer.params_before and budget is None and not allow_larger and not transform.grows:
            raise ValueError(
                f"layer {name!r}: {type(config).__name__} makes it larger than dense ({layer.params_after:,} > "
                f"{layer.params_before:,} params); allowed: a smaller rank, or allow_larger=True"
            )
        report.layers.append(layer)
    if transform.check is not None:
        transform.check(model, config, candidates)
    if transform.freezes and transform.keeps_trainable is not None:
        report.kept_trainable = sum(p.numel() for p in transform.keeps_trainable(model, config))
    return report, transform, layer_configs


def plan(
    model: nn.Module, config: object, *, filter_fn: FilterFn | None = None, allow_larger: bool = False
) -> ConversionReport:
    """What :func:`convert_` would do, without touching the model (works on ``meta``-device models).

    Args:
        model: any ``nn.Module``.
        config: a registered config, e.g. ``CoLAConfig()``. A config with a ``budget`` (e.g.
            ``SVDConfig(budget=Budget(params=0.5))``) first has its family's ``allocate`` pre-pass choose one rank
            per candidate layer so that the converted layers fit the budget; ``report.budget`` holds the books.
        filter_fn: ``(module, qualified_name) -> bool``; when given, it alone decides which candidate layers are
            converted. When None, every candidate is converted except the output heads (a name component in
            :data:`HEAD_NAMES`, or ``get_output_embeddings()``) and layers whose rank, derived from
            ``rank_ratio``, would fall below :data:`MIN_RATIO_RANK`; ``report.skipped`` lists them and why.
        allow_larger: convert a layer even where the config's rank makes it larger than the dense layer (more
            parameters); by default that is refused, since it costs memory and compute for no saving. A budgeted
            config is not refused: its allocation keeps the converted layers within the budget as a whole.

    Raises:
        TypeError: no transform is registered for ``config``'s type.
        ValueError: the config does not fit a candidate layer or makes it larger than dense (the message names the
            layer), or its budget cannot be met or is not supported by its family.
    """
    return _plan(model, config, filter_fn, allow_larger)[0]


def convert_(
    model: nn.Module, config: object, *, filter_fn: FilterFn | None = None, allow_larger: bool = False
) -> ConversionReport:
    """Replace the matching layers of ``model`` in place and return the report of :func:`plan`.

    All layers are planned (and validated) before the first one is replaced, so a bad config leaves the model
    untouched; a layer that still refuses while it is built has every change undone (:func:`unchanged_on_error`).
    With a budgeted config each layer is built with the rank the plan chose for it.

    The layers are built on one thread: their decompositions (SVD, TT-SVD, Cholesky) of layer-sized matrices gain
    little from more, and where other processes keep the cores busy, OpenMP threads that spin-wait for each other
    made the 37 SVDs of MiniLM 14x slower at two threads than at one (72 s against 5 s).
    """
    from tqdm.auto import tqdm

    report, transform, layer_configs = _plan(model, config, filter_fn, allow_larger)
    targets = dict(_candidates(model, transform, config, filter_fn))
    with unchanged_on_error(model), one_thread():
        if transform.prepare is not None:
            transform.prepare(model, config)
        for layer in tqdm(report.layers, desc=f"convert ({report.method})", unit="layer", leave=False, disable=None):
            new = transform.replacement(model, layer.name, targets[layer.name], layer_configs[layer.name])
            set_submodule(model, layer.name, new)
        if transform.finalize is not None:
            transform.finalize(model, config, report)
    report.applied = True
    return report
