"""The LLaMA train step with a factored LM head (``--factor-vocab R``, optionally with ``--factor-embedding``)
beside dense and CoLA, side by side.

Each arm is what ``tensorslim train --preset P --method M [--factor-vocab R [--factor-embedding]]`` builds and steps:
the method's model
(``build_for_method``), the trainer's AdamW (``build_optimizer``, fused), bf16 autocast or fp32, the LM loss, gradient
clipping at the trainer's default 0.5, the AdamW step. All arms are built in one process and, after warm-up, take
turns step by step so that machine noise hits them alike; the table gives each arm's median wall-clock step and
dense's median in the same precision divided by it.

Usage:
    python benchmarks/vocab_step.py --preset 350m --batch-size 1 --seq-len 256 --threads 2 --dtypes fp32,auto \
        --repeats 5 --out benchmarks/results/vocab_step_350m
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from _results import table, write

from tensorslim.bench.harness import BenchConfig, synthetic_batch
from tensorslim.books import count_params
from tensorslim.methods import build_for_method, get_method
from tensorslim.methods.recipes import recipe_for
from tensorslim.tasks import get_task
from tensorslim.train.execution import autocast, resolve_dtype
from tensorslim.train.optim import build_optimizer, galore_projection_rank

GRAD_CLIP = 0.5  # TrainConfig.grad_clip's default


class Model:
    """One ``(method, factor_vocab, factor_embedding)``: its model and the trainer's optimizer (GaLore's for GaLore,
    with the trainer's rank; AdamW with ``optimizer_state`` moments otherwise), shared by the arms of every
    precision."""

    def __init__(
        self,
        preset: str,
        method: str,
        vocab_rank: int,
        seq_len: int,
        device: str,
        *,
        factor_embedding: bool = False,
        optimizer_state: str = "fp32",
    ) -> None:
        self.method, self.vocab_rank, self.factor_embedding, self.device = method, vocab_rank, factor_embedding, device
        torch.manual_seed(0)
        self.model, _, _ = build_for_method(
            preset,
            method,
            task="lm",
            max_seq_len=seq_len,
            factor_vocab=vocab_rank,
            factor_embedding=factor_embedding,
            device=device,
        )
        galore = get_method(method).optimizer == "galore"
        rank = galore_projection_rank(recipe_for(preset).cola_rank) if galore else None
        self.optimizer = build_optimizer(
            self.model, lr=1e-4, weight_decay=0.0, galore_rank=rank, state_dtype=optimizer_state
        )
        self.params = count_params(self.model).total


class Arm:
    """A :class:`Model` stepped in one precision, and its step times."""

    def __init__(self, model: Model, dtype: str) -> None:
        self.method, self.vocab_rank, self.dtype = model.method, model.vocab_rank, dtype
        self.factor_embedding = model.factor_embedding
        self.model, self.optimizer, self.params, self.device = model.model, model.optimizer, model.params, model.device
        self.task = get_task("lm")()
        self.times: list[float] = []
        self.thread_times: list[float] = []  # the main thread's CPU time: less disturbed by other processes

    @property
    def name(self) -> str:
        vocab = f" + factor-vocab {self.vocab_rank}" if self.vocab_rank else ""
        return self.method + vocab + (" + factor-embedding" if self.factor_embedding else "")

    def step(self, batch: torch.Tensor, *, timed: bool) -> None:
        start, thread_start = time.perf_counter(), time.thread_time()
        with autocast(self.dtype, self.device):
            loss = self.task.loss(self.model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.device == "cuda":
            torch.cuda.synchronize()
        if timed:
            self.times.append(time.perf_counter() - start)
            self.thread_times.append(time.thread_time() - thread_start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="350m")
    parser.add_argument("--method", default="cola", help="the structured method beside dense")
    parser.add_argument("--vocab-rank", type=int, default=None, help="default: the preset's CoLA rank")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--dtypes", default="fp32,auto", help="comma-separated: fp32, bf16, auto")
    parser.add_argument(
        "--arms",
        default="dense,method,vocab",
        help="comma-separated: dense, method (--method alone), vocab (--method with --factor-vocab), vocab+embedding "
        "(and --factor-embedding); dense first",
    )
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True, help="output stem for .md/.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rank = args.vocab_rank or recipe_for(args.preset).cola_rank or 64
    dtypes = list(dict.fromkeys(resolve_dtype(d.strip(), args.device)[0] for d in args.dtypes.split(",")))
    # One model per arm kind, shared by the precisions (autocast changes only the compute): at 350m each fp32
    # model with AdamW state holds 12 bytes per parameter.
    kinds = {
        "dense": ("dense", 0, False),
        "method": (args.method, 0, False),
        "vocab": (args.method, rank, False),
        "vocab+embedding": (args.method, rank, True),
    }
    unknown = [kind for kind in args.arms.split(",") if kind not in kinds]
    if unknown:
        parser.error(f"--arms: {unknown[0]!r} is unknown; allowed: {', '.join(kinds)}")
    models = [
        Model(args.preset, method, vocab_rank, args.seq_len, args.device, factor_embedding=embedding)
        for method, vocab_rank, embedding in (kinds[kind] for kind in args.arms.split(","))
    ]
    arms = [Arm(model, dtype) for dtype in dtypes for model in models]
    config = BenchConfig(preset=args.preset, task="lm", batch_size=args.batch_size, seq_len=args.seq_len)
    batch = synthetic_batch(config).to(args.device)
    for index in range(args.warmup + args.repeats):
        for arm in arms:  # take turns, so that machine noise hits every arm alike
            arm.step(batch, timed=index >= args.warmup)
    rows, data = [], []
    for arm in arms:
        dense = next(a for a in arms if a.dtype == arm.dtype and a.method == "dense")
        median = statistics.median(arm.times)
        speedup = statistics.median(dense.times) / median
        thread_speedup = statistics.median(dense.thread_times) / statistics.median(arm.thread_times)
        rows.append(
            (
                arm.name,
                arm.dtype,
                f"{arm.params / 1e6:.1f}",
                f"{min(arm.times):.2f} / **{median:.2f}** / {max(arm.times):.2f}",
                f"**{speedup:.2f}×**",
                f"{thread_speedup:.2f}×",
            )
        )
        data.append(
            {
                "arm": arm.name,
                "dtype": arm.dtype,
                "params": arm.params,
                "times_s": arm.times,
                "thread_times_s": arm.thread_times,
                "median_s": median,
                "speedup_vs_dense": speedup,
                "thread_time_speedup_vs_dense": thread_speedup,
            }
        )
    body = [
        f"`{args.preset}`, batch {args.batch_size} × {args.seq_len}, {args.threads} threads, wall clock, "
        f"{args.warmup} warm-up + {args.repeats} timed steps per arm, arms taking turns. Speed-up: dense's median "
        "step in the same precision / the arm's; the last column compares the main thread's CPU time instead "
        "(with OMP_WAIT_POLICY=PASSIVE it approximates the step's critical path, less disturbed by other processes).",
        "",
        *table(
            ("arm", "precision", "params (M)", "step (s) min / median / max", "× dense", "× dense, thread CPU"), rows
        ),
    ]
    print("\n".join(body))
    write(args.out, f"Train step with a factored vocabulary: {args.preset}", body, data={"rows": data})


if __name__ == "__main__":
    main()
