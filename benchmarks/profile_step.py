"""Where a train step's time goes, dense vs CoLA: torch.profiler self-CPU time grouped by operator family.

Run it at 1 and at 2 threads (``--threads``) to see which families do not scale, and with ``--dtype bf16`` to see
what bf16 autocast leaves in fp32 (elementwise work, casts, the optimizer).

Usage:
    python benchmarks/profile_step.py --preset 60m --batch-size 4 --seq-len 256 --threads 2 --out /tmp/profile_60m
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from tensorslim.methods import build_for_method
from tensorslim.models.registry import get_model
from tensorslim.tasks.lm import causal_lm_loss
from tensorslim.train.optim import build_optimizer
from tensorslim.train.precision import autocast

FAMILIES = {
    "matmul": ("mm", "addmm", "bmm", "matmul", "linear"),
    "attention": ("_scaled_dot_product", "scaled_dot_product", "_softmax", "softmax"),
    "optimizer": ("_fused_adamw", "_foreach", "adamw", "lerp", "addcdiv", "addcmul"),
    "loss (log-softmax over the vocabulary)": ("_log_softmax", "log_softmax", "cross_entropy", "nll_loss"),
    "activation": ("silu",),
    "casts (bf16 autocast)": ("_to_copy",),
}


def family(name: str) -> str:
    short = name.removeprefix("aten::").lower()
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
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    seconds: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        seconds[family(event.key)] += event.self_cpu_time_total / 1e6
    return dict(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="350m")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--dtype", default="fp32", help="fp32 or bf16 (autocast)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    vocab = get_model(args.preset).config.vocab_size
    batch = torch.randint(vocab, (args.batch_size, args.seq_len), generator=torch.Generator().manual_seed(0))
    result = {method: profile_method(args.preset, method, batch, args.dtype) for method in ("dense", "cola")}
    labels = sorted({k for r in result.values() for k in r}, key=lambda k: -result["dense"].get(k, 0))
    lines = ["| operator family | dense (s) | cola (s) | dense / cola |", "|---|---|---|---|"]
    for label in [*labels, "total"]:
        d = sum(result["dense"].values()) if label == "total" else result["dense"].get(label, 0.0)
        c = sum(result["cola"].values()) if label == "total" else result["cola"].get(label, 0.0)
        lines.append(f"| {label} | {d:.3f} | {c:.3f} | {d / c if c else float('inf'):.2f} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        command = "python benchmarks/profile_step.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None
        )
        Path(args.out).with_suffix(".md").write_text(f"# Train-step profile\n\n- command: `{command}`\n\n{table}")
        Path(args.out).with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
