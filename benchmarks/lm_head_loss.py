"""A/B of the LM head's loss in the LLaMA train step: the logits path vs the fused, chunked head + cross-entropy
(:func:`tensorslim.functional.cross_entropy.linear_cross_entropy`), for dense and CoLA, in one process.

Every arm is a full train step (forward, loss, backward, fused AdamW, as ``tensorslim bench`` runs it, with freed
memory kept in the process); the arms alternate (``tensorslim.bench.timing.alternate``). ``plain`` computes the
``(B, T, V)`` logits and ``causal_lm_loss``; ``cN`` is the fused loss in chunks of N tokens, ``cN-mkl`` the same with
every GEMM on MKL (no oneDNN). The dense arms step one
dense model, the CoLA arms one CoLA model. With ``--memory``, each arm's peak resident memory is measured in a fresh
process (Linux's VmHWM after two steps; the arms share everything but the loss).

Usage:
    OMP_WAIT_POLICY=PASSIVE python benchmarks/lm_head_loss.py --preset 60m --batch-size 4 --seq-len 256 \
        --threads 2 --chunks 256,512,1024 --repeats 8 --memory --out benchmarks/results/lm_head_loss_60m
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from _results import table, write

import tensorslim.functional.cross_entropy as fused
from tensorslim.bench.timing import alternate
from tensorslim.methods import build_for_method
from tensorslim.tasks.lm import causal_lm_loss, next_token_targets
from tensorslim.train.allocator import keep_freed_memory
from tensorslim.train.execution import autocast
from tensorslim.train.optim import build_optimizer

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time, "thread": time.thread_time}


def build(method: str, preset: str, seq_len: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model, _, _ = build_for_method(preset, method, max_seq_len=seq_len)
    return model, build_optimizer(model, lr=1e-4, weight_decay=0.0)


def fused_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, loss: str) -> torch.Tensor:
    """``cN``: the fused loss in chunks of N tokens; ``cN-mkl``: the same with every GEMM on MKL (no oneDNN)."""
    chunk, _, backend = loss[1:].partition("-")
    kernel_check = fused._use_onednn
    if backend == "mkl":
        fused._use_onednn = lambda *args, **kwargs: False
    try:
        return fused.linear_cross_entropy(hidden, weight, targets, chunk_size=int(chunk))
    finally:
        fused._use_onednn = kernel_check


def make_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor, dtype: str, loss: str
) -> Callable[[], None]:
    targets = next_token_targets(batch)

    def step() -> None:
        with autocast(dtype, "cpu"):
            if loss == "plain":
                value = causal_lm_loss(model(batch), batch)
            else:
                hidden = model(batch, return_hidden=True)
                value = fused_loss(hidden, model.lm_head.weight, targets, loss)
        value.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def make_head_step(preset: str, batch: torch.Tensor, dtype: str, loss: str) -> Callable[[], None]:
    """Forward and backward of the head and the loss alone, on random hidden states of the preset's width."""
    from tensorslim.models.registry import model_config

    config = model_config(preset)
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(*batch.shape, config.d_model, generator=gen).requires_grad_()
    head = torch.nn.Linear(config.d_model, config.vocab_size, bias=False)
    targets = next_token_targets(batch)

    def step() -> None:
        with autocast(dtype, "cpu"):
            if loss == "plain":
                value = causal_lm_loss(head(hidden), batch)
            else:
                value = fused_loss(hidden, head.weight, targets, loss)
        value.backward()
        hidden.grad = head.weight.grad = None

    return step


def peak_rss_mb(args: argparse.Namespace, method: str, loss: str) -> float:
    """Peak resident memory (MB) of a fresh process that builds ``method`` and runs two steps with ``loss``."""
    command = [sys.executable, __file__, "--preset", args.preset, "--batch-size", str(args.batch_size)]
    command += ["--seq-len", str(args.seq_len), "--dtype", args.dtype, "--peak-of", f"{method}:{loss}"]
    if args.threads is not None:
        command += ["--threads", str(args.threads)]
    return float(subprocess.run(command, check=True, capture_output=True, text=True).stdout.split()[-1])


