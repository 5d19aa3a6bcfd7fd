"""Build a registered model and restructure it for a training method."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tensorslim.methods.registry import MethodContext, get_method
from tensorslim.options import resolve_options


def method_options(method: str, options: Any = None) -> Any:
    """``method``'s options from ``options`` (see :func:`tensorslim.options.resolve_options`)."""
    return resolve_options(get_method(method).options, options, owner=f"method {method!r}")


def build_for_method(
    model_name: str,
    method: str,
    *,
    task: str | None = None,
    options: Any = None,
    device: torch.device | str | None = None,
    steps: int = 0,
    run_dir: Any = None,
    **overrides: Any,
) -> tuple[nn.Module, list, MethodContext]:
    """Model ``model_name`` built for ``task`` and converted by ``method``.

    Args:
        model_name: a registered model (:func:`tensorslim.models.registry.get_model`).
        method: a registered method (:func:`get_method`).
        task: the head to build (default: the model family's first task).
        options: the method's options, or a mapping of some of their fields (default: its defaults).
        device: ``"meta"`` builds without allocating (for the books).
        steps, run_dir: passed to the method's hook through the returned context.
        overrides: ``vocab_size``, ``max_seq_len``, ``n_classes`` for the model.

    Returns:
        ``(model, conversion reports, context)``.
    """
    from tensorslim.models.registry import build_model, get_model, resolve_task

    preset = get_model(model_name)
    task = resolve_task(model_name, task)
    options = method_options(method, options)
    added = get_method(method).positions
    if added is not None and overrides.get("max_seq_len") and not preset.pretrained:
        # A pretrained model's position table is fixed (the prompt's check names the limit); a new one has room.
        overrides = {**overrides, "max_seq_len": overrides["max_seq_len"] + added(options)}
    model = build_model(model_name, task=task, device=device, **overrides)
    context = MethodContext(
        model_name=model_name,
        family=preset.family.name,
        model_config=getattr(model, "config", preset.config),
        task=task,
        options=options,
        # On meta there are no weights to factorize; a random init has the same shapes (the books are the same).
        pretrained=preset.pretrained and torch.device(device or "cpu").type != "meta",
        steps=steps,
        run_dir=run_dir,
    )
    return model, apply_method(model, method, context), context


def apply_method(model: nn.Module, method: str, context: MethodContext) -> list:
    """Restructure ``model`` in place as ``method`` does (nothing for full-rank methods); the conversion reports."""
    spec = get_method(method)
    if spec.families is not None and context.family not in spec.families:
        raise ValueError(f"method={method!r} does not apply to {context.family} models; allowed: {list(spec.families)}")
    return spec.convert(model, context) if spec.convert is not None else []
