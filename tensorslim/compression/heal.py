"""Healing: distill a compressed model from the original one, so that it recovers what the conversion lost.

Two stages, cheapest first:

1. **Layer by layer.** Each transformer block that the conversion changed is fit, alone, to the original block's
   outputs: its input is what the (already healed) earlier blocks of the compressed model give it, its target what
   the original block gave on the original model's path, the loss the hidden-state ``MSE + 1 − cos`` of QAT-TT's
   layer-wise distillation (arXiv 2306.01076, :func:`tensorslim.quant.distill.hidden_loss`). One block's forward and
   backward per step, so this stage costs a fraction of a model step per step.
2. **End to end** (with ``HealConfig.steps``). Distillation of the whole model from the original one on the one Trainer
   (:class:`tensorslim.train.trainer.Trainer`), with the loss that matters for the model: for a Hugging Face encoder,
   the last phase of the ``distill`` task's curriculum (every hidden state's ``MSE + 1 − cos``, the attention KL,
   and ``1 − cos`` of the mean-pooled sentence embeddings); for a sequence classifier, the KL divergence of the
   original model's class distribution from the compressed one's, and for a causal LM that of its next-token
   distribution (Hinton et al., arXiv 1503.02531, temperature 1). As in the first stage, only the changed blocks
   learn: the embeddings, the heads and the blocks that conversion left dense stay the original's (they lost
   nothing, and AdamW would move each of them by about its learning rate per step; MiniLM's word embeddings alone
   are half its parameters).

Beyond the papers: the layer-by-layer stage fits blocks (not single layers) and feeds them the compressed model's
own inputs, so each block also absorbs the drift of the blocks before it; dropout stays off in both stages (the
target is the original model's output, not a regularised one).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim._checks import require_int
from tensorslim.compression.calibration import Batch
from tensorslim.options import option
from tensorslim.quant.distill import hidden_loss, logit_kl, mean_pooled
from tensorslim.tasks.base import Autocast, Task, TaskData, logits_of, mean_over_batches
from tensorslim.tasks.distill import Distillation, DistillOptions, TextStream, split_rows
from tensorslim.tasks.lm import lm_loss
from tensorslim.train.schedule import LRSchedule

ENCODER_LOSSES = ("layers", "output")


@dataclass(frozen=True, kw_only=True)
class HealConfig:
    """How long and how fast each healing stage runs.

    The defaults spend the whole budget on the layer-by-layer stage, which heals far more per CPU second: a step runs
    one block, not the whole model and its teacher. On MiniLM at half its linear layers' parameters (128-token BBC
    News articles, embedding cosine on the 111 held-out articles, starting at 0.852), one thread, balanced factors:
    100 steps per block at ``block_lr=1e-3`` reached 0.930 (at ``3e-3``: 0.916), 300 steps 0.949, 600 steps 0.955
    for about 540 CPU seconds, 1,200 steps 0.958 for about 700 (a less loaded machine); a fit ``a + c·n^-α``
    through these four points levels off near 0.963, so that size does not reach 0.97 by more steps. Batches of 16
    at ``block_lr=1.4e-3`` heal as much per CPU second as batches of 8 (150 steps: 0.948). The end-to-end stage
    (only the changed blocks learn) adds little there: 100 steps of the ``"output"`` loss at ``lr=3e-5`` raised
    0.9527 to 0.9539 for 162 CPU seconds, at ``1e-4`` it first lowered the cosine (0.949 to 0.943 in 25 steps), so
    it is off unless ``steps`` is given, and its default rate is ``3e-5``. A layer-by-layer step takes a new batch
    while the healing data lasts (then cycles), so give it up to ``block_steps × batch_size`` distinct texts.
    """

    block_steps: int = option(600, "layer by layer: AdamW steps per changed block (0: skip this stage)")
    block_lr: float = option(1e-3, "layer by layer: peak learning rate (warm-up, then cosine to a tenth)")
    steps: int = option(0, "end to end: distillation steps on the Trainer (0: skip this stage)")
    lr: float = option(3e-5, "end to end: peak learning rate (warm-up, then cosine to a tenth)")
    batch_size: int = option(8, "sequences per step, both stages")
    loss: str = option(
        "layers",
        "end to end, for an encoder: 'layers' (every hidden state, the attention KL and the pooled embeddings) or "
        "'output' (the last hidden state and the pooled embeddings)",
    )
    eval_every: int | None = option(None, "end to end: steps between held-out evaluations (default: at the end)")
    seed: int = option(0, "seed of the data order")
    progress: bool = option(True, "progress bars")

    def __post_init__(self) -> None:
        for name in ("block_steps", "steps", "seed"):
            require_int(name, getattr(self, name), minimum=0)
        require_int("batch_size", self.batch_size)
        if self.eval_every is not None:
            require_int("eval_every", self.eval_every)
        if self.loss not in ENCODER_LOSSES:
            raise ValueError(f"loss={self.loss!r} is invalid; allowed: {' or '.join(map(repr, ENCODER_LOSSES))}")
        for name in ("block_lr", "lr"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ValueError(f"{name}={value!r} is invalid; allowed: a finite number > 0")


def is_encoder(model: nn.Module) -> bool:
    """A Hugging Face encoder (a config with ``num_hidden_layers``), whose outputs are hidden states."""
    return getattr(getattr(model, "config", None), "num_hidden_layers", None) is not None


def check_healable(model: nn.Module, data: Sequence[Batch]) -> None:
    """A one-line ``ValueError`` unless ``model`` with ``data`` is something :func:`heal` can distill end to end: a
    Hugging Face encoder fed dicts with ``input_ids`` and ``attention_mask``, or a causal LM fed ``(B, T)`` ids."""
    if not data:
        raise ValueError("the healing data is empty; allowed: a list of one or more model inputs")
    encoder_inputs = all(isinstance(b, Mapping) and {"input_ids", "attention_mask"} <= set(b) for b in data)
    token_ids = all(isinstance(b, torch.Tensor) and b.dim() == 2 and not b.is_floating_point() for b in data)
    if not ((is_encoder(model) and encoder_inputs) or (not is_encoder(model) and token_ids)):
        raise ValueError(
            f"model of type {type(model).__name__} with inputs of type {type(data[0]).__name__} cannot be healed; "
            "allowed: a Hugging Face encoder with dicts of input_ids and attention_mask, or a causal LM with (B, T) "
            "token ids"
        )


def heal(
    model: nn.Module,
    teacher: nn.Module,
    data: Sequence[Batch],
    *,
    held_out: Sequence[Batch] = (),
    config: HealConfig | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> None:
    """Heal ``model`` (in place) towards ``teacher``: layer by layer, then end to end (see the module docstring).

    Args:
        model: the compressed model; ``teacher`` is the original one (same blocks, same inputs), left unchanged.
        data: healing inputs: dicts with ``input_ids`` and ``attention_mask`` for an encoder, ``(B, T)`` token ids
            for a causal LM. More text than the calibration heals better.
        held_out: inputs the end-to-end stage is evaluated on (default: the first healing batch).
        config: the stages' lengths and learning rates.
        on_stage: called with each finished stage's name (to measure size and quality there).

    Raises:
        ValueError: empty ``data``, or a model that is neither a Hugging Face encoder nor a causal LM of token ids.
    """
    config = config or HealConfig()
    if not isinstance(config, HealConfig):
        raise TypeError(f"config of type {type(config).__name__} is invalid; allowed: a HealConfig")
    check_healable(model, list(data))
    if held_out:
        check_healable(model, list(held_out))
    model.eval()  # dropout off: the target is the original model's output
    teacher.eval().requires_grad_(False)
    if config.block_steps:
        heal_blocks(model, teacher, data, steps=config.block_steps, lr=config.block_lr, progress=config.progress)
        if on_stage is not None:
            on_stage(f"healed layer by layer ({config.block_steps} steps per block)")
    if config.steps:
        distill(model, teacher, data, held_out=held_out, config=config)
        if on_stage is not None:
            on_stage(f"healed end to end ({config.steps} steps)")
    model.eval()


# --- layer by layer ---------------------------------------------------------------------------------------------


def blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's transformer blocks: the modules of its longest ``nn.ModuleList`` (HF ``encoder.layer``, our
    LLaMA's ``layers``), with their names."""
    lists = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m)]
    if not lists:
        return []
    name, longest = max(lists, key=lambda item: len(item[1]))
    return [(f"{name}.{i}", block) for i, block in enumerate(longest)]


def _changed(block: nn.Module, original: nn.Module) -> bool:
    """Whether conversion replaced any module of ``block`` (its module types differ from the original's)."""
    return {n: type(m) for n, m in block.named_modules()} != {n: type(m) for n, m in original.named_modules()}


def changed_blocks(model: nn.Module, teacher: nn.Module) -> list[tuple[str, nn.Module]]:
    """The blocks of ``model`` (:func:`blocks`) in which conversion replaced a module, against ``teacher``'s."""
    originals = dict(teacher.named_modules())
    return [(name, b) for name, b in blocks(model) if name in originals and _changed(b, originals[name])]


@contextmanager
def learning_only(model: nn.Module, modules: Sequence[nn.Module]) -> Iterator[None]:
    """Within the block, only the parameters of ``modules`` learn (``requires_grad``); every flag is put back after.
    No module given: every parameter learns as it did."""
    flags = {p: p.requires_grad for p in model.parameters()}
    if modules:
        model.requires_grad_(False)
        for module in modules:
            for p in module.parameters():
                p.requires_grad_(flags[p])
    try:
        yield
    finally:
        for p, flag in flags.items():
            p.requires_grad_(flag)


class _Stop(Exception):  # noqa: N818 - control flow: the forward pass has given what was asked
    pass


def _call(model: nn.Module, batch: Batch) -> Any:
    return model(**batch) if isinstance(batch, Mapping) else model(batch)


