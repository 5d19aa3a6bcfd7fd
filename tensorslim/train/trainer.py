"""The training loop: data → model → loss → optimizer → checkpoint → metrics.

Follows the GaLore/CoLA recipe (lowrank digest §1.2–1.3): AdamW, linear warm-up then cosine to 10% of the peak
learning rate, gradient clipping, next-token cross-entropy on packed sequences. Validation loss is the mean
cross-entropy over every predicted token of a fixed held-out set (the reference code divides the summed batch
losses by n + 1; we divide by n).
"""

from __future__ import annotations

import copy
import json
import math
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.bench.memory import MemoryBreakdown, count_saved_tensors, training_memory
from tensorslim.books import count_params, flops_per_token
from tensorslim.data import BatchStream, build_lm_data
from tensorslim.methods import build_model
from tensorslim.models.llama import get_preset
from tensorslim.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from tensorslim.train.config import TrainConfig
from tensorslim.train.hooks import build_hook
from tensorslim.train.metrics import MetricsLog, plot_loss_curve
from tensorslim.train.optim import build_optimizer
from tensorslim.train.schedule import warmup_cosine


def causal_lm_loss(logits: torch.Tensor, input_ids: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy: position t predicts token t+1. logits ``(B, T, V)``, ids ``(B, T)``.

    The last position has no target and is ignored, rather than sliced off: slicing ``logits[:, :-1]`` would copy
    the whole ``(B, T, V)`` tensor, which at a 32k vocabulary costs as much memory traffic as a small layer.
    """
    targets = F.pad(input_ids[:, 1:], (0, 1), value=-100)  # (B, T), -100 = ignore_index
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction=reduction, ignore_index=-100)


@torch.no_grad()
def evaluate(model: nn.Module, blocks: torch.Tensor, *, batch_size: int, autocast: Any = nullcontext) -> float:
    """Mean next-token cross-entropy over all predicted tokens of ``blocks`` ``(N, T)``."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    device = next(model.parameters()).device
    for start in range(0, len(blocks), batch_size):
        batch = blocks[start : start + batch_size].to(device)
        with autocast():
            total += causal_lm_loss(model(batch), batch, reduction="sum").item()
        count += batch.shape[0] * (batch.shape[1] - 1)
    model.train(was_training)
    return total / count


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
    val_perplexity: float
    losses: list[float]


def _books(config: TrainConfig, vocab_size: int) -> dict[str, float]:
    """Parameters and forward FLOPs per token of the method and of the dense baseline, counted on meta models."""
    books = {}
    for key, method in (("", config.method), ("dense_", "dense")):
        model, _ = build_model(
            config.preset, method, vocab_size=vocab_size, max_seq_len=config.seq_len, rank=config.rank, device="meta"
        )
        books.update(_model_books(model, seq_len=config.seq_len, prefix=key))
    return books


def _model_books(model: nn.Module, *, seq_len: int, prefix: str = "") -> dict[str, float]:
    params = count_params(model)
    return {
        f"{prefix}params_total": params.total,
        f"{prefix}params_non_embedding": params.non_embedding,
        f"{prefix}flops_per_token": flops_per_token(model, seq_len=seq_len),
    }


def _trained_books(model: nn.Module, books: dict[str, float], *, seq_len: int) -> dict[str, float]:
    """``books`` with the method's entries recounted when training changed the model's shapes (CoMERA truncates
    dead ranks), on a meta copy so the count costs no compute and follows the same code path as at the start."""
    if count_params(model).total == books["params_total"]:
        return books
    shapes_only = copy.deepcopy(model).to("meta")
    return {**books, **_model_books(shapes_only, seq_len=seq_len)}


class Trainer:
    """Runs a :class:`TrainConfig` to the end, resuming from the run folder's checkpoint when asked."""

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        self.run_dir = Path(config.run_dir)
        self.device = torch.device(config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' was requested but no CUDA device is available; use device='cpu'")
        preset = get_preset(config.preset)
        self.data = build_lm_data(
            config.data,
            tokenizer=config.tokenizer,
            vocab_size=config.vocab_size or preset.model.vocab_size,
            seq_len=config.seq_len,
            max_val_blocks=config.eval_blocks,
        )
        vocab_size = self.data.tokenizer.vocab_size
        self.books = _books(config, vocab_size)
        torch.manual_seed(config.seed)
        self.model, self.report = build_model(
            config.preset, config.method, vocab_size=vocab_size, max_seq_len=config.seq_len, rank=config.rank
        )
        self.model.to(self.device)
        self.hook = build_hook(config, run_dir=self.run_dir)  # method-specific optimizer, loss and stages
        self.optimizer = self.hook.build_optimizer(  # None: the default below
            self.model, lr=config.peak_lr(), weight_decay=config.weight_decay
        ) or build_optimizer(
            self.model,
            lr=config.peak_lr(),
            weight_decay=config.weight_decay,
            galore_rank=(config.rank or preset.cola_rank) if config.method == "galore" else None,
            galore_update_proj_gap=config.galore_update_proj_gap,
            galore_scale=config.galore_scale,
        )
        self.stream = BatchStream(self.data.train, batch_size=config.batch_size, seed=config.seed)
        self.warmup_steps = round(config.steps * (config.warmup_fraction or preset.warmup_fraction))
        self.step = 0
        if config.resume:
            self._resume()

    def _resume(self) -> None:
        path = latest_checkpoint(self.run_dir / "checkpoints")
        if path is None:
            raise ValueError(f"resume=True but {self.run_dir / 'checkpoints'} holds no checkpoint")
        state = load_checkpoint(path, model=self.model, optimizer=self.optimizer, prepare=self._prepare_resume)
        changed = self.config.differences(state.get("config", {}))
        if changed:
            raise ValueError(f"checkpoint {path} was written with a different config: {', '.join(changed)}")
        self.stream.load_state_dict(state["data"])
        self.step = state["step"]

    def _prepare_resume(self, state: dict[str, Any]) -> None:
        """Before the weights load: the method hook restores its state (and may reshape the model to match)."""
        self.hook.load_state_dict(state.get("method", {}), model=self.model, optimizer=self.optimizer)

    def _autocast(self) -> Any:
        if self.config.dtype == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def _train_step(self) -> tuple[float, float, int]:
        """One optimizer step; returns (mean loss, grad norm, saved-activation bytes of the first micro-batch)."""
        config = self.config
        for group in self.optimizer.param_groups:
            group["lr"] = (
                group.get("lr_scale", 1.0)
                * config.peak_lr()
                * warmup_cosine(
                    self.step, total_steps=config.steps, warmup_steps=self.warmup_steps, min_ratio=config.min_lr_ratio
                )
            )
        loss_sum, saved = 0.0, 0
        for _ in range(config.grad_accum):
            batch = self.stream.next_batch().to(self.device)
            with count_saved_tensors(self.model) as tally, self._autocast():
                loss = causal_lm_loss(self.model(batch), batch)
            saved = max(saved, tally.bytes)
            objective = self.hook.loss(loss, model=self.model, step=self.step)
            (objective / config.grad_accum).backward()
            loss_sum += loss.item()
        max_norm = config.grad_clip if config.grad_clip > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm).item()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return loss_sum / config.grad_accum, grad_norm, saved

    def _checkpoint(self) -> None:
        save_checkpoint(
            self.run_dir / "checkpoints",
            step=self.step,
            model=self.model,
            optimizer=self.optimizer,
            state={"config": asdict(self.config), "data": self.stream.state_dict(), "method": self.hook.state_dict()},
        )

    def _validate(self) -> float:
        return evaluate(self.model, self.data.validation, batch_size=self.config.batch_size, autocast=self._autocast)

    def run(self, *, on_step: Callable[[dict[str, Any]], None] | None = None) -> TrainResult:
        """Train until ``config.steps``; ``on_step`` receives each step's metrics record."""
        config = self.config
        log = MetricsLog(self.run_dir, resume_step=self.step if config.resume else None, tensorboard=config.tensorboard)
        tokens_per_step = config.batch_size * config.grad_accum * config.seq_len
        speeds: list[float] = []
        saved_peak = 0
        bar = _progress(config, initial=self.step)
        try:
            while self.step < config.steps:
                start = time.perf_counter()
                loss, grad_norm, saved = self._train_step()
                speeds.append(tokens_per_step / (time.perf_counter() - start))
                extra = self.hook.after_step(self.model, optimizer=self.optimizer, step=self.step)
                saved_peak = max(saved_peak, saved)
                record = {
                    "step": self.step,
                    "loss": loss,
                    "lr": self.optimizer.param_groups[0]["lr"],
                    "grad_norm": grad_norm,
                    "tokens": self.step * tokens_per_step,
                    "tokens_per_s": speeds[-1],
                    **extra,
                }
                if self.step % config.eval_every == 0 or self.step == config.steps:
                    record["val_loss"] = self._validate()
                    record["val_perplexity"] = math.exp(record["val_loss"])
                log.log(record)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{speeds[-1]:,.0f}")
                if self.step % config.checkpoint_every == 0 or self.step == config.steps:
                    self._checkpoint()
                if on_step is not None:
                    on_step(record)
        finally:
            if bar is not None:
                bar.close()
            log.close()
        return self._finish(log, speeds, saved_peak)

    def _finish(self, log: MetricsLog, speeds: list[float], saved_peak: int) -> TrainResult:
        records = log.records()
        val = [r for r in records if "val_loss" in r]
        val_loss = val[-1]["val_loss"] if val else self._validate()
        memory: MemoryBreakdown = training_memory(self.model, self.optimizer, saved_peak)
        result = TrainResult(
            run_dir=str(self.run_dir),
            steps=self.step,
            **_trained_books(self.model, self.books, seq_len=self.config.seq_len),
            # The first step pays for lazy initialization; the median of the rest is the steady state.
            tokens_per_s=statistics.median(speeds[1:] or speeds) if speeds else 0.0,
            memory={**asdict(memory), "total": memory.total},
            val_loss=val_loss,
            val_perplexity=math.exp(val_loss),
            losses=[r["loss"] for r in records if "loss" in r],
        )
        (self.run_dir / "summary.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
        plot_loss_curve(records, self.run_dir / "loss.png", title=f"{self.config.preset} {self.config.method}")
        return result


def _progress(config: TrainConfig, *, initial: int) -> Any:
    if not config.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=config.steps, initial=initial, desc=f"{config.preset}/{config.method}", unit="step")


def train(config: TrainConfig, *, on_step: Callable[[dict[str, Any]], None] | None = None) -> TrainResult:
    """Build, train and report one run (see :class:`TrainConfig`)."""
    return Trainer(config).run(on_step=on_step)
