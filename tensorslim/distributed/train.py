"""``torchrun --nproc-per-node N -m tensorslim train --tp P --tp-style btp``: the tensor × data parallel loop.

Reuses the single-process trainer's pieces (data, AdamW, warm-up + cosine schedule, atomic safetensors
checkpoints). Every rank draws the same global batch and keeps its data-parallel slice, so the math does not depend
on the mesh. Checkpoints hold the full, unsharded model and optimizer in the single-process layout (BOOST's
deterministic sharded init, lowrank digest §5.1, run in reverse), so a run may resume with another TP degree or
with the single-process trainer.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tensorslim.distributed.parallelize import STYLES, TPCausalLM, build_mesh, check_world, parallelize
from tensorslim.distributed.sharding import full_tensors, local_shard
from tensorslim.distributed.step import data_parallel, train_step
from tensorslim.train.config import TrainConfig

_LOW_RANK_METHODS = ("cola", "svd")
# Seconds a collective may wait for a peer before the survivors give up (short, so a dead peer cannot hang a run).
TIMEOUT_ENV = "TENSORSLIM_DIST_TIMEOUT"


def check_parallel_config(config: TrainConfig, *, world_size: int) -> None:
    """Raise a one-line ValueError for a bad parallel setup, before any process group or data exists."""
    if config.tp_style not in STYLES:
        raise ValueError(f"tp_style={config.tp_style!r} is unknown; allowed: {list(STYLES)}")
    check_world(config.tp, world_size=world_size)
    dp = world_size // config.tp
    if config.batch_size % dp:
        raise ValueError(f"batch_size={config.batch_size} must be divisible by the data-parallel size {dp}")
    wanted = ("dense",) if config.tp_style == "megatron" else _LOW_RANK_METHODS
    if config.method not in wanted:
        raise ValueError(f"method={config.method!r} does not fit tp_style={config.tp_style!r}; allowed: {list(wanted)}")


# gloo reports a dead peer as a plain RuntimeError ("... pair.cc: Read error ...: Connection reset by peer").
_PEER_FAILURE = re.compile(r"gloo|nccl|connection|timed out|timeout|peer", re.IGNORECASE)


@contextlib.contextmanager
def peer_failure_guard(rank: int) -> Iterator[None]:
    """Turn a collective that fails because a peer died or timed out into one clear line and exit code 1.

    Other errors pass through unchanged, so a bug is not reported as a lost peer.
    """
    try:
        yield
    except RuntimeError as error:
        if not (isinstance(error, dist.DistError) or _PEER_FAILURE.search(str(error))):
            raise
        first = str(error).strip().splitlines()[0][:200]
        print(
            f"tensorslim train: error: rank {rank} lost contact with a peer process ({first}); "
            "the last checkpoint is intact",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(1) from None


def run_guarded(fn: Callable[[], Any], *, rank: int) -> Any:
    """``fn()`` under :func:`peer_failure_guard`; a lost peer ends this process at once with exit code 1.

    ``os._exit`` because tearing down a process group whose peer vanished can abort the interpreter (SIGABRT)
    instead of returning the exit code.
    """
    try:
        with peer_failure_guard(rank):
            return fn()
    except SystemExit as done:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(done.code if isinstance(done.code, int) else 1)


class _FullOptimizerView:
    """The TP optimizer seen as the single-process AdamW (same parameter order, unsharded moments)."""

    def __init__(self, model: TPCausalLM, optimizer: torch.optim.Optimizer, full_names: list[str]) -> None:
        self.model, self.optimizer, self.full_names = model, optimizer, full_names

    def gather(self) -> dict[str, Any]:
        """A collective: the single-process ``state_dict()``."""
        local = dict(zip((n for n, _ in self.model.named_parameters()), self.model.parameters(), strict=True))
        per_key = {}
        for key in ("exp_avg", "exp_avg_sq"):
            moments = {n: self.optimizer.state[p][key] for n, p in local.items() if p in self.optimizer.state}
            per_key[key] = full_tensors(moments, self.model.specs, self.model.tp)
        state = {}
        if per_key["exp_avg"]:
            step = next(iter(self.optimizer.state.values()))["step"]
            for i, name in enumerate(self.full_names):
                state[i] = {
                    "step": step.clone(),
                    "exp_avg": per_key["exp_avg"][name],
                    "exp_avg_sq": per_key["exp_avg_sq"][name],
                }
        group = {k: v for k, v in self.optimizer.param_groups[0].items() if k != "params"}
        return {"state": state, "param_groups": [{**group, "params": list(range(len(self.full_names)))}]}

    def load_state_dict(self, full: dict[str, Any]) -> None:
        by_name = {name: full["state"][i] for i, name in enumerate(self.full_names) if i in full["state"]}
        state = {}
        for i, (name, _) in enumerate(self.model.named_parameters()):
            spec = self.model.specs[name]
            if spec.sources[0] not in by_name:
                continue
            entry = {"step": by_name[spec.sources[0]]["step"]}
            for key in ("exp_avg", "exp_avg_sq"):
                tensors = {src: by_name[src][key] for src in spec.sources}
                entry[key] = local_shard(tensors, spec, rank=self.model.tp.rank, size=self.model.tp.size)
            state[i] = entry
        group = {k: v for k, v in full["param_groups"][0].items() if k != "params"}
        params = list(range(len(list(self.model.parameters()))))
        self.optimizer.load_state_dict({"state": state, "param_groups": [{**group, "params": params}]})


class _Frozen:
    """``state_dict()`` of something already gathered (``save_checkpoint`` reads it on rank 0 only)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return self._state