def _first(output: Any) -> torch.Tensor:
    """A block's hidden states: the output itself, or the first item of a tuple (older Hugging Face layers)."""
    return output[0] if isinstance(output, tuple | list) else output


@torch.no_grad()
def _block_io(model: nn.Module, block: nn.Module, batch: Batch, *, want: str) -> Any:
    """What ``block`` receives (``want="input"``: its args and kwargs) or returns (``"output"``) when ``model`` runs
    on ``batch``; the forward pass stops there."""
    seen: dict[str, Any] = {}

    def before(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        if want == "input":
            seen["io"] = (args, kwargs)
            raise _Stop

    def after(_module: nn.Module, _args: tuple, _kwargs: dict, output: Any) -> None:
        seen["io"] = _first(output).detach()
        raise _Stop

    handles = [block.register_forward_pre_hook(before, with_kwargs=True)]
    handles.append(block.register_forward_hook(after, with_kwargs=True))
    try:
        _call(model, batch)
    except _Stop:
        pass
    finally:
        for handle in handles:
            handle.remove()
    return seen["io"]


def _with_hidden(io: tuple[tuple, dict], hidden: torch.Tensor) -> tuple[tuple, dict]:
    """A block call ``(args, kwargs)`` with its hidden states (the first argument) replaced by ``hidden``."""
    args, kwargs = io
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


def block_schedule(steps: int, lr: float) -> LRSchedule:
    """The layer-by-layer healing's learning rate over ``steps``: the Trainer's warm-up + cosine schedule with 5 % of
    the steps (at least one) warming up and a floor of a tenth."""
    return LRSchedule(peak_lr=lr, total_steps=steps, warmup_steps=max(1, round(0.05 * steps)), min_ratio=0.1)


def _fit_block(
    block: nn.Module, inputs: Sequence[tuple[tuple, dict]], targets: Sequence[torch.Tensor], *, steps: int, lr: float,
    on_step: Callable[[float], None],
) -> float:  # fmt: skip
    """``steps`` AdamW steps of ``block`` towards ``targets`` (batch ``s % len(inputs)`` at step ``s``); the loss on
    the first batch after fitting."""
    params = [p for p in block.parameters() if p.requires_grad and p.is_floating_point()]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, block_schedule(steps, lr).factor)
    for step in range(steps):
        (args, kwargs), target = inputs[step % len(inputs)], targets[step % len(targets)]
        loss = hidden_loss(_first(block(*args, **kwargs)).float(), target.float())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        on_step(loss.item())
    with torch.no_grad():
        (args, kwargs), target = inputs[0], targets[0]
        return hidden_loss(_first(block(*args, **kwargs)).float(), target.float()).item()


