"""Diagnostic A/B of the CoLA layer kernel: the LLaMA train step, dense vs CoLA before vs CoLA now, in one process.

"Before" is the plain product, ``F.linear`` → σ → ``F.linear`` per layer under autograd (MKL GEMMs), which is also
what the kernel falls back to under dispatch modes, in float64 and for decoding; "now" is the default:
:class:`tensorslim.functional.lowrank._LowRankMatmul` (oneDNN token-parallel GEMMs, hand-written backward) with one
down-projection GEMM for q/k/v and for gate/up (:func:`tensorslim.layers.lowrank.linear_many`). The two CoLA models
have the same weights; the three steps alternate (``tensorslim.bench.timing.alternate``), with the trainer's fused
AdamW and freed memory kept in the process, as in ``tensorslim bench``.

Usage:
    python benchmarks/cola_kernel.py --preset 60m --batch-size 4 --seq-len 256 --threads 2 --timer wall \
        --repeats 10 --out benchmarks/results/cola_kernel_60m_threads2_wall
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

import tensorslim.functional.lowrank as lowrank
import tensorslim.layers.lowrank as layers_lowrank
import tensorslim.models.llama as llama
from tensorslim.bench.harness import machine_description
from tensorslim.bench.timing import alternate
from tensorslim.layers.tt import linear_many as one_by_one
from tensorslim.methods import build_for_method
from tensorslim.tasks.lm import causal_lm_loss
from tensorslim.train.allocator import keep_freed_memory
from tensorslim.train.optim import build_optimizer
from tensorslim.train.precision import autocast

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time, "thread": time.thread_time}


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """``plain``: every low-rank product takes the plain ``F.linear`` path (the product before this change);
    ``separate``: the kernel, but each layer on its own (no shared down-projection); ``mkl``: the kernel with every
    GEMM on MKL (``F.linear``) instead of oneDNN; ``stacked``: the plain product with one down-projection for the
    layers that read one input; ``now``: as shipped."""
    kernel_check, shared, gemm = lowrank._use_onednn, llama.linear_many, lowrank._linear
    many = layers_lowrank.low_rank_many
    if name == "stacked":
        layers_lowrank.low_rank_many = stacked_plain
    if name == "plain":
        lowrank._use_onednn = lambda *args, **kwargs: False
    if name == "separate":
        llama.linear_many = one_by_one
    if name == "mkl":
        lowrank._linear = lambda a, weight, bias, *, onednn: F.linear(a, weight, bias)
    try:
        yield
    finally:
        lowrank._use_onednn, llama.linear_many, lowrank._linear = kernel_check, shared, gemm
        layers_lowrank.low_rank_many = many


def stacked_plain(
    x: torch.Tensor, weights: list[tuple[torch.Tensor, torch.Tensor]], biases: list, *, activation: str
) -> list[torch.Tensor]:
    """The plain product under autograd with one down-projection GEMM for the layers that read ``x``."""
    ranks = [a.shape[0] for a, _ in weights]
    latent = lowrank.activation_fn(activation)(F.linear(x, torch.cat([a for a, _ in weights])))
    return [F.linear(h, b, bias) for h, (_, b), bias in zip(latent.split(ranks, -1), weights, biases, strict=True)]


def build(method: str, preset: str, seq_len: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)  # the same initial weights for every CoLA model
    model, _, _ = build_for_method(preset, method, max_seq_len=seq_len)
    return model, build_optimizer(model, lr=1e-4, weight_decay=0.0)


def make_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor, dtype: str, *, kind: str
) -> Callable[[], None]:
    def step() -> None:
        with variant(kind):
            with autocast(dtype, "cpu"):
                loss = causal_lm_loss(model(batch), batch)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


VARIANTS = {
    "plain": "cola before (plain F.linear)",
    "separate": "cola kernel, layers one by one",
    "mkl": "cola kernel + shared A GEMMs, on MKL",
    "stacked": "plain, stacked A",
    "now": "cola now (kernel + shared A GEMMs)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="60m")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--dtype", default="fp32", help="fp32 or bf16 (autocast)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--timer", choices=sorted(CLOCKS), default="wall")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--variants", default="plain,now", help=f"CoLA variants, comma-separated: {list(VARIANTS)}")
    parser.add_argument("--no-dense", action="store_true", help="CoLA variants only (no dense model in memory)")
    parser.add_argument(
        "--one-model", action="store_true", help="all CoLA variants step one model (half the memory at 350m)"
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    keep_freed_memory()
    load_before = os.getloadavg()
    batch = torch.randint(32000, (args.batch_size, args.seq_len), generator=torch.Generator().manual_seed(0))
    cases = {}
    if not args.no_dense:
        cases["dense"] = make_step(*build("dense", args.preset, args.seq_len), batch, args.dtype, kind="now")
    shared = build("cola", args.preset, args.seq_len) if args.one_model else None
    for kind in args.variants.split(","):
        model, optimizer = shared or build("cola", args.preset, args.seq_len)
        cases[VARIANTS[kind]] = make_step(model, optimizer, batch, args.dtype, kind=kind)
    first = next(iter(cases))
    times = alternate(cases, repeats=args.repeats, warmup=args.warmup, clock=CLOCKS[args.timer])
    medians = {name: statistics.median(t) for name, t in times.items()}
    lines = [f"| step | median (s) | min (s) | max (s) | {first} / step |", "|---|---|---|---|---|"]
    for name, t in times.items():
        lines.append(
            f"| {name} | {medians[name]:.3f} | {min(t):.3f} | {max(t):.3f} | {medians[first] / medians[name]:.3f}× |"
        )
    table = "\n".join(lines) + "\n"
    load_after = os.getloadavg()
    print(table)
    if args.out:
        command = "python " + " ".join(sys.argv)
        loads = f"{' '.join(f'{x:.1f}' for x in load_before)} → {' '.join(f'{x:.1f}' for x in load_after)}"
        Path(args.out).with_suffix(".md").write_text(
            f"# CoLA kernel A/B, train step ({args.preset}, batch {args.batch_size} × {args.seq_len}, {args.dtype})\n\n"
            f"- command: `{command}`\n- {args.timer} clock, {torch.get_num_threads()} threads; load average (1/5/15 "
            f"min) {loads}; a shared machine: a diagnostic, not a goal figure\n\n{table}"
        )
        result = {
            "command": command,
            "args": vars(args),
            "machine": machine_description(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "times_s": times,
        }
        Path(args.out).with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
