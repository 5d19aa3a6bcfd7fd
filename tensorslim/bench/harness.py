"""``tensorslim bench``: the same preset built once per method and measured side by side in one process.

For each method: parameters, FLOPs per token (``torch.utils.flop_counter``, forward and forward+backward),
train-step time (forward, backward, AdamW step; min/median/max) over alternating repeats after warm-up, tokens/s,
and peak training memory (CUDA: the allocator's high-water mark; CPU: params + grads + optimizer state + saved
activations, see :mod:`tensorslim.train.memory`), each with its ratio to dense. Output: a Markdown table, JSON and a
PNG chart.

By default it measures what a user sees: wall-clock time with torch's threads (all the machine's cores). One-thread
process CPU time (``--threads 1 --timer cpu``) stays available as a diagnostic that a shared machine disturbs less.
Each method can be measured in several precisions (``--dtype fp32,bf16`` or ``auto``, see
:mod:`tensorslim.train.execution`) and, with ``--compile``, both eager and compiled;
every variant is compared with dense in the same variant.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from tensorslim._checks import check_fields, require_int
from tensorslim.books import count_params, flops_per_token
from tensorslim.methods import build_for_method, get_method
from tensorslim.methods.recipes import recipe_for
from tensorslim.models.registry import model_config, resolve_task
from tensorslim.options import option
from tensorslim.tasks import get_task
from tensorslim.tasks.base import to_device
from tensorslim.tasks.mlm import mask_tokens
from tensorslim.train.allocator import keep_freed_memory
from tensorslim.train.config import check_preset
from tensorslim.train.execution import DTYPES, autocast, compile_model, compile_seconds, resolve_dtype
from tensorslim.train.memory import count_saved_tensors, training_memory
from tensorslim.train.optim import build_optimizer, galore_projection_rank

BENCH_TASKS = ("lm", "mlm", "classify")


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """What ``tensorslim bench`` measures."""

    preset: str = option("60m", "registered model (see `tensorslim train -h`)")
    task: str | None = option(None, "lm, mlm or classify (default: the model's first task)")
    methods: str = option("dense,cola", "comma-separated methods; dense is always added")
    batch_size: int = option(4, "sequences per step")
    seq_len: int = option(256, "tokens per sequence")
    warmup: int = option(2, "untimed steps per method")
    repeats: int = option(5, "timed steps per method, alternating between methods")
    rank: int | None = option(None, "rank of every method that has one (default: its own)")
    seed: int = option(0, "seed of model init and the random token batch")
    device: str = option("cpu", "cpu or cuda")
    threads: int | None = option(None, "torch CPU threads (default: torch's choice)")
    timer: str = option(
        "wall",
        "wall; cpu: process CPU time, robust on a shared machine with --threads 1; thread: the main thread's CPU "
        "time, which with OMP_WAIT_POLICY=PASSIVE approximates a multi-thread step on a shared machine",
    )
    dtype: str = option("fp32", "precisions to measure, comma-separated: fp32, bf16, auto (probed)")
    compile: bool = option(False, "also measure each method torch.compiled, next to eager")
    keep_freed_memory: bool = option(
        True, "CPU: keep freed memory in the process, as training does (no page faults each step)"
    )
    out: str | None = option(None, "output stem for .md/.json/.png (default: print only)")
    overwrite: bool = option(False, "replace the .md/.json/.png of --out when they exist")

    def __post_init__(self) -> None:
        check_fields(self)
        check_preset(self.preset)
        object.__setattr__(self, "task", resolve_task(self.preset, self.task))
        if self.task not in BENCH_TASKS:  # synthetic_batch makes token batches only
            raise ValueError(
                f"task={self.task!r} of preset={self.preset!r} cannot be benchmarked; allowed: {BENCH_TASKS}"
            )
        for method in self.method_list:
            get_method(method)
        for name in ("batch_size", "seq_len", "repeats"):
            require_int(name, getattr(self, name))
        require_int("warmup", self.warmup, minimum=0)
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device={self.device!r} is invalid; allowed: 'cpu' or 'cuda'")
        for name in ("threads", "rank"):
            if getattr(self, name) is not None:
                require_int(name, getattr(self, name))
        if self.timer not in ("wall", "cpu", "thread") or (self.timer != "wall" and self.device == "cuda"):
            raise ValueError(f"timer={self.timer!r} is invalid; allowed: 'wall', or 'cpu' or 'thread' on device cpu")
        bad = [d for d in self.dtype_list if d not in DTYPES]
        if bad or not self.dtype_list:
            raise ValueError(f"dtype={self.dtype!r} is invalid; allowed: a comma-separated list of {list(DTYPES)}")

    @property
    def method_list(self) -> list[str]:
        names = [m.strip() for m in self.methods.split(",") if m.strip()]
        return ["dense"] + [m for m in names if m != "dense"]

    @property
    def dtype_list(self) -> list[str]:
        return list(dict.fromkeys(d.strip() for d in self.dtype.split(",") if d.strip()))


class _Arm:
    """One method's model and optimizer in one precision, eager or compiled, and its timings."""

    def __init__(self, config: BenchConfig, method: str, *, dtype: str = "fp32", compiled: bool = False) -> None:
        self.method, self.dtype, self.compiled = method, dtype, compiled
        self.task = get_task(config.task)()
        options = _rank_options(method, config.rank)
        torch.manual_seed(config.seed)
        self.model, _, _ = build_for_method(
            config.preset, method, task=config.task, options=options, device=config.device, max_seq_len=config.seq_len
        )
        galore = get_method(method).optimizer == "galore"
        rank = galore_projection_rank(recipe_for(config.preset).cola_rank, rank=config.rank) if galore else None
        self.optimizer = build_optimizer(self.model, lr=1e-4, weight_decay=0.0, galore_rank=rank)
        if compiled:
            compile_model(self.model)
        meta, _, _ = build_for_method(
            config.preset, method, task=config.task, options=options, device="meta", max_seq_len=config.seq_len
        )
        params = count_params(meta)
        self.books = {
            "params_total": params.total,
            "params_non_embedding": params.non_embedding,
            "fwd_flops_per_token": flops_per_token(meta, seq_len=config.seq_len),
            "train_flops_per_token": flops_per_token(meta, seq_len=config.seq_len, backward=True),
        }
        self.model_device = config.device
        self.times: list[float] = []
        self.warmup_times: list[float] = []
        self.losses: list[float] = []
        self.saved_bytes = 0
        self.cuda_peak = 0

    def step(self, batch: Any, *, timed: bool, clock: Callable[[], float]) -> None:
        cuda = torch.device(self.model_device).type == "cuda"
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = clock()
        with count_saved_tensors(self.model) as tally, autocast(self.dtype, self.model_device):
            loss = self.task.loss(self.model, batch)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
            self.cuda_peak = max(self.cuda_peak, torch.cuda.max_memory_allocated())
        (self.times if timed else self.warmup_times).append(clock() - start)
        self.losses.append(loss.item())  # after the clock: the sync it forces is not part of the step
        self.saved_bytes = max(self.saved_bytes, tally.bytes)

    @property
    def label(self) -> str:
        return " ".join([self.method, self.dtype] + (["compiled"] if self.compiled else []))