def heal_blocks(
    model: nn.Module, teacher: nn.Module, data: Sequence[Batch], *, steps: int, lr: float, progress: bool = True
) -> list[float]:
    """Fit each changed block of ``model`` to ``teacher``'s block outputs, in order (stage 1 of :func:`heal`).

    Block ``i`` sees the inputs that ``model``'s blocks before it (already fit) give it and learns the output of
    ``teacher``'s block ``i`` on the teacher's own path; ``steps`` AdamW steps per block (warm-up, then cosine to a
    tenth of ``lr``; gradients clipped to norm 1), each on its own batch of ``data`` while there are more batches
    than steps (cycled otherwise; at most ``steps`` of them are held in memory). The blocks are consecutive (each
    one's output is the next one's input, as in a BERT encoder or a LLaMA decoder), so each path's block inputs are
    computed once, block after block, from the previous block's outputs.

    Returns:
        Each changed block's loss (``MSE + 1 − cos``) on the first batch after fitting.
    """
    from tqdm.auto import tqdm

    originals = dict(teacher.named_modules())
    pairs = [(name, block, originals[name]) for name, block in blocks(model) if name in originals]
    changed = [_changed(block, original) for _, block, original in pairs]
    if not any(changed):
        return []
    used = list(data[: max(1, min(steps, len(data)))])
    inputs = [_block_io(model, pairs[0][1], batch, want="input") for batch in used]  # the student's path
    teacher_inputs = [_block_io(teacher, pairs[0][2], batch, want="input") for batch in used]
    losses = []
    bar = tqdm(total=steps * sum(changed), desc="healing layer by layer", unit="step", disable=not progress)
    for (name, block, original), change in zip(pairs, changed, strict=True):
        with torch.no_grad():
            targets = [_first(original(*args, **kwargs)) for args, kwargs in teacher_inputs]

        def on_step(loss: float, name: str = name) -> None:
            bar.update(1)
            bar.set_postfix(block=name, loss=f"{loss:.4f}")

        if change:
            losses.append(_fit_block(block, inputs, targets, steps=steps, lr=lr, on_step=on_step))
        with torch.no_grad():
            inputs = [_with_hidden(io, _first(block(*io[0], **io[1]))) for io in inputs]
        teacher_inputs = [_with_hidden(io, target) for io, target in zip(teacher_inputs, targets, strict=True)]
    bar.close()
    return losses


# --- end to end, on the Trainer ------------------------------------------------------------------------------------


def encoder_rows(batches: Sequence[Batch]) -> torch.Tensor:
    """Rows ``[ids ‖ mask]`` ``(N, 2T)`` of tokenized batches (dicts), padded (mask 0) to their longest length."""
    length = max(b["input_ids"].shape[1] for b in batches)
    ids = [F.pad(b["input_ids"], (0, length - b["input_ids"].shape[1])) for b in batches]
    mask = [F.pad(b["attention_mask"], (0, length - b["attention_mask"].shape[1])) for b in batches]
    return torch.cat([torch.cat(ids), torch.cat(mask)], dim=1)


def encoder_data(rows: torch.Tensor, held_out: Any, config: Any) -> TaskData:
    """The batches of rows ``[ids ‖ mask]`` as an encoder task reads them (a stream of ``(ids, mask)``), and the held
    out rows as its validation."""
    from tensorslim.data import BatchStream

    stream = BatchStream(rows, batch_size=min(config.batch_size, len(rows)), seed=config.seed)
    return TaskData(
        train=TextStream(stream), validation=held_out, tokens_per_batch=config.batch_size * rows.shape[1] // 2
    )


class EncoderHealing(Distillation):
    """The ``distill`` task in its last phase (every layer, the attention KL and the sentence-embedding loss) on
    given texts, from a given teacher."""

    def __init__(self, teacher: nn.Module, train: torch.Tensor, held_out: torch.Tensor) -> None:
        super().__init__(DistillOptions(steps_per_layer=1))
        self.attach_teacher(teacher)
        self.rows, self.held_out = train, held_out

    def begin_step(self, step: int) -> None:
        self.layer_use = self.n_layers + 1

    def build_data(self, config: Any, *, model_name: str) -> TaskData:
        return encoder_data(self.rows, self.held_out, config)


