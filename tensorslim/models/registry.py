"""The one registry of model families and named models: ``--model NAME`` everywhere.

A :class:`ModelFamily` knows how to build one architecture (LLaMA, our BERT, GPT-2, Hugging Face's BERT) for the
tasks it has heads for; a :class:`ModelPreset` is a named shape of a family (``tiny``, ``bert6``, ``gpt2-small`` ...)
and, for a pretrained model, where its weights and tokenizer lie on disk. Presets hold shapes only: the learning
rates and ranks that papers pair with a size are method recipes (:mod:`tensorslim.methods`).

Each family module registers its presets with :func:`register_model`, or a table of them with
:func:`register_presets`; importing :mod:`tensorslim.models` registers them all. This module imports none of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tensorslim._checks import look_up, register_once

# What a model can be built for: causal LM (logits (B, T, V)), masked LM (logits (B, T, V)), sequence
# classification (logits (B, n_classes)), sentence embedding (the bare encoder's hidden states) and image
# segmentation (logits (B, 1, H, W)).
TASKS = ("lm", "mlm", "classify", "embed", "segment")


@dataclass(frozen=True, kw_only=True)
class ModelFamily:
    """One architecture and how to build it.

    Attributes:
        name: ``llama``, ``bert``, ``gpt2``, ``hf-bert`` ...
        tasks: the tasks it has heads for, the default first.
        build: ``build(config, *, task) -> nn.Module``, freshly initialised; called under the target
            ``torch.device`` context, so ``"meta"`` allocates nothing.
        head_names: qualified names of the output heads (over all its tasks) that a default conversion keeps
            dense; a name absent from a built model (another task's head) is ignored.
        load: ``load(config, *, task, folder) -> nn.Module`` with the trained weights of ``folder`` (on the CPU);
            None for families trained only from scratch.
    """

    name: str
    tasks: tuple[str, ...]
    build: Callable[..., nn.Module]
    head_names: tuple[str, ...] = ()
    load: Callable[..., nn.Module] | None = None

    def __post_init__(self) -> None:
        unknown = [task for task in self.tasks if task not in TASKS]
        if not self.tasks or unknown:
            raise ValueError(f"tasks={self.tasks!r} is invalid; allowed: a non-empty tuple of {list(TASKS)}")


@dataclass(frozen=True, kw_only=True)
class ModelPreset:
    """A named model: a family and the shape of its config.

    Attributes:
        name: the ``--model`` value.
        family: the family that builds it.
        config: the family's frozen shape config (``LlamaConfig``, ``BertConfig``, ``GPT2Config`` ...).
        help: one line for ``--help`` and listings.
        weights_folder: returns the folder of the trained weights (a Hugging Face model folder); None for a model
            trained from scratch. Called only when the weights are loaded (never at import).
        tokenizer_folder: returns the folder of the model's own tokenizer; None when the run trains one.
    """

    name: str
    family: ModelFamily
    config: Any
    help: str
    weights_folder: Callable[[], Path] | None = None
    tokenizer_folder: Callable[[], Path] | None = None

    def __post_init__(self) -> None:
        if self.pretrained and self.family.load is None:
            raise ValueError(f"model={self.name!r} has weights but family {self.family.name!r} cannot load any")

    @property
    def pretrained(self) -> bool:
        """The model comes with trained weights (its vocabulary and positions are fixed)."""
        return self.weights_folder is not None

    @property
    def tasks(self) -> tuple[str, ...]:
        return self.family.tasks


MODELS: dict[str, ModelPreset] = {}


def register_model(preset: ModelPreset) -> ModelPreset:
    """Add ``preset`` to :data:`MODELS`; a name may be registered once."""
    return register_once(MODELS, preset, what="model")


def register_presets(family: ModelFamily, configs: Mapping[str, Any], helps: Mapping[str, str]) -> None:
    """Register a preset of ``family`` for each name of ``helps``, in its order: ``configs[name]`` is its shape and
    ``helps[name]`` its listing line. Every name is checked before any is registered."""
    missing = [name for name in helps if name not in configs]
    if missing:
        raise ValueError(f"presets {missing} of family {family.name!r} have no config; allowed: {list(configs)}")
    for name, help in helps.items():
        register_model(ModelPreset(name=name, family=family, config=configs[name], help=help))


def get_model(name: str) -> ModelPreset:
    """The model called ``name``, or a one-line ``ValueError`` listing the registered ones."""
    return look_up(MODELS, name, what="model")


def model_names(task: str | None = None) -> list[str]:
    """Registered model names, in registration order; with ``task``, only the models that have its head."""
    if task is not None and task not in TASKS:
        raise ValueError(f"task={task!r} is unknown; allowed: {list(TASKS)}")
    return [name for name, preset in MODELS.items() if task is None or task in preset.tasks]


def resolve_task(name: str, task: str | None = None) -> str:
    """``task``, checked against what model ``name`` supports; None gives the model's default task."""
    preset = get_model(name)
    if task is None:
        return preset.tasks[0]
    if task not in preset.tasks:
        raise ValueError(f"task={task!r} is not supported by model={name!r}; allowed: {list(preset.tasks)}")
    return task


def model_config(
    name: str,
    *,
    task: str | None = None,
    vocab_size: int | None = None,
    max_seq_len: int | None = None,
    n_classes: int | None = None,
    **fields: Any,
) -> Any:
    """The config :func:`build_model` builds model ``name`` with, after the overrides.

    Args:
        name, task: as :func:`build_model`.
        vocab_size: replaces the preset's vocabulary (to match a tokenizer); a pretrained model's cannot change.
        max_seq_len: the longest sequence the model must take; raises the preset's context when longer, never
            shortens it (a pretrained model's positions are fixed, so a longer request is an error).
        n_classes: the classifier's number of classes (``task="classify"`` only).
        fields: other fields of a from-scratch model's config that the task fixes (a U-Net's ``in_channels``).
    """
    preset = get_model(name)
    task = resolve_task(name, task)
    config = preset.config
    changes: dict[str, int] = {}
    for field, value in (("vocab_size", vocab_size), ("max_seq_len", max_seq_len)):
        if value is not None and not hasattr(config, field):  # e.g. a U-Net reads images, not tokens
            raise ValueError(f"{field}={value} is invalid for model={name!r}, which has none; allowed: None")
    if vocab_size is not None and vocab_size != config.vocab_size:
        if preset.pretrained:
            raise ValueError(
                f"vocab_size={vocab_size} is invalid for pretrained model={name!r}; allowed: {config.vocab_size}"
            )
        changes["vocab_size"] = vocab_size
    if max_seq_len is not None and max_seq_len > config.max_seq_len:
        if preset.pretrained:
            raise ValueError(
                f"max_seq_len={max_seq_len} is invalid for pretrained model={name!r}; allowed: <= {config.max_seq_len}"
            )
        changes["max_seq_len"] = max_seq_len
    if n_classes is not None:
        if task != "classify":
            raise ValueError(f"n_classes={n_classes} is invalid for task={task!r}; allowed: None (only 'classify')")
        changes["n_classes"] = n_classes
    unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(config)})
    if unknown or (fields and preset.pretrained):
        raise ValueError(
            f"model overrides {sorted(fields)} are invalid for model={name!r}; allowed: fields of its config"
        )
    changes.update(fields)
    return dataclasses.replace(config, **changes) if changes else config


def build_model(
    name: str, *, task: str | None = None, device: torch.device | str | None = None, **overrides: Any
) -> nn.Module:
    """Build the registered model ``name`` for ``task``.

    Args:
        name: a registered model (:func:`model_names`).
        task: one of the model's tasks; None takes its default (the first of ``get_model(name).tasks``).
        device: where to build; ``"meta"`` builds without allocating (for books and plans) and never reads
            pretrained weights. Pretrained weights are loaded on the CPU and then moved.
        overrides: ``vocab_size``, ``max_seq_len``, ``n_classes`` and other config fields, as :func:`model_config`
            takes them.
    """
    preset = get_model(name)
    task = resolve_task(name, task)
    config = model_config(name, task=task, **overrides)
    device = torch.device(device or "cpu")
    if preset.pretrained and device.type != "meta":
        return preset.family.load(config, task=task, folder=preset.weights_folder()).to(device)
    with device:
        return preset.family.build(config, task=task)
