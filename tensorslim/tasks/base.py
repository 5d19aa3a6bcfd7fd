"""What a task is: the data stream, the loss and the evaluation metrics of one kind of training.

The Trainer (:mod:`tensorslim.train.trainer`) knows nothing else about what is learned. A task registers itself with
:func:`register_task`; importing :mod:`tensorslim.tasks` registers every task.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from tensorslim._checks import look_up, register_once
from tensorslim.options import resolve_options


class Stream(Protocol):
    """A deterministic, resumable source of training batches."""

    def next_batch(self) -> Any: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class TaskData:
    """A task's data for one run.

    Attributes:
        train: the training batches.
        validation: the fixed held-out set, in whatever form the task's :meth:`Task.evaluate` reads.
        tokenizer: the tokenizer, when the task has one.
        model_overrides: what the model must be built with (``vocab_size``, ``max_seq_len``, ``n_classes``).
        tokens_per_batch: tokens (or examples) in one training batch, for throughput.
        labels: a classifier's class names, in logit order.
    """

    train: Stream
    validation: Any
    tokenizer: Any = None
    model_overrides: dict[str, Any] = field(default_factory=dict)
    tokens_per_batch: int = 0
    labels: list[str] | None = None


Autocast = Callable[[], AbstractContextManager]


@dataclass(frozen=True, kw_only=True)
class NoTaskOptions:
    """Options of a task that takes none."""


class Task(ABC):
    """One kind of training, built once per run from its options.

    Subclasses set :attr:`name` and (if they take any) :attr:`options`, a frozen dataclass whose fields become
    ``tensorslim train`` flags, and implement the three abstract methods. :attr:`help`, the line ``tensorslim train
    -h`` lists, is the summary of the subclass's docstring unless it sets one (see :func:`register_task`).
    """

    name: ClassVar[str]
    help: ClassVar[str]
    options: ClassVar[type] = NoTaskOptions
    model_task: ClassVar[str | None] = None  # the model head it trains (``distill`` trains ``embed``); None: its name

    def __init__(self, options: Any = None) -> None:
        self.settings = resolve_options(self.options, options, owner=f"task {self.name!r}")

    def begin_step(self, step: int) -> None:  # noqa: B027 - optional hook, a no-op unless a task needs it
        """Called before optimizer step ``step`` (0-based), for tasks whose loss follows a schedule."""

    @abstractmethod
    def build_data(self, config: Any, *, model_name: str) -> TaskData:
        """The data of a run of ``config`` (a :class:`tensorslim.train.config.TrainConfig`) on model ``model_name``."""

    @abstractmethod
    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The mean training loss of one batch (already on the model's device)."""

    @abstractmethod
    def evaluate(self, model: nn.Module, data: TaskData, *, batch_size: int, autocast: Autocast) -> dict[str, float]:
        """Metrics on the held-out set; always includes ``val_loss``."""


def logits_of(output: Any) -> torch.Tensor:
    """The logits of our models (a tensor) and of Hugging Face models (an output with ``.logits``)."""
    return output if isinstance(output, torch.Tensor) else output.logits


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` (a tensor, or a tuple/list/dict of them) moved to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, tuple | list):
        return type(batch)(to_device(item, device) for item in batch)
    if isinstance(batch, dict):
        return {key: to_device(value, device) for key, value in batch.items()}
    return batch


def mean_over_batches(
    tensors: tuple[torch.Tensor, ...],
    summed: Callable[..., tuple[torch.Tensor, int]],
    *,
    batch_size: int,
    device: torch.device,
) -> float:
    """A validation loss per element: ``tensors`` (aligned on their first dimension) go to ``device`` ``batch_size``
    rows at a time, ``summed(*batch)`` returns the batch's summed loss and how many elements it sums."""
    total, count = 0.0, 0
    for start in range(0, len(tensors[0]), batch_size):
        loss, elements = summed(*(tensor[start : start + batch_size].to(device) for tensor in tensors))
        total, count = total + loss.item(), count + elements
    return total / max(count, 1)


def model_tokenizer(model_name: str) -> str | None:
    """The folder of ``model_name``'s own tokenizer (pretrained models), or None when the run trains one."""
    from tensorslim.models.registry import get_model

    folder = get_model(model_name).tokenizer_folder
    return None if folder is None else str(folder())


def bbc_tokenizer(config: Any, *, model_name: str) -> Any:
    """The tokenizer of a run on BBC News text: ``config.tokenizer``, else ``model_name``'s own, else a byte-level BPE
    of ``config.vocab_size`` (default 4096) trained on the BBC News training split."""
    from tensorslim.data import load_corpus, load_tokenizer

    own = config.tokenizer or model_tokenizer(model_name)
    return load_tokenizer(own, load_corpus("bbcnews"), vocab_size=config.vocab_size or 4096)


def special_id(tokenizer: Any, token: str) -> int | None:
    """The id of ``token`` (e.g. ``"[MASK]"``) in a tokenizer that has it, else None."""
    backend = tokenizer.backend
    lookup = getattr(backend, "token_to_id", None) or getattr(backend, "convert_tokens_to_ids", None)
    found = lookup(token) if lookup is not None else None
    unknown = getattr(backend, "unk_token_id", None)
    return found if isinstance(found, int) and found >= 0 and found != unknown else None


TASKS: dict[str, type[Task]] = {}


def register_task(task: type[Task]) -> type[Task]:
    """Add the task class ``task`` to :data:`TASKS` under its name (usable as a class decorator).

    A task that sets no :attr:`Task.help` of its own gets the first paragraph of its docstring, without the final
    period, so that its listing and its API reference say the same.
    """
    if "help" not in vars(task):
        summary = " ".join((task.__doc__ or "").strip().split("\n\n")[0].split()).removesuffix(".")
        if not summary:
            raise TypeError(f"task class {task.__name__} has neither a docstring nor a help line; give it one")
        task.help = summary
    return register_once(TASKS, task, what="task")


def get_task(name: str) -> type[Task]:
    """The task called ``name``, or a one-line ``ValueError`` listing the registered ones."""
    return look_up(TASKS, name, what="task")