class _FromTeacher(Task):
    """A task that fits a model to a given, frozen teacher on given rows, validated on given held-out rows; the rows
    are an encoder's ``[ids ‖ mask]`` unless a subclass reads them otherwise."""

    def __init__(self, teacher: nn.Module, train: torch.Tensor, held_out: torch.Tensor) -> None:
        super().__init__()
        self.teacher = teacher.eval().requires_grad_(False)
        self.rows, self.held_out = train, held_out

    def build_data(self, config: Any, *, model_name: str) -> TaskData:
        return encoder_data(self.rows, self.held_out, config)


class OutputHealing(_FromTeacher):
    """Distillation of a Hugging Face encoder's output only: the last hidden state's ``MSE + 1 − cos`` and ``1 − cos``
    of the mean-pooled sentence embeddings, on given rows ``[ids ‖ mask]``; evaluated by that loss (``val_loss``) and
    the mean cosine of the pooled embeddings (``val_cos_mean``). The attention stays as the model has it (no
    attention probabilities are asked for)."""

    name = "heal-output"
    help = "last hidden state and pooled embeddings of an encoder against its original model's"

    def _losses(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss and the per-text cosine of the pooled embeddings ``(B,)``."""
        ids, mask = batch
        with torch.no_grad():
            target = self.teacher(input_ids=ids, attention_mask=mask).last_hidden_state.float()  # (B, T, D)
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        cos = F.cosine_similarity(mean_pooled(hidden, mask), mean_pooled(target, mask), dim=-1)  # (B,)
        return hidden_loss(hidden, target) + 1 - cos.mean(), cos

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self._losses(model, batch)[0]

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data: TaskData, *, batch_size: int, autocast: Autocast) -> dict[str, float]:
        device = next(model.parameters()).device

        def loss(rows: torch.Tensor) -> tuple[torch.Tensor, int]:
            with autocast():
                return self._losses(model, split_rows(rows))[0] * len(rows), len(rows)

        def cos(rows: torch.Tensor) -> tuple[torch.Tensor, int]:
            with autocast():
                return self._losses(model, split_rows(rows))[1].sum(), len(rows)

        held_out = (data.validation,)
        return {
            "val_loss": mean_over_batches(held_out, loss, batch_size=batch_size, device=device),
            "val_cos_mean": mean_over_batches(held_out, cos, batch_size=batch_size, device=device),
        }


class LMHealing(_FromTeacher):
    """Logit distillation of a causal LM from a given teacher on given ``(N, T)`` token blocks; evaluated by the KL
    (``val_loss``) and the student's perplexity on the held-out blocks."""

    name = "heal-lm"
    help = "KL of a causal LM's next-token distribution from its original model's"

    def build_data(self, config: Any, *, model_name: str) -> TaskData:
        from tensorslim.data import BatchStream

        stream = BatchStream(self.rows, batch_size=min(config.batch_size, len(self.rows)), seed=config.seed)
        return TaskData(train=stream, validation=self.held_out, tokens_per_batch=config.batch_size * self.rows.shape[1])

    def _kl(self, model: nn.Module, batch: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
        with torch.no_grad():
            target = logits_of(self.teacher(batch))
        return logit_kl(logits_of(model(batch)), target, reduction=reduction)

    def loss(self, model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        return self._kl(model, batch)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data: TaskData, *, batch_size: int, autocast: Autocast) -> dict[str, float]:
        held_out: torch.Tensor = data.validation
        device = next(model.parameters()).device

        def kl(batch: torch.Tensor) -> tuple[torch.Tensor, int]:
            with autocast():
                return self._kl(model, batch, reduction="sum"), batch.shape[0] * batch.shape[1]

        def nll(batch: torch.Tensor) -> tuple[torch.Tensor, int]:
            with autocast():
                return lm_loss(model, batch, reduction="sum"), batch.shape[0] * (batch.shape[1] - 1)

        divergence = mean_over_batches((held_out,), kl, batch_size=batch_size, device=device)
        loss = mean_over_batches((held_out,), nll, batch_size=batch_size, device=device)
        return {"val_loss": divergence, "val_perplexity": math.exp(min(loss, 700.0))}


class ClassifierHealing(LMHealing):
    """Distillation of a sequence classifier (a Hugging Face ``*ForSequenceClassification``) from a given teacher:
    the KL divergence of the teacher's class distribution from the student's (Hinton et al., arXiv 1503.02531,
    temperature 1) on given rows ``[ids ‖ mask]``; evaluated by the KL (``val_loss``) and the share of held-out
    texts on which both pick the same class (``val_agreement``)."""

    name = "heal-classifier"
    help = "KL of a sequence classifier's class distribution from its original model's"

    build_data = _FromTeacher.build_data  # the rows are an encoder's, not token blocks

    def _logits(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask = batch
        with torch.no_grad():
            target = logits_of(self.teacher(input_ids=ids, attention_mask=mask))
        return logits_of(model(input_ids=ids, attention_mask=mask)), target  # (B, classes) each

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return logit_kl(*self._logits(model, batch))

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data: TaskData, *, batch_size: int, autocast: Autocast) -> dict[str, float]:
        device = next(model.parameters()).device

        def kl(rows: torch.Tensor) -> tuple[torch.Tensor, int]:
            with autocast():
                return logit_kl(*self._logits(model, split_rows(rows)), reduction="sum"), len(rows)

        def agree(rows: torch.Tensor) -> tuple[torch.Tensor, int]:
            with autocast():
                student, teacher = self._logits(model, split_rows(rows))
            return (student.argmax(-1) == teacher.argmax(-1)).sum(), len(rows)

        held_out = (data.validation,)
        return {
            "val_loss": mean_over_batches(held_out, kl, batch_size=batch_size, device=device),
            "val_agreement": mean_over_batches(held_out, agree, batch_size=batch_size, device=device),
        }


def classifies(model: nn.Module, batch: Batch) -> bool:
    """Whether ``model`` on ``batch`` gives one row of logits per text (a sequence classifier), not hidden states."""
    if not isinstance(batch, Mapping):
        return False
    with torch.no_grad():
        logits = getattr(_call(model, batch), "logits", None)
    return isinstance(logits, torch.Tensor) and logits.dim() == 2


def distill(
    model: nn.Module,
    teacher: nn.Module,
    data: Sequence[Batch],
    *,
    held_out: Sequence[Batch] = (),
    config: HealConfig | None = None,
) -> dict[str, float]:
    """End-to-end distillation of ``model`` from ``teacher`` on the Trainer (stage 2 of :func:`heal`), in a
    temporary run folder; returns the held-out metrics of the last evaluation."""
    from tensorslim.train.config import TrainConfig
    from tensorslim.train.trainer import Trainer

    config = config or HealConfig()
    held_out = list(held_out) or list(data[:1])
    check_healable(model, [*data, *held_out])
    learning = [block for _, block in changed_blocks(model, teacher)]  # embeddings and heads stay as they are
    if is_encoder(model) and classifies(teacher, held_out[0]):
        train, valid = encoder_rows(data), encoder_rows(held_out)
        task: Task = ClassifierHealing(teacher, train, valid)
        preset, task_name, seq_len = "minilm", "distill", train.shape[1] // 2
    elif is_encoder(model):
        train, valid = encoder_rows(data), encoder_rows(held_out)
        task = (EncoderHealing if config.loss == "layers" else OutputHealing)(teacher, train, valid)
        preset, task_name, seq_len = "minilm", "distill", train.shape[1] // 2
    else:
        train, valid = torch.cat(list(data)), torch.cat(held_out)
        task = LMHealing(teacher, train, valid)
        preset, task_name, seq_len = "tiny", "lm", train.shape[1]
    with tempfile.TemporaryDirectory(prefix="tensorslim-heal-") as run_dir:
        train_config = TrainConfig(
            preset=preset,  # names the run only: the Trainer trains the given model on the given task
            task=task_name,
            method="dense",
            steps=config.steps,
            batch_size=config.batch_size,
            seq_len=seq_len,
            lr=config.lr,
            weight_decay=0.0,
            grad_clip=1.0,
            warmup_fraction=0.05,
            min_lr_ratio=0.1,
            eval_every=config.eval_every or config.steps,
            eval_blocks=len(valid),
            checkpoint_every=config.steps,
            seed=config.seed,
            keep_freed_memory=False,
            progress=config.progress,
            tensorboard=False,
            out_dir=run_dir,
        )
        with learning_only(model, learning):
            result = Trainer(train_config, model=model, task=task).run()
    return result.val_metrics