class _FullModelView:
    """The TP model seen as the single-process model by ``load_checkpoint``."""

    def __init__(self, model: TPCausalLM, shapes: dict[str, torch.Size]) -> None:
        self.model, self.shapes = model, shapes

    def state_dict(self) -> dict[str, torch.Tensor]:
        # load_checkpoint compares names and shapes only; the local slices would have the wrong shapes.
        return {name: torch.empty(shape, device="meta") for name, shape in self.shapes.items()}

    def load_state_dict(self, full: dict[str, torch.Tensor]) -> None:
        self.model.load_full_state_dict(full)


def train_distributed(config: TrainConfig) -> dict[str, Any]:
    """Run ``config`` on the processes started by ``torchrun``; returns rank 0's summary (others: empty)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if "RANK" not in os.environ:
        raise ValueError(
            f"tp={config.tp} needs one process per rank: torchrun --nproc-per-node {config.tp} -m tensorslim train ..."
        )
    check_parallel_config(config, world_size=world_size)
    backend = "nccl" if config.device == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, "300"))))
    try:
        return run_guarded(lambda: _Run(config, world_size=world_size).run(), rank=dist.get_rank())
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


class _Run:
    def __init__(self, config: TrainConfig, *, world_size: int) -> None:
        from tensorslim.data import BatchStream, build_lm_data
        from tensorslim.methods import build_model
        from tensorslim.models.llama import get_preset
        from tensorslim.train.optim import build_optimizer

        self.config, self.rank = config, dist.get_rank()
        self.mesh = build_mesh(config.tp, world_size=world_size, device_type=config.device)
        self.dp = self.mesh["dp"]
        preset = get_preset(config.preset)
        self.data = self._rank0_first(
            lambda: build_lm_data(
                config.data,
                tokenizer=config.tokenizer,
                vocab_size=config.vocab_size or preset.model.vocab_size,
                seq_len=config.seq_len,
                max_val_blocks=config.eval_blocks,
            )
        )
        torch.manual_seed(config.seed)  # every rank builds the same TP=1 weights, then keeps its slices
        full, _ = build_model(
            config.preset,
            config.method,
            vocab_size=self.data.tokenizer.vocab_size,
            max_seq_len=config.seq_len,
            rank=config.rank,
        )
        self.full_names = list(full.state_dict())
        self.full_shapes = {k: v.shape for k, v in full.state_dict().items()}
        self.model = parallelize(full.to(config.device), self.mesh, config.tp_style)
        del full
        self.optimizer = build_optimizer(self.model, lr=config.peak_lr(), weight_decay=config.weight_decay)
        self.runner = data_parallel(self.model, self.dp.get_group(), size=self.dp.size())
        self.stream = BatchStream(self.data.train, batch_size=config.batch_size, seed=config.seed)
        self.warmup_steps = round(config.steps * (config.warmup_fraction or preset.warmup_fraction))
        self.run_dir = Path(config.run_dir)
        self.step = 0
        if config.resume:
            self._resume()

    def _rank0_first(self, fn: Any) -> Any:
        """Rank 0 fills the tokenizer/token caches alone; the others then read them (no concurrent writers)."""
        if self.rank == 0:
            out = fn()
            dist.barrier()
            return out
        dist.barrier()
        return fn()

    def _resume(self) -> None:
        from tensorslim.train.checkpoint import latest_checkpoint, load_checkpoint

        path = latest_checkpoint(self.run_dir / "checkpoints")
        if path is None:
            raise ValueError(f"resume=True but {self.run_dir / 'checkpoints'} holds no checkpoint")
        view = _FullModelView(self.model, self.full_shapes)
        optimizer = _FullOptimizerView(self.model, self.optimizer, self.full_names)
        state = load_checkpoint(path, model=view, optimizer=optimizer)
        changed = self.config.differences(state.get("config", {}))
        if changed:
            raise ValueError(f"checkpoint {path} was written with a different config: {', '.join(changed)}")
        self.stream.load_state_dict(state["data"])
        self.step = state["step"]

    def _checkpoint(self) -> None:
        from tensorslim.train.checkpoint import save_checkpoint

        weights = self.model.full_state_dict()  # collectives: every rank takes part
        optimizer = _FullOptimizerView(self.model, self.optimizer, self.full_names).gather()
        if self.rank == 0:
            save_checkpoint(
                self.run_dir / "checkpoints",
                step=self.step,
                model=_Frozen(weights),
                optimizer=_Frozen(optimizer),
                state={"config": asdict(self.config), "data": self.stream.state_dict()},
            )
        dist.barrier()

    @torch.no_grad()
    def _validate(self) -> float:
        total, count = 0.0, 0
        blocks = self.data.validation
        for start in range(0, len(blocks), self.config.batch_size):
            batch = blocks[start : start + self.config.batch_size].to(self.config.device)
            tokens = batch.shape[0] * (batch.shape[1] - 1)
            total += self.model.loss(batch).item() * tokens
            count += tokens
        return total / count

    def _step(self) -> tuple[float, float]:
        from tensorslim.train.schedule import warmup_cosine

        config = self.config
        scale = warmup_cosine(
            self.step, total_steps=config.steps, warmup_steps=self.warmup_steps, min_ratio=config.min_lr_ratio
        )
        for group in self.optimizer.param_groups:
            group["lr"] = config.peak_lr() * scale
        dp_rank, dp_size = self.dp.get_local_rank(), self.dp.size()
        batches = [self.stream.next_batch().chunk(dp_size)[dp_rank].to(config.device) for _ in range(config.grad_accum)]
        loss, grad_norm = train_step(
            self.runner,
            self.optimizer,
            batches,
            grad_clip=config.grad_clip,
            dp_group=self.dp.get_group(),
            dp_size=dp_size,
        )
        self.step += 1
        return loss, grad_norm

    def run(self) -> dict[str, Any]:
        from tensorslim.train.metrics import MetricsLog

        config = self.config
        log = (
            MetricsLog(self.run_dir, resume_step=self.step if config.resume else None, tensorboard=False)
            if self.rank == 0
            else None
        )
        tokens_per_step = config.batch_size * config.grad_accum * config.seq_len
        times, comm_bytes = [], []
        while self.step < config.steps:
            self.model.tp.log.reset()
            start = time.perf_counter()
            loss, grad_norm = self._step()
            times.append(time.perf_counter() - start)
            comm_bytes.append(self.model.tp.log.total().bytes)
            record = {
                "step": self.step,
                "loss": loss,
                "grad_norm": grad_norm,
                "lr": self.optimizer.param_groups[0]["lr"],
            }
            record |= {"tokens_per_s": tokens_per_step / times[-1], "comm_bytes": comm_bytes[-1]}
            if self.step % config.eval_every == 0 or self.step == config.steps:
                record["val_loss"] = self._validate()
            if log is not None:
                log.log(record)
                if config.progress:
                    print(json.dumps(record), flush=True)
            if self.step % config.checkpoint_every == 0 or self.step == config.steps:
                self._checkpoint()
        if log is None:
            return {}
        log.close()
        records = log.records()
        summary = {
            "tp": config.tp,
            "dp": self.dp.size(),
            "tp_style": config.tp_style,
            "steps": self.step,
            "losses": [r["loss"] for r in records],
            "val_loss": next((r["val_loss"] for r in reversed(records) if "val_loss" in r), math.nan),
            "step_time_s_median": sorted(times)[len(times) // 2] if times else math.nan,
            "comm_bytes_per_step_rank0": comm_bytes[-1] if comm_bytes else 0,
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary
