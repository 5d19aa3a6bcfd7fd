"""One verb to restructure any model: ``convert_(model, config, filter_fn=None)``.

Modelled on torchao's ``quantize_``: the config is plain data, and :mod:`tensorslim.registry` maps each config type
to the transform that plans and builds the replacement layer. Layer families register themselves, so this module
imports none of them: a config object exists only once its family's module is imported, which registers it.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from tensorslim.registry import ConversionReport, Transform, set_submodule, transform_for

FilterFn = Callable[[nn.Module, str], bool]


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

    Raises:
        TypeError: no transform is registered for ``config``'s type.
        ValueError: the config does not fit a candidate layer (the message names the layer).
    """
    transform = transform_for(config)
    report = ConversionReport(method=type(config).__name__, model_params_before=_count_params(model))
    for name, module in _candidates(model, transform, filter_fn):
        report.layers.append(transform.plan_layer(name, module, config))
    return report


def convert_(model: nn.Module, config: object, *, filter_fn: FilterFn | None = None) -> ConversionReport:
    """Replace the matching layers of ``model`` in place and return the report of :func:`plan`.

    All layers are planned (and validated) before the first one is replaced, so a bad config leaves the model
    untouched.
    """
    report = plan(model, config, filter_fn=filter_fn)
    transform = transform_for(config)
    targets = dict(_candidates(model, transform, filter_fn))
    for layer in report.layers:
        set_submodule(model, layer.name, transform.build(targets[layer.name], config))
    if transform.finalize is not None:
        transform.finalize(model, config, report)
    return report