def _rank_options(method: str, rank: int | None) -> dict[str, int]:
    """``{"rank": rank}`` for methods whose options have a rank, else nothing."""
    has_rank = any(f.name == "rank" for f in dataclasses.fields(get_method(method).options))
    return {"rank": rank} if rank is not None and has_rank else {}


def synthetic_batch(config: BenchConfig) -> Any:
    """A random batch of ``config.task``'s shape (token ids; MLM inputs and labels masked as the ``mlm`` task masks
    them, 15 % of positions labelled; a classification mask and labels)."""
    vocab = model_config(config.preset, task=config.task).vocab_size
    generator = torch.Generator().manual_seed(config.seed)
    ids = torch.randint(vocab, (config.batch_size, config.seq_len), generator=generator)
    if config.task == "mlm":
        return mask_tokens(ids, mask_id=vocab - 1, vocab=vocab, generator=generator)
    if config.task == "classify":
        return ids, torch.ones_like(ids), torch.zeros(config.batch_size, dtype=torch.long)
    return ids


def machine_description() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "load_average": os.getloadavg(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
    }


def measure(config: BenchConfig) -> dict[str, Any]:
    """Run the benchmark and return every figure (also the basis of the table, JSON and chart)."""
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was requested but no CUDA device is available; use device='cpu'")
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    # Process CPU time is what the step costs the machine; unlike wall time it does not grow while other
    # processes hold the cores (with one thread, so that no OpenMP thread spins while waiting for another).
    # The main thread takes part in every parallel region and runs every serial part, so with OMP_WAIT_POLICY=PASSIVE
    # (a waiting thread sleeps instead of spinning) its CPU time approximates the step's critical path, and other
    # processes on the cores inflate it much less than the wall clock; it reads lower than a quiet wall clock.
    clock = {"cpu": time.process_time, "thread": time.thread_time}.get(config.timer, time.perf_counter)
    kept = config.keep_freed_memory and config.device == "cpu" and keep_freed_memory()
    dtypes, probes = [], {}
    for requested in config.dtype_list:
        used, probe = resolve_dtype(requested, config.device)
        dtypes.append(used)
        if probe is not None:
            probes[requested] = {"used": used, **probe.to_dict()}
    modes = (False, True) if config.compile else (False,)
    variants = [(dtype, compiled) for dtype in dict.fromkeys(dtypes) for compiled in modes]
    arms = [
        _Arm(config, method, dtype=dtype, compiled=compiled)
        for dtype, compiled in variants
        for method in config.method_list
    ]
    batch = to_device(synthetic_batch(config), torch.device(config.device))
    for round_index in range(config.warmup + config.repeats):
        for arm in arms:  # alternate methods so that machine noise hits all of them alike
            arm.step(batch, timed=round_index >= config.warmup, clock=clock)
    rows = [_row(arm, config) for arm in arms]
    for row in rows:
        dense = next(r for r in rows if r["method"] == "dense" and _variant(r) == _variant(row))
        baseline = next(r for r in rows if r["method"] == row["method"] and _variant(r) == (dtypes[0], False))
        row["vs_dense"] = {
            "params": row["params_total"] / dense["params_total"],
            "fwd_flops": row["fwd_flops_per_token"] / dense["fwd_flops_per_token"],
            "train_flops": row["train_flops_per_token"] / dense["train_flops_per_token"],
            "speedup": dense["step_time_s"] / row["step_time_s"],
            "peak_memory": row["peak_memory_bytes"] / dense["peak_memory_bytes"],
        }
        # The same method in the first precision, eager: what bf16 or compiling buys.
        row["speedup_vs_baseline"] = baseline["step_time_s"] / row["step_time_s"]
    return {
        "command": "tensorslim bench " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["bench"] else None,
        "config": asdict(config),
        "machine": {**machine_description(), "keep_freed_memory": kept},
        "precision_probes": probes,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "rows": rows,
    }


