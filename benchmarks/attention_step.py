"""The LLaMA train step with the model's attention (``causal_attention``: bf16 matmuls on the CPU up to 512 tokens)
against SDPA's flash kernel everywhere, alternating step by step on one model in one process.

The two variants differ only in ``tensorslim.functional.attention.MATMUL_ATTENTION_MAX_SEQ`` (0 sends every length
to SDPA), so they allocate alike and the load of a shared machine drifts over both. Per method and precision: the
median step of each variant and their ratio. The step is ``benchmarks/bf16_step.py``'s (logits, cross-entropy,
backward, fused AdamW; plain bf16 autocast for ``bf16``).

Usage:
    OMP_WAIT_POLICY=PASSIVE python benchmarks/attention_step.py --preset 350m --methods dense,cola --dtypes bf16 \
        --threads 1 --timer thread --warmup 2 --repeats 6 --out benchmarks/results/attention_step_350m_threads1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from _results import table, write

import tensorslim.functional.attention as attention
from tensorslim.methods import build_for_method
from tensorslim.train.allocator import keep_freed_memory
from tensorslim.train.optim import build_optimizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bf16_step import make_step  # noqa: E402

CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}
VARIANTS = {"sdpa": 0, "model": attention.MATMUL_ATTENTION_MAX_SEQ}  # the matmul form's longest sequence


def measure(args: argparse.Namespace, method: str, dtype: str) -> dict[str, list[float]]:
    torch.manual_seed(0)
    model, _, _ = build_for_method(args.preset, method, max_seq_len=args.seq_len)
    optimizer = build_optimizer(model, lr=1e-4, weight_decay=0.0)
    vocab = model.config.vocab_size
    batch = torch.randint(vocab, (args.batch_size, args.seq_len), generator=torch.Generator().manual_seed(0))
    step = make_step(model, optimizer, batch, "autocast" if dtype == "bf16" else "fp32")
    clock = CLOCKS[args.timer]
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for i in range(args.warmup + args.repeats):
        for name, max_seq in VARIANTS.items():
            attention.MATMUL_ATTENTION_MAX_SEQ = max_seq
            start = clock()
            step()
            if i >= args.warmup:
                times[name].append(clock() - start)
    attention.MATMUL_ATTENTION_MAX_SEQ = VARIANTS["model"]
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="350m")
    parser.add_argument("--methods", default="dense,cola")
    parser.add_argument("--dtypes", default="bf16")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timer", choices=sorted(CLOCKS), default="thread")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    rows, record = [], []
    for method in args.methods.split(","):
        for dtype in args.dtypes.split(","):
            times = measure(args, method, dtype)
            med = {name: statistics.median(t) for name, t in times.items()}
            cells = [f"{min(t):.3f} / **{med[n]:.3f}** / {max(t):.3f}" for n, t in times.items()]
            rows.append([method, dtype, *cells, f"{med['sdpa'] / med['model']:.3f}×"])
            record.append({"method": method, "dtype": dtype, "times_s": times})
            print(rows[-1], flush=True)
    columns = ["method", "precision", "SDPA everywhere (s) min / median / max", "model (s) min / median / max"]
    lines = table([*columns, "SDPA / model"], rows)
    print("\n".join(lines))
    if args.out:
        note = (
            f"{args.timer} clock, {args.threads} thread(s), {args.repeats} steps per variant after {args.warmup}, "
            f"batch {args.batch_size} × {args.seq_len}"
        )
        title = "The train step with the model's attention vs SDPA everywhere, alternating in one process"
        write(Path(args.out), title, lines, data=record, notes=[note])


if __name__ == "__main__":
    main()