def peak_of_this_process_mb() -> float:
    """This process's peak resident memory (MB): Linux's VmHWM. Not ``ru_maxrss``, which a process started by
    ``subprocess`` inherits from its parent's peak across ``exec``."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024  # kB


def timing_lines(times: dict[str, list[float]], methods: list[str], losses: list[str]) -> list[str]:
    """The timing table (median/min/max, × the method's own plain loss, × dense plain) and CoLA × dense per loss."""
    medians = {name: statistics.median(t) for name, t in times.items()}
    rows = []
    for name, t in times.items():
        own = medians[f"{name.split(' ')[0]} plain"] / medians[name]
        first = medians[f"{methods[0]} plain"] / medians[name]
        rows.append([name, f"{medians[name]:.3f}", f"{min(t):.3f}", f"{max(t):.3f}", f"{own:.3f}×", f"{first:.3f}×"])
    lines = table(["step", "median (s)", "min (s)", "max (s)", "× own plain", "first plain / step"], rows)
    if "dense" in methods and len(methods) > 1:
        for loss in losses:
            for other in methods[1:]:
                ratio = medians[f"dense {loss}"] / medians[f"{other} {loss}"]
                lines.append(f"- {other} × dense with the {loss} loss: {ratio:.3f}×")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="60m")
    parser.add_argument("--methods", default="dense,cola")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--dtype", default="fp32", help="fp32 or bf16 (autocast)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--timer", choices=sorted(CLOCKS), default="wall")
    parser.add_argument("--chunks", default="512", help="fused arms, comma-separated: N or N-mkl")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=8, help="timed rounds; 0: no timing (with --memory)")
    parser.add_argument("--memory", action="store_true", help="also each arm's peak RSS, in fresh processes")
    parser.add_argument(
        "--head-only", action="store_true", help="time only the head + loss forward and backward (no model)"
    )
    parser.add_argument("--peak-of", default=None, help=argparse.SUPPRESS)  # internal: METHOD:LOSS
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    keep_freed_memory()
    vocab = 4096 if args.preset == "tiny" else 32000
    batch = torch.randint(vocab, (args.batch_size, args.seq_len), generator=torch.Generator().manual_seed(0))
    if args.peak_of:
        method, loss = args.peak_of.split(":")
        step = make_step(*build(method, args.preset, args.seq_len), batch, args.dtype, loss)
        step()
        step()
        print(peak_of_this_process_mb())
        return
    losses = ["plain"] + [f"c{c}" for c in args.chunks.split(",")]
    methods = ["head"] if args.head_only else args.methods.split(",")
    names = [f"{method} {loss}" for method in methods for loss in losses]
    cases = {}
    for method in methods if args.repeats else []:  # the models are built only to be timed
        if args.head_only:
            cases.update({f"head {loss}": make_head_step(args.preset, batch, args.dtype, loss) for loss in losses})
            continue
        model, optimizer = build(method, args.preset, args.seq_len)
        for loss in losses:
            cases[f"{method} {loss}"] = make_step(model, optimizer, batch, args.dtype, loss)
    times = alternate(cases, repeats=args.repeats, warmup=args.warmup, clock=CLOCKS[args.timer]) if args.repeats else {}
    peaks = {name: peak_rss_mb(args, *name.split(" ")) for name in names} if args.memory and not args.head_only else {}
    lines = timing_lines(times, methods, losses) if times else []
    if peaks:
        own_plain = {name: peak / peaks[name.split(" ")[0] + " plain"] for name, peak in peaks.items()}
        lines += [
            "",
            *table(
                ["step", "peak RSS (MB)", "× own plain"],
                [[n, f"{p:.0f}", f"{own_plain[n]:.3f}"] for n, p in peaks.items()],
            ),
        ]
    print("\n".join(lines))
    if args.out:
        title = f"LM head loss A/B, train step ({args.preset}, batch {args.batch_size} × {args.seq_len}, {args.dtype})"
        note = f"{args.timer} clock, {torch.get_num_threads()} threads; ratios side by side in one run are what count"
        write(
            Path(args.out),
            title,
            lines,
            data={"args": vars(args), "times_s": times, "peak_rss_mb": peaks},
            notes=[note],
        )


if __name__ == "__main__":
    main()
