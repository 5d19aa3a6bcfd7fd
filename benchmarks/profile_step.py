"""Where a train step's time goes, dense vs CoLA: torch.profiler self-CPU time grouped by operator family.

Run it at 1 and at 2 threads (``--threads``) to see which families do not scale, and with ``--dtype bf16`` to see
what bf16 autocast leaves in fp32 (elementwise work, casts, the optimizer). The step's minor page faults and system
time (``getrusage``) are reported below the families: the profiler does not see the kernel's work. Like training, it
keeps freed memory in the process (``tensorslim.train.allocator``); ``--no-keep-freed-memory`` profiles glibc's default.

Usage:
    python benchmarks/profile_step.py --preset 60m --batch-size 4 --seq-len 256 --threads 2 --out /tmp/profile_60m
"""

from __future__ import annotations

import argparse
import resource
from collections import defaultdict
from pathlib import Path

import torch
from _results import table, write
from torch.profiler import ProfilerActivity, profile

from tensorslim.methods import build_for_method
from tensorslim.models.registry import get_model
from tensorslim.tasks.lm import causal_lm_loss
from tensorslim.train.allocator import keep_freed_memory
from tensorslim.train.execution import autocast
from tensorslim.train.optim import build_optimizer

FAMILIES = {
    # oneDNN's linear (mkldnn::_linear_pointwise) runs the TT layers' token-parallel GEMMs.
    "matmul": ("mm", "addmm", "bmm", "matmul", "linear", "_linear_pointwise"),
    "attention": ("_scaled_dot_product", "scaled_dot_product", "_softmax", "softmax"),
    "optimizer": ("_fused_adamw", "_foreach", "adamw", "lerp", "addcdiv", "addcmul"),
    "loss (log-softmax over the vocabulary)": ("_log_softmax", "log_softmax", "cross_entropy", "nll_loss"),
    "activation": ("silu",),
    "copies and casts (bf16 autocast: weights, gradients)": ("_to_copy", "copy_"),
    "zero fills (embedding gradient, loss gradient)": ("fill_", "zero_"),
    # Self time of autograd's nodes and of our autograd functions (the TT kernel's): Python and dispatch, no kernels.
    "autograd nodes and Python functions": ("evaluate_function", "_factoredmatmul"),
}


def family(name: str) -> str:
    short = name.split("::")[-1].lower()
    for label, keys in FAMILIES.items():
        if any(short == key or short.startswith(key) for key in keys):
            return label
    return "other elementwise / copies"


def profile_method(preset: str, method: str, batch: torch.Tensor, dtype: str = "fp32") -> dict[str, float]:
    torch.manual_seed(0)
    model, _, _ = build_for_method(preset, method, max_seq_len=batch.shape[1])
    optimizer = build_optimizer(model, lr=1e-4, weight_decay=0.0)  # the trainer's (fused) AdamW

    def step() -> None:
        with autocast(dtype, "cpu"):
            loss = causal_lm_loss(model(batch), batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up: lazy optimizer state, allocator
    step()  # a second one: with freed memory kept, the heap reaches its steady size
    before = resource.getrusage(resource.RUSAGE_SELF)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    after = resource.getrusage(resource.RUSAGE_SELF)
    seconds: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        seconds[family(event.key)] += event.self_cpu_time_total / 1e6
    kernel = {
        "minor page faults": after.ru_minflt - before.ru_minflt,
        "system time (s)": after.ru_stime - before.ru_stime,
    }
    return {**seconds, **kernel}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="350m")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--dtype", default="fp32", help="fp32 or bf16 (autocast)")
    parser.add_argument("--keep-freed-memory", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.keep_freed_memory:
        keep_freed_memory()
    vocab = get_model(args.preset).config.vocab_size
    batch = torch.randint(vocab, (args.batch_size, args.seq_len), generator=torch.Generator().manual_seed(0))
    result = {method: profile_method(args.preset, method, batch, args.dtype) for method in ("dense", "cola")}
    lines = markdown_table(result)
    print("\n".join(lines))
    if args.out:
        write(Path(args.out), "Train-step profile", lines, data=result)


def markdown_table(result: dict[str, dict[str, float]]) -> list[str]:
    """Operator families by dense's time, their total, then the step's page faults and system time."""
    kernel = ("minor page faults", "system time (s)")
    labels = sorted({k for r in result.values() for k in r} - set(kernel), key=lambda k: -result["dense"].get(k, 0))
    rows = []
    for label in [*labels, "total", *kernel]:
        if label == "total":
            d, c = (sum(v for k, v in result[m].items() if k not in kernel) for m in ("dense", "cola"))
        else:
            d, c = result["dense"].get(label, 0.0), result["cola"].get(label, 0.0)
        shown = (f"{d:,.0f}", f"{c:,.0f}") if label == "minor page faults" else (f"{d:.3f}", f"{c:.3f}")
        rows.append([label, *shown, f"{d / c if c else float('inf'):.2f}"])
    return table(["operator family", "dense (s)", "cola (s)", "dense / cola"], rows)


if __name__ == "__main__":
    main()
