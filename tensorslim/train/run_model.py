"""The model a run ends with: ``<run>/model/``, a :func:`tensorslim.pretrained.save_pretrained` folder that
:func:`tensorslim.load_pretrained` reads, with what a predictor needs beside it (the task, its label names, the
tokenizer) so that :func:`tensorslim.predict.predictor` answers from the folder alone.

Most runs are saved as their training method builds them (:class:`~tensorslim.pretrained.MethodBase`: adapters,
prompts, memory and converted layers alike); a method that reshapes the model while it trains (CoMERA's rank
truncation) is saved as a registered base plus a description of every converted layer. Each candidate is checked
by building it on ``meta``: the folder is written only in a form whose parameters match the trained model's.

On a pretrained base, the folder holds what training changed (adapters, prompts, the new head) and names the base
(the registered model and the method that builds it); the base's own tensors are left to it, with their SHA-256, when
they are most of the model. A base initialised at random is part of what the run made: its folder holds every tensor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tensorslim.methods.build import build_from_record
from tensorslim.pretrained import (
    RUN_MODEL,
    MethodBase,
    RegisteredBase,
    _base_record,
    _build_base,
    describe_layers,
    rebuild_layers,
    save_pretrained,
)

TOKENIZER = "tokenizer.json"


def _shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def _rebuilds(model: nn.Module, base: MethodBase | RegisteredBase) -> bool:
    """Whether the folder's recipe for ``model`` (``base``, and its described layers) rebuilds its exact tensors."""
    try:
        record = _base_record(model, base)
        built = (
            build_from_record(record, device="meta")
            if isinstance(base, MethodBase)
            else _build_base(record, Path("."), None)
        )
        if isinstance(base, RegisteredBase):
            rebuild_layers(built, describe_layers(model))
    except Exception:  # a recipe that cannot even be built does not describe the model
        return False
    return _shapes(built) == _shapes(model)


def _save_tokenizer(tokenizer: Any, folder: Path) -> str | None:
    """Write the run's tokenizer into ``folder`` (a ``tokenizer.json`` and its eos token); the file name, or None."""
    if tokenizer is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    backend = getattr(tokenizer, "backend", None)
    if hasattr(backend, "to_str"):  # our TextTokenizer over a `tokenizers.Tokenizer`
        backend.save(str(folder / TOKENIZER))
        eos = backend.id_to_token(tokenizer.eos_id)
        (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": eos}) + "\n")
        return TOKENIZER
    # A transformers tokenizer, bare or in our TextTokenizer: its own files.
    (tokenizer if hasattr(tokenizer, "save_pretrained") else backend).save_pretrained(str(folder))
    return "."


def save_run_model(
    model: nn.Module,
    run_dir: str | Path,
    config: Any,
    *,
    overrides: dict[str, Any],
    tokenizer: Any = None,
    labels: list[str] | None = None,
) -> Path:
    """Write ``<run_dir>/model/`` for the trained ``model`` of the run ``config`` (a :class:`TrainConfig`).

    Args:
        model: the trained model (unwrapped: no parallel layout).
        run_dir: the run folder.
        config: the run's config.
        overrides: what the run's data fixed in the model (``TaskData.model_overrides``).
        tokenizer: the run's :class:`~tensorslim.data.tokenizer.TextTokenizer`, if the task has one.
        labels: the class names of a classifier, in logit order.

    Raises:
        ValueError: neither recipe rebuilds the trained model's tensors.
    """
    import dataclasses

    options = dataclasses.asdict(config.options)
    candidates: list[MethodBase | RegisteredBase] = [
        MethodBase(
            name=config.preset, method=config.method, task=config.model_task, options=options, overrides=dict(overrides)
        )
    ]
    known = {key: overrides[key] for key in ("vocab_size", "max_seq_len", "n_classes") if key in overrides}
    if set(known) == set(overrides):
        candidates.append(RegisteredBase(name=config.preset, task=config.model_task, **known))
    base = next((candidate for candidate in candidates if _rebuilds(model, candidate)), None)
    if base is None:
        raise ValueError(
            f"the trained {config.method} model of {config.preset} cannot be described for save_pretrained "
            "(its structure differs from what its method builds); its checkpoint holds the weights"
        )
    folder = Path(run_dir) / RUN_MODEL
    run = {
        "task": config.task,
        "model_task": config.model_task,
        "seq_len": config.seq_len,
        "labels": labels,
        "tokenizer": _save_tokenizer(tokenizer, folder),
        "task_options": dataclasses.asdict(config.task_options),
    }
    return save_pretrained(model, folder, base=base, run=run, reference=_pretrained_reference(base))


def _pretrained_reference(base: MethodBase | RegisteredBase) -> nn.Module | None:
    """The model as ``load_pretrained`` rebuilds it from ``base``, pretrained weights included; None for a base that
    rebuilds no weights (a preset initialised at random, or a structure rebuilt on ``meta``)."""
    from tensorslim.models.registry import get_model

    if not isinstance(base, MethodBase) or not get_model(base.name).pretrained:
        return None
    with torch.random.fork_rng(devices=[]):  # the adapters' fresh init leaves the run's random stream alone
        return build_from_record(_base_record(nn.Module(), base))