def _variant(row: dict[str, Any]) -> tuple[str, bool]:
    return row["dtype"], row["compiled"]


def _row(arm: _Arm, config: BenchConfig) -> dict[str, Any]:
    """One arm's figures: step time (min/median/max of the timed steps), tokens/s, memory, compile time."""
    memory = training_memory(arm.model, arm.optimizer, arm.saved_bytes)
    step_time = statistics.median(arm.times)
    all_times = arm.warmup_times + arm.times
    return {
        "method": arm.method,
        "label": arm.label,
        "dtype": arm.dtype,
        "compiled": arm.compiled,
        **arm.books,
        "step_time_s": step_time,
        "step_time_min_s": min(arm.times),
        "step_time_max_s": max(arm.times),
        "step_times_s": arm.times,
        "warmup_times_s": arm.warmup_times,
        "compile_s": compile_seconds(all_times) if arm.compiled else None,
        "losses": arm.losses,
        "tokens_per_s": config.batch_size * config.seq_len / step_time,
        "memory": {**asdict(memory), "total": memory.total},
        "peak_memory_bytes": arm.cuda_peak if config.device == "cuda" else memory.total,
    }


def markdown_table(result: dict[str, Any]) -> str:
    config = result["config"]
    lines = [
        f"Preset `{config['preset']}`, batch {config['batch_size']} × seq {config['seq_len']}, "
        f"{config['warmup']} warm-up + {config['repeats']} timed steps per method (alternating), "
        f"device {config['device']}, {config['timer']}-clock timing, "
        f"{result['machine']['torch_threads']} threads. Speed-up: dense's median step / the method's, in the same "
        "precision and mode; ×base: the method's first-precision eager median / this one's.",
        "",
        "| method | params (M) | ×dense | fwd FLOPs/token (M) | ×dense | train-step (s) min / median / max "
        "| speed-up | ×base | compile (s) | tokens/s | peak mem (MiB) | ×dense |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        ratio = row["vs_dense"]
        compile_s = "" if row["compile_s"] is None else f"{row['compile_s']:.1f}"
        lines.append(
            f"| {row['label']} | {row['params_total'] / 1e6:.1f} | {ratio['params']:.3f} "
            f"| {row['fwd_flops_per_token'] / 1e6:.1f} | {ratio['fwd_flops']:.3f} "
            f"| {row['step_time_min_s']:.3f} / **{row['step_time_s']:.3f}** / {row['step_time_max_s']:.3f} "
            f"| {ratio['speedup']:.2f}× | {row['speedup_vs_baseline']:.2f}× | {compile_s} "
            f"| {row['tokens_per_s']:,.0f} | {row['peak_memory_bytes'] / 2**20:,.0f} | {ratio['peak_memory']:.3f} |"
        )
    for requested, probe in result.get("precision_probes", {}).items():
        lines.append(f"\n`--dtype {requested}` chose **{probe['used']}**: {probe['reason']}.")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [("params", "params"), ("fwd_flops", "FLOPs/token"), ("peak_memory", "peak memory")]
    methods = [row["label"] for row in result["rows"]]
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.5))
    for ax, (key, label) in zip(axes, metrics, strict=False):
        ax.bar(methods, [row["vs_dense"][key] for row in result["rows"]])
        ax.set_title(f"{label} (× dense)")
        ax.tick_params(axis="x", labelrotation=45 if len(methods) > 3 else 0)
    axes[3].bar(methods, [row["vs_dense"]["speedup"] for row in result["rows"]], color="tab:green")
    axes[3].set_title("train-step speed-up vs dense")
    axes[3].tick_params(axis="x", labelrotation=45 if len(methods) > 3 else 0)
    fig.suptitle(f"tensorslim bench: {result['config']['preset']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_bench(config: BenchConfig) -> dict[str, Any]:
    """Measure, print the Markdown table, and write ``<out>.md/.json/.png`` when ``config.out`` is set."""
    result = measure(config)
    table = markdown_table(result)
    print(table)
    if config.out:
        stem = Path(config.out)
        stem.parent.mkdir(parents=True, exist_ok=True)
        machine = result["machine"]
        header = (
            f"# tensorslim bench: {config.preset}\n\n"
            f"- command: `{result['command']}`\n- date: {result['date']}\n"
            f"- machine: {machine['cpu']}, {machine['cores']} cores, torch {machine['torch']} "
            f"({machine['torch_threads']} threads), load average at start {machine['load_average']}, "
            f"freed memory kept in the process: {machine['keep_freed_memory']}"
            + (f", OMP_WAIT_POLICY={machine['omp_wait_policy']}" if machine.get("omp_wait_policy") else "")
            + (f", GOMP_SPINCOUNT={machine['gomp_spincount']}" if machine.get("gomp_spincount") else "")
            + "\n\n"
        )
        stem.with_suffix(".md").write_text(header + table)
        stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
        plot(result, stem.with_suffix(".png"))
    return result
