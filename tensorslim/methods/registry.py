"""The one registry of training methods: ``tensorslim train --method NAME`` and every tool that lists methods.

A :class:`Method` says how a model is restructured before training (or not), which optimizer trains it, which
training hook (if any) adds to the loop, which options it takes (a nested dataclass, so ``TrainConfig`` carries no
method-specific fields) and which tensor-parallel styles can shard it. Each method module registers its records with
:func:`register_method`; importing :mod:`tensorslim.methods` registers them all. This module imports none of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from tensorslim._checks import look_up, register_once

OPTIMIZERS = ("adamw", "galore")
DATA_PARALLEL = ("ddp", "fsdp")


@dataclass(frozen=True, kw_only=True)
class NoOptions:
    """Options of a method that takes none."""


@dataclass(frozen=True, kw_only=True)
class MethodContext:
    """What a method's conversion and hook may read about the run.

    Attributes:
        model_name: the registered model (``tiny``, ``bert-small`` …).
        family: the model's family name (``llama``, ``bert``, ``gpt2``, ``hf-bert``).
        model_config: the family's shape config of the built model.
        task: the task name (``lm``, ``mlm``, ``classify``).
        options: the method's options (an instance of :attr:`Method.options`).
        pretrained: the model carries trained weights (factorize them) rather than a fresh init.
        steps: optimizer steps of the run (0 outside training).
        run_dir: the run folder, or None outside training.
    """

    model_name: str
    family: str
    model_config: Any
    task: str
    options: Any
    pretrained: bool = False
    steps: int = 0
    run_dir: Any = None


Conversion = Callable[[nn.Module, MethodContext], list]


@dataclass(frozen=True, kw_only=True)
class Method:
    """One training method.

    Attributes:
        name: the ``--method`` value.
        help: one line for ``--help`` and listings.
        convert: restructures a freshly built model in place and returns its conversion reports; None trains the
            model as built.
        optimizer: ``"adamw"``, or ``"galore"`` (GaLore-AdamW on the blocks' 2-D weights).
        hook: builds the training hook (:class:`tensorslim.methods.hooks.TrainHook`) from the context; None: no hook.
        options: the frozen dataclass of the method's own options.
        tensor_parallel: the ``--tp-style`` values that can shard this method's model.
        data_parallel: how its model may be trained data-parallel: ``ddp`` (replicas) and/or ``fsdp`` (FSDP2,
            ``--dp-shard``); empty: one process only.
        parallel_note: why a kind of parallelism is missing (shown in the error that refuses it).
        lr: peak learning rate when the user gives none; None takes the model's recipe.
        families: the model families it applies to (``llama``, ``bert``, ``gpt2``, ``hf-bert``); None: any.
        positions: the positions it puts before each input (a soft prompt's length) from its options; a model
            built from scratch gets that many more, so the run's sequence length still fits.
    """

    name: str
    help: str
    convert: Conversion | None = None
    optimizer: str = "adamw"
    hook: Callable[[MethodContext], Any] | None = None
    options: type = NoOptions
    tensor_parallel: tuple[str, ...] = ()
    data_parallel: tuple[str, ...] = DATA_PARALLEL
    parallel_note: str = ""
    lr: float | None = None
    families: tuple[str, ...] | None = None
    positions: Callable[[Any], int] | None = None

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r} is unknown; allowed: {list(OPTIMIZERS)}")
        if not set(self.data_parallel) <= set(DATA_PARALLEL):
            raise ValueError(f"data_parallel={self.data_parallel!r} is invalid; allowed: a subset of {DATA_PARALLEL}")
        if not dataclasses.is_dataclass(self.options):
            raise TypeError(f"options={self.options!r} must be a dataclass type")


METHODS: dict[str, Method] = {}
# The families built of linear layers: rank gates (CoMERA, adaptive CoLA) and CoLA-M's latent checkpoints need
# them, and a U-Net (convolutions) has none.
LINEAR_FAMILIES = ("llama", "bert", "gpt2", "hf-bert")


def register_method(method: Method) -> Method:
    """Add ``method`` to :data:`METHODS`; a name may be registered once."""
    return register_once(METHODS, method, what="method")


def get_method(name: str) -> Method:
    """The method called ``name``, or a one-line ``ValueError`` listing the registered ones."""
    return look_up(METHODS, name, what="method")
