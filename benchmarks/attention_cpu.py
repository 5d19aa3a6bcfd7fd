"""Causal self-attention on the CPU: PyTorch's SDPA (flash kernel) against attention written as two matmuls and a
softmax, forward + backward and forward only, fp32 and bf16, over sequence lengths.

The shape is one LLaMA layer's (``350m``: batch 1, 16 heads of 64) with the model's memory layout: q, k and v are
``(B, T, H, hd)`` projections viewed as ``(B, H, T, hd)``, and the output is made ``(B, T, H·hd)`` again, as
``o_proj`` reads it. Variants:

- ``sdpa``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``, what the model used (CPU flash kernel);
- ``sdpa_math``: the same call forced onto SDPA's math backend;
- ``masked_fill``: Hugging Face's eager attention (``q @ kᵀ · scale``, causal ``masked_fill``, softmax in fp32,
  ``@ v``);
- ``baddbmm``: the scale and an additive causal mask folded into one ``baddbmm``, softmax in fp32, ``@ v``;
- ``matmul``: ``tensorslim.functional.attention.matmul_causal_attention``, ``baddbmm`` with the softmax in the input
  dtype (CPU softmax computes in fp32 inside);
- ``model``: ``tensorslim.functional.attention.causal_attention``, what the model now calls (it picks one of the
  above by dtype and length).

Each variant's time is the median of ``--repeats`` calls after ``--warmup`` calls, the variants alternating call by
call in one process.

Usage:
    python benchmarks/attention_cpu.py --threads 1 --timer thread --out benchmarks/results/attention_cpu_threads1
    python benchmarks/attention_cpu.py --threads 2 --timer wall --out benchmarks/results/attention_cpu_threads2
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from _results import table, write
from torch.nn.attention import SDPBackend, sdpa_kernel

from tensorslim.functional.attention import causal_attention, matmul_causal_attention

CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def sdpa_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def masked_fill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    seq = q.shape[-2]
    above = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)  # (T, T): future keys
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B, H, T, T)
    probs = torch.softmax(scores.masked_fill(above, float("-inf")), dim=-1, dtype=torch.float32)
    return probs.to(v.dtype) @ v


def baddbmm(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    batch, heads, seq, head_dim = q.shape
    bias = torch.zeros(seq, seq, dtype=q.dtype, device=q.device).masked_fill_(
        torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1), float("-inf")
    )
    scores = torch.baddbmm(
        bias, q.reshape(-1, seq, head_dim), k.reshape(-1, seq, head_dim).transpose(1, 2), alpha=head_dim**-0.5
    )  # (B·H, T, T)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    return (probs @ v.reshape(-1, seq, head_dim)).view(batch, heads, seq, head_dim)


VARIANTS: dict[str, Callable[..., torch.Tensor]] = {
    "sdpa": sdpa,
    "sdpa_math": sdpa_math,
    "masked_fill": masked_fill,
    "baddbmm": baddbmm,
    "matmul": matmul_causal_attention,
    "model": causal_attention,
}


def make_call(fn, *, seq: int, heads: int, head_dim: int, dtype: torch.dtype, backward: bool) -> Callable[[], None]:
    batch, d = 1, heads * head_dim
    gen = torch.Generator().manual_seed(0)
    qkv = [torch.randn(batch, seq, d, generator=gen).to(dtype).requires_grad_(backward) for _ in range(3)]
    grad = torch.randn(batch, seq, d, generator=gen).to(dtype)

    def call() -> None:
        for t in qkv:
            t.grad = None  # as in the model, where the gradients flow on into the projections
        q, k, v = (t.view(batch, seq, heads, head_dim).transpose(1, 2) for t in qkv)  # (B, H, T, hd), model layout
        with torch.set_grad_enabled(backward):
            y = fn(q, k, v).transpose(1, 2).reshape(batch, seq, d)  # what o_proj reads
            if backward:
                y.backward(grad)

    return call


def measure(args: argparse.Namespace) -> list[dict]:
    clock = CLOCKS[args.timer]
    rows = []
    for dtype_name in args.dtypes.split(","):
        for seq in (int(s) for s in args.seq_lens.split(",")):
            for backward in (True, False):
                calls = {
                    name: make_call(
                        VARIANTS[name],
                        seq=seq,
                        heads=args.heads,
                        head_dim=args.head_dim,
                        dtype=DTYPES[dtype_name],
                        backward=backward,
                    )
                    for name in args.variants.split(",")
                }
                times: dict[str, list[float]] = {name: [] for name in calls}
                for i in range(args.warmup + args.repeats):
                    for name, call in calls.items():
                        start = clock()
                        call()
                        if i >= args.warmup:
                            times[name].append(clock() - start)
                row = {"dtype": dtype_name, "seq": seq, "pass": "forward+backward" if backward else "forward"}
                row |= {name: 1e3 * statistics.median(t) for name, t in times.items()}
                rows.append(row)
                print(row, flush=True)
    return rows


def times_table(rows: list[dict], variants: list[str]) -> list[str]:
    """Milliseconds per call of each variant by dtype, length and pass, with SDPA's time over the model's."""
    columns = ["dtype", "T", "pass", *(f"{v} (ms)" for v in variants), "sdpa / model"]
    cells = [
        [
            row["dtype"],
            row["seq"],
            row["pass"],
            *(f"{row[v]:.2f}" for v in variants),
            f"{row['sdpa'] / row['model']:.2f}×" if "sdpa" in row and "model" in row else "",
        ]
        for row in rows
    ]
    return table(columns, cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timer", choices=sorted(CLOCKS), default="thread")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--seq-lens", default="64,128,256,512,1024")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = measure(args)
    lines = times_table(rows, args.variants.split(","))
    print("\n".join(lines))
    if args.out:
        note = (
            f"{args.timer} clock, {args.threads} thread(s), median of {args.repeats} calls after {args.warmup}, "
            f"variants alternating; shape B=1, H={args.heads}, hd={args.head_dim}; CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}"
        )
        write(Path(args.out), "Causal attention on the CPU, SDPA vs matmul attention", lines, data=rows, notes=[note])


if __name__ == "__main__":
    main()
