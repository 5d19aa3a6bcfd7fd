"""The one training loop: task data → model → loss → optimizer → checkpoint → metrics → report.

Every method (:mod:`tensorslim.methods`) and every task (:mod:`tensorslim.tasks`) trains here. The schedule follows
the GaLore/CoLA recipe (GaLore, arXiv 2403.03507 §5; CoLA, arXiv 2502.10940 §4): AdamW, linear warm-up then cosine
to 10 % of the peak learning rate, gradient clipping. A method's hook (:mod:`tensorslim.methods.hooks`) may add to the
loss, build its own optimizer and act after each step (CoMERA's stages).

Where the processes are is the run's parallel layout (:mod:`tensorslim.distributed.layout`): one process by
default, or tensor × data parallelism under ``torchrun`` (BOOST, arXiv 2512.12131, §3) through this very loop; the
layout is asked at a few fixed points (shard the model, cut the batch, reduce, gather checkpoints) and only rank 0
logs and reports.

Runs end well: a non-finite loss or gradient stops the run at once, naming the step, before the optimizer touches
the weights (or, with ``on_nonfinite="skip"``, skips that step and counts it), so no checkpoint ever holds
non-finite weights; SIGTERM and Ctrl-C finish the current step, write a checkpoint and raise :class:`Interrupted`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tensorslim.checkpoint import latest_checkpoint
from tensorslim.distributed.layout import Layout, SingleProcess, parallel_layout
from tensorslim.methods import build_run_model, get_method, initial_model, method_books, model_books
from tensorslim.methods.hooks import TrainHook
from tensorslim.tasks import get_task
from tensorslim.tasks.base import Task, TaskData, to_device
from tensorslim.train import run_folder
from tensorslim.train.allocator import keep_freed_memory
from tensorslim.train.config import TrainConfig
from tensorslim.train.execution import GraphedStep, autocast, compile_model, compile_seconds, resolve_dtype
from tensorslim.train.memory import MemoryBreakdown, count_saved_tensors, training_memory
from tensorslim.train.metrics import MetricsLog, plot_loss_curve, strict_json
from tensorslim.train.optim import build_optimizer
from tensorslim.train.run_model import save_run_model


class NonFiniteError(ValueError):
    """The loss or the gradient norm of a step was not finite; the weights were left as they were before it."""


class Interrupted(Exception):  # noqa: N818 - reads as "the run was interrupted"
    """SIGTERM or Ctrl-C stopped the run after a step; a checkpoint of that step was written.

    Attributes:
        step: the last completed step.
        checkpoint: the checkpoint folder written for it.
        signal_number: the signal that asked the run to stop.
    """

    def __init__(self, step: int, checkpoint: Path, signal_number: int) -> None:
        super().__init__(f"interrupted after step {step}; checkpoint written to {checkpoint} (resume with --resume)")
        self.step = step
        self.checkpoint = checkpoint
        self.signal_number = signal_number


@dataclass(frozen=True)
class TrainResult:
    """What a finished run reports (also written to ``summary.json``)."""

    run_dir: str
    steps: int
    params_total: int
    params_non_embedding: int
    dense_params_total: int
    dense_params_non_embedding: int
    flops_per_token: float
    dense_flops_per_token: float
    tokens_per_s: float
    memory: dict[str, int]
    val_loss: float
    losses: list[float]
    val_metrics: dict[str, float] = field(default_factory=dict)
    skipped_steps: int = 0
    # The precision asked for and used, with the bf16 probe's findings when ``dtype="auto"`` chose it.
    precision: dict[str, Any] = field(default_factory=dict)
    # With ``compile=True``: the first step's time beyond a steady step (compilation), kept out of tokens_per_s.
    compile_s: float | None = None
    # Parameters that trained (``requires_grad`` at the end), as peft counts them.
    params_trainable: int = 0
    # The method's target (CoMERA's size) and whether the run reached it (see ``TrainHook.target``).
    target: dict[str, Any] | None = None
    # The trained model as a save_pretrained folder (``<run>/model``), or None with the reason in ``model_note``.
    model_dir: str | None = None
    model_note: str | None = None


def _shapes(model: nn.Module) -> list[tuple[int, ...]]:
    return [tuple(p.shape) for p in model.parameters()]


def _trained_books(
    model: nn.Module, books: dict[str, float], *, seq_len: int, start_shapes: list[tuple[int, ...]]
) -> dict[str, float]:
    """``books`` with the method's entries recounted when training changed the model's shapes (CoMERA truncates
    dead ranks; ``start_shapes`` are the trained model's parameter shapes before training), on a meta copy so the
    count costs no compute and follows the same code path as at the start."""
    if _shapes(model) == start_shapes:
        return books
    shapes_only = copy.deepcopy(model).to("meta")
    return {**books, **model_books(shapes_only, seq_len=seq_len)}


class _StopRequests:
    """Turns SIGTERM/SIGINT into a request that the loop honours after the current step (main thread only)."""

    def __init__(self) -> None:
        self.signal_number: int | None = None

    @contextmanager
    def installed(self) -> Iterator[_StopRequests]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

        def request(signal_number: int, _frame: object) -> None:
            self.signal_number = signal_number

        for sig in previous:
            signal.signal(sig, request)
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class Trainer:
    """Runs a :class:`TrainConfig` to the end, resuming from the run folder's checkpoint when asked.

    Building a Trainer checks the whole run and builds a fresh one (data, model, optimizer); :meth:`run` claims the
    run folder and only then reads its latest checkpoint, so a resumed run continues the checkpoint no other run
    can still be writing (as torchtitan's ``train()`` and Hugging Face's ``Trainer.train(resume_from_checkpoint)``
    load theirs when training starts).

    Under ``torchrun`` (or with ``config.tp > 1``) every process builds a Trainer: the layout checks the mesh, the
    method's ``tensor_parallel`` styles and the batch split before any work, then joins the process group, which
    :meth:`run` leaves at the end.

    Args:
        config: the run.
        on_nonfinite: ``"stop"`` raises :class:`NonFiniteError` at the first non-finite loss or gradient;
            ``"skip"`` drops that step's update, counts it (``skipped_steps``) and goes on.
        layout: where the processes are (default: :func:`tensorslim.distributed.layout.parallel_layout`).
        cuda_graphs: capture the whole step (forward, loss, backward, clipping, AdamW) in a CUDA graph and replay it
            (:class:`tensorslim.train.execution.GraphedStep`; CoMERA, arXiv 2405.14377, §4): one process,
            ``device='cuda'``, ``grad_accum=1``, a method without a training hook, AdamW.
        static_step: run that same static-shape step eagerly, without capture (what ``cuda_graphs`` runs, on any
            device). A non-finite step is found after its update in both modes, so ``on_nonfinite`` must be
            ``"stop"`` (the weights are checked before every checkpoint).
        model: train this model (already built, e.g. a compressed one) instead of the one ``config.preset`` and
            ``config.method`` build; its own books stand for the dense baseline's. One process only.
        task: the task to train, already holding what its data needs (e.g. a distillation's teacher), instead of
            one built from ``config.task``.
    """

    def __init__(
        self,
        config: TrainConfig,
        *,
        on_nonfinite: str = "stop",
        layout: Layout | None = None,
        cuda_graphs: bool = False,
        static_step: bool = False,
        model: nn.Module | None = None,
        task: Task | None = None,
    ) -> None:
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config of type {type(config).__name__} is invalid; allowed: a TrainConfig")
        if on_nonfinite not in ("stop", "skip"):
            raise ValueError(f"on_nonfinite={on_nonfinite!r} is invalid; allowed: 'stop' or 'skip'")
        cuda_graphs = cuda_graphs or config.cuda_graphs
        if config.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' was requested but no CUDA device is available; use device='cpu'")
        if cuda_graphs or static_step:
            _check_static_step(config, cuda_graphs=cuda_graphs, on_nonfinite=on_nonfinite)
        self.config = config
        self.on_nonfinite = on_nonfinite
        self.cuda_graphs = cuda_graphs
        self.run_dir = Path(config.run_dir)
        self.layout = layout or parallel_layout(config.parallel_setup())
        if model is not None and not isinstance(self.layout, SingleProcess):
            raise ValueError("a given model trains on one process; allowed: tp=1 outside torchrun")
        self.device = self.layout.device
        self._given_model, self._given_task = model, task
        if self.layout.is_main:  # before any work: a run that would write over another fails at once
            _check_run_folder(config)
        try:
            with self.layout.guarded():
                self._build(static_step)
        except BaseException:
            self.layout.close(ok=False)
            raise
        if config.keep_freed_memory and self.device.type == "cpu":
            # After the data and the model are built: their temporaries go back to the kernel as usual, and only
            # the training steps' blocks stay in the heap for reuse.
            keep_freed_memory()

    def _build(self, static_step: bool) -> None:
        config = self.config
        self.task = self._given_task or get_task(config.task)(config.task_options)
        self.method = get_method(config.method)
        self.data: TaskData = self.layout.rank0_first(lambda: self.task.build_data(config, model_name=config.preset))
        torch.manual_seed(config.seed)  # every rank builds the same full weights; a parallel layout keeps its slices
        if self._given_model is not None:
            model, self.reports, context = self._given_model, [], None
            books = model_books(model, seq_len=config.seq_len)
            self.books = {**books, **{f"dense_{key}": value for key, value in books.items()}}
            if config.init is not None:
                model = initial_model(config.init, like=model)
        else:
            self.books = method_books(seq_len=config.seq_len, **config.model_spec(), **self.data.model_overrides)
            model, self.reports, context = build_run_model(
                **config.model_spec(),
                steps=config.steps,
                run_dir=self.run_dir,
                init=config.init,
                init_base=config.init_base,
                **self.data.model_overrides,
            )
        self.model = self.layout.shard(model.to(self.device))
        self.dtype, probe = resolve_dtype(config.dtype, self.device)
        self.precision = {"requested": config.dtype, "used": self.dtype, "probe": probe and probe.to_dict()}
        if config.compile:
            compile_model(self.model)
        self.start_shapes = _shapes(self.model)
        self.hook: TrainHook = self.method.hook(context) if self.method.hook is not None else TrainHook()
        self.optimizer = (
            self.hook.build_optimizer(self.model, lr=config.peak_lr(), weight_decay=config.weight_decay)
            or self._default_optimizer()
        )
        self.stream = self.data.train
        self.static_step = self._static_step() if self.cuda_graphs or static_step else None
        self.schedule = config.lr_schedule()
        self.step = 0
        self.skipped_steps = 0

    def _default_optimizer(self) -> torch.optim.Optimizer:
        config = self.config
        if self.cuda_graphs:  # a graph replays the learning rate it captured unless it reads it from a tensor
            params = [p for p in self.model.parameters() if p.requires_grad]
            lr = torch.tensor(config.peak_lr(), device=self.device)
            return torch.optim.AdamW(params, lr=lr, weight_decay=config.weight_decay, capturable=True)
        return build_optimizer(self.model, **config.optimizer_settings())

    def _resume(self) -> None:
        """Continue from the run folder's latest checkpoint: weights, optimizer, method state, data order, step."""
        path = latest_checkpoint(self.run_dir / "checkpoints")
        if path is None:
            raise ValueError(f"resume=True but {self.run_dir / 'checkpoints'} holds no checkpoint")
        state = self.layout.load_checkpoint(
            path, model=self.model, optimizer=self.optimizer, prepare=self._prepare_resume
        )
        changed = self.config.differences(state.get("config", {}))
        if changed:
            raise ValueError(f"checkpoint {path} was written with a different config: {', '.join(changed)}")
        self.stream.load_state_dict(state["data"])
        self.step = state["step"]
        self.skipped_steps = state.get("skipped_steps", 0)

    def _prepare_resume(self, state: dict[str, Any]) -> None:
        """Before the weights load: the method hook restores its state (and may reshape the model to match)."""
        self.hook.load_state_dict(state.get("method", {}), model=self.model, optimizer=self.optimizer)

    def _autocast(self) -> Any:
        return autocast(self.dtype, self.device)

    def _set_lr(self) -> None:
        factor = self.schedule.factor(self.step)
        for group in self.optimizer.param_groups:
            lr = group.get("lr_scale", 1.0) * self.schedule.peak_lr * factor
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)  # in place: a captured step reads this tensor
            else:
                group["lr"] = lr

    def _train_step(self) -> tuple[float, float, int]:
        """One optimizer step; returns (mean loss, grad norm, saved-activation bytes of the first micro-batch)."""
        config = self.config
        self._set_lr()
        loss_sum, saved = 0.0, 0
        self.task.begin_step(self.step)
        if self.static_step is not None:
            return self._static_train_step()
        for batch, sync in self.layout.micro_batches(self.stream, config.grad_accum):
            with sync:
                batch = to_device(batch, self.device)
                with count_saved_tensors(self.model) as tally, self._autocast():
                    loss = self.layout.loss(self.task, self.model, batch)
                saved = max(saved, tally.bytes)
                objective = self.hook.loss(loss, model=self.model, step=self.step)
                (objective / config.grad_accum).backward()
            loss_sum += loss.item()
        max_norm = config.grad_clip if config.grad_clip > 0 else math.inf
        grad_norm = self.layout.clip_grad_norm(self.model, max_norm)
        loss_mean = self.layout.mean(loss_sum / config.grad_accum)
        if math.isfinite(loss_mean) and math.isfinite(grad_norm):
            self.optimizer.step()
        elif self.on_nonfinite == "stop":
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteError(
                f"step {self.step + 1}: loss={loss_mean} grad_norm={grad_norm} is not finite; stopped before updating "
                f"the weights (lower --lr or keep --grad-clip > 0; the last checkpoint is the last good one)"
            )
        else:
            self.skipped_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return loss_mean, grad_norm, saved

    def _static_step(self) -> GraphedStep:
        """The step as one static-shape call: forward, loss, backward, clipping and AdamW, no host sync inside."""
        max_norm = self.config.grad_clip if self.config.grad_clip > 0 else math.inf
        self._grad_norm = torch.zeros((), device=self.device)

        def loss_fn(model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            with self._autocast():
                loss = self.task.loss(model, batch)
            return loss, {"loss": loss.detach()}

        def update() -> None:
            self._grad_norm.copy_(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
            self.optimizer.step()

        return GraphedStep(
            self.model,
            self.optimizer,
            loss_fn,
            capture=self.cuda_graphs,
            update=update,
            extra_state=(self._grad_norm,),
        )

    def _static_train_step(self) -> tuple[float, float, int]:
        """One step through :attr:`static_step` (saved activations are not counted: 0)."""
        info = self.static_step(to_device(self.stream.next_batch(), self.device))
        loss, grad_norm = info["loss"].item(), self._grad_norm.item()
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            raise NonFiniteError(
                f"step {self.step + 1}: loss={loss} grad_norm={grad_norm} is not finite; the static step had already "
                "updated the weights (lower --lr or keep --grad-clip > 0; the last checkpoint is the last good one)"
            )
        self.step += 1
        return loss, grad_norm, 0

    def _checkpoint(self) -> Path:
        bad = [name for name, p in self.model.named_parameters() if not torch.isfinite(p).all()]
        if bad:
            raise NonFiniteError(
                f"step {self.step}: {len(bad)} weights are not finite (first: {bad[0]}); no checkpoint written, the "
                "last one is the last good one"
            )
        state = {
            "config": self.config.to_dict(),
            "data": self.stream.state_dict(),
            "method": self.hook.state_dict(),
            "skipped_steps": self.skipped_steps,
            "model": {"task": self.config.model_task, "overrides": self.data.model_overrides},
        }
        return self.layout.save_checkpoint(
            self.run_dir / "checkpoints", step=self.step, model=self.model, optimizer=self.optimizer, state=state
        )

    def validate(self) -> dict[str, float]:
        """The task's metrics on the held-out set (model in eval mode meanwhile)."""
        was_training = self.model.training
        self.model.eval()
        model = self.layout.evaluation_model(self.model)
        bar = _validation_progress(self.config) if self.layout.is_main else None
        # A task may call a part of the model (a loss over hidden states): its first part runs once per batch.
        first = next(model.children(), model)

        def count_batch(*_: object) -> None:  # returns None: a forward hook's return value replaces the output
            bar.update(1)

        counting = first.register_forward_hook(count_batch) if bar is not None else None
        try:
            return self.task.evaluate(model, self.data, batch_size=self.config.batch_size, autocast=self._autocast)
        finally:
            if counting is not None:
                counting.remove()
                bar.close()
            self.model.train(was_training)

    def run(self, *, on_step: Callable[[dict[str, Any]], None] | None = None) -> TrainResult:
        """Claim the run folder, continue from its latest checkpoint when ``config.resume``, then train until
        ``config.steps``; ``on_step`` receives each step's metrics record. Every rank returns the same result (rank
        0's records); the parallel layout is left at the end."""
        finished = False
        try:
            with self.layout.guarded():
                result = self._run(on_step)
            finished = True
            return result
        except Interrupted:
            finished = True  # every rank stopped after the same step
            raise
        finally:
            self.layout.close(ok=finished)

    def _run(self, on_step: Callable[[dict[str, Any]], None] | None) -> TrainResult:
        config, main = self.config, self.layout.is_main
        folder = run_folder.claim(self.run_dir, resume=config.resume, overwrite=config.overwrite) if main else None
        try:
            if config.resume:  # read under the claim: no other run can write a newer checkpoint meanwhile
                self._resume()
            return self._train(on_step)
        finally:
            if folder is not None:
                folder.release()

    def _train(self, on_step: Callable[[dict[str, Any]], None] | None) -> TrainResult:
        config, main = self.config, self.layout.is_main
        resume_step = self.step if config.resume else None
        log = MetricsLog(self.run_dir, resume_step=resume_step, tensorboard=config.tensorboard) if main else _NoLog()
        speeds: list[float] = []
        durations: list[float] = []
        saved_peak = 0
        bar = _progress(config, initial=self.step) if main else None
        stop = _StopRequests()
        try:
            with stop.installed():
                while self.step < config.steps:
                    start = time.perf_counter()
                    loss, grad_norm, saved = self._train_step()
                    durations.append(time.perf_counter() - start)
                    speeds.append(self.data.tokens_per_batch * config.grad_accum / durations[-1])
                    extra = self.hook.after_step(self.model, optimizer=self.optimizer, step=self.step)
                    saved_peak = max(saved_peak, saved)
                    record = {
                        "step": self.step,
                        "loss": loss,
                        "lr": float(self.optimizer.param_groups[0]["lr"]),
                        "grad_norm": grad_norm,
                        "tokens": self.step * self.data.tokens_per_batch * config.grad_accum,
                        "tokens_per_s": speeds[-1],
                        **self.layout.step_metrics(),
                        **extra,
                    }
                    if self.step % config.eval_every == 0 or self.step == config.steps:
                        record.update(self.validate())
                    log.log(record)
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{speeds[-1]:,.0f}")
                    signal_number = self.layout.any_rank(stop.signal_number or 0)
                    if signal_number:
                        raise Interrupted(self.step, self._checkpoint(), signal_number)
                    if self.step % config.checkpoint_every == 0 or self.step == config.steps:
                        self._checkpoint()
                    if on_step is not None:
                        on_step(record)
        finally:
            if bar is not None:
                bar.close()
            log.close()
        return self._finish(log, speeds, saved_peak, compile_s=compile_seconds(durations) if config.compile else None)

    def _finish(
        self, log: MetricsLog | _NoLog, speeds: list[float], saved_peak: int, *, compile_s: float | None
    ) -> TrainResult:
        # Rank 0 holds the records (of the interrupted run too, on resume); the others receive what they need.
        records = log.records()
        losses, validated = self.layout.on_main(
            lambda: ([r["loss"] for r in records if "loss" in r], [r for r in records if "val_loss" in r])
        )
        val_metrics = {k: v for k, v in validated[-1].items() if k.startswith("val_")} if validated else self.validate()
        memory: MemoryBreakdown = training_memory(self.model, self.optimizer, saved_peak)
        result = TrainResult(
            run_dir=str(self.run_dir),
            steps=self.step,
            **_trained_books(self.model, self.books, seq_len=self.config.seq_len, start_shapes=self.start_shapes),
            # The first step pays for lazy initialization; the median of the rest is the steady state.
            tokens_per_s=statistics.median(speeds[1:] or speeds) if speeds else 0.0,
            memory={**asdict(memory), "total": memory.total},
            val_loss=val_metrics["val_loss"],
            losses=losses,
            val_metrics=val_metrics,
            skipped_steps=self.skipped_steps,
            precision=self.precision,
            compile_s=compile_s,
            params_trainable=sum(p.numel() for p in self.model.parameters() if p.requires_grad),
            target=self.hook.target(self.model),
        )
        model_dir, model_note = self.layout.on_main(self._save_model) or (None, None)
        result = dataclasses.replace(result, model_dir=model_dir, model_note=model_note)
        self.layout.on_main(lambda: self._report(result, records))
        return result

    def _save_model(self) -> tuple[str | None, str | None]:
        """Write ``<run>/model`` (one process only: a parallel layout's model is sharded); its path and a note."""
        if not isinstance(self.layout, SingleProcess):
            return None, "a parallel run keeps its weights in its checkpoints only"
        if self._given_model is not None:
            return None, "a given model is its caller's to save"
        try:
            folder = save_run_model(
                self.model,
                self.run_dir,
                self.config,
                overrides=self.data.model_overrides,
                tokenizer=self.data.tokenizer,
                labels=self.data.labels,
            )
        except Exception as error:  # the run is done and checkpointed: its summary must still be written
            return None, f"{type(error).__name__}: {error}"
        return str(folder), None

    def _report(self, result: TrainResult, records: list[dict[str, Any]]) -> None:
        (self.run_dir / "summary.json").write_text(
            json.dumps(strict_json(asdict(result)), indent=2, allow_nan=False) + "\n"
        )
        title = f"{self.config.preset} {self.config.task} {self.config.method}"
        plot_loss_curve(records, self.run_dir / "loss.png", title=title)


class _NoLog:
    """The metrics log of a rank other than 0: it writes nothing."""

    def log(self, record: dict[str, Any]) -> None:
        pass

    def records(self) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        pass


class RunFinished(ValueError):
    """``resume=True`` on a run that already reached its last step: nothing to do, nothing is changed."""


def _check_run_folder(config: TrainConfig) -> None:
    """One-line errors for a run folder the run may not write to (see :mod:`tensorslim.train.run_folder`)."""
    run_folder.check(config.run_dir, resume=config.resume, overwrite=config.overwrite)
    done = run_folder.finished_state(config.run_dir, config.steps) if config.resume else None
    if done is not None and not config.differences(done.get("config", {})):  # a changed config is refused later
        raise RunFinished(
            f"run {config.run_dir!r} already finished at step {done['step']} of {config.steps}; nothing changed"
        )


def _check_static_step(config: TrainConfig, *, cuda_graphs: bool, on_nonfinite: str) -> None:
    """One-line errors for a static-shape (or CUDA-graph) step the run cannot take, before any work."""
    what = "cuda_graphs=True" if cuda_graphs else "static_step=True"
    if cuda_graphs and (config.device != "cuda" or not torch.cuda.is_available()):
        raise ValueError(
            f"cuda_graphs=True needs device='cuda' and a CUDA device (device={config.device!r}, "
            f"cuda available: {torch.cuda.is_available()}); static_step=True runs the same step eagerly"
        )
    if config.tp != 1 or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError(f"{what} runs on one process; got tp={config.tp} under torchrun")
    if config.grad_accum != 1:
        raise ValueError(f"{what} needs grad_accum=1, got {config.grad_accum}")
    if on_nonfinite != "stop":
        raise ValueError(f"{what} needs on_nonfinite='stop' (a non-finite step is found after its update)")
    method = get_method(config.method)
    if method.hook is not None or method.optimizer != "adamw":
        raise ValueError(
            f"{what} needs a method without a training hook that trains with AdamW; method {config.method!r} "
            f"(optimizer {method.optimizer!r}) does not fit"
        )


def _validation_progress(config: TrainConfig) -> Any:
    """A bar counting the validation's forward passes (their number is the task's own), gone when it ends."""
    if not config.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(desc="validation", unit="batch", leave=False)


def _progress(config: TrainConfig, *, initial: int) -> Any:
    if not config.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=config.steps, initial=initial, desc=f"{config.preset}/{config.method}", unit="step")


def train(config: TrainConfig, *, on_step: Callable[[dict[str, Any]], None] | None = None) -> TrainResult:
    """Build, train and report one run (see :class:`TrainConfig`)."""
    return Trainer(config).run(on_step=on_step)
