"""GFLOP/s of one GEMM in bf16 and fp32 at the shapes of the CoLA ``350m`` train step (256 tokens), next to a large one.

Each shape is timed as ``torch.mm`` and as oneDNN's linear (the CoLA kernel's GEMM), best of three rounds of 20
calls, one shape after the other in one process. It answers how much faster bf16 can make the step's GEMMs on this
CPU, whatever the rest of the step does.

Usage:
    python benchmarks/bf16_gemm_rates.py --threads 1 --timer thread --out benchmarks/results/bf16_gemm_rates_threads1
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from _results import table, write

CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}
# (tokens, in, out): CoLA's down- and up-projections at rank 256, the MLP's, the LM head, and a large square one.
SHAPES = [(256, 1024, 256), (256, 256, 1024), (256, 1024, 2736), (256, 2736, 256), (256, 1024, 32000)]
LARGE = (2048, 2048, 2048)


def rate(call, flops: float, clock) -> float:
    call()
    best = float("inf")
    for _ in range(3):
        start = clock()
        for _ in range(20):
            call()
        best = min(best, (clock() - start) / 20)
    return flops / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timer", choices=sorted(CLOCKS), default="thread")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = CLOCKS[args.timer]
    rows, data = [], []
    for m, k, n in [*SHAPES, LARGE]:
        a, w = torch.randn(m, k), torch.randn(n, k)
        a16, w16 = a.bfloat16(), w.bfloat16()
        flops = 2.0 * m * k * n
        mm16 = rate(lambda a16=a16, w16=w16: a16 @ w16.t(), flops, clock)
        linear16 = rate(
            lambda a16=a16, w16=w16: torch.ops.mkldnn._linear_pointwise(a16, w16, None, "none", [], ""), flops, clock
        )
        mm32 = rate(lambda a=a, w=w: a @ w.t(), flops, clock)
        rows.append([f"{m} × {k} × {n}", f"{mm16:.0f}", f"{linear16:.0f}", f"{mm32:.0f}", f"{mm16 / mm32:.2f}×"])
        data.append({"shape": [m, k, n], "bf16_mm": mm16, "bf16_linear": linear16, "fp32_mm": mm32})
    lines = table(["tokens × in × out", "bf16 mm", "bf16 oneDNN linear", "fp32 mm", "bf16 / fp32"], rows)
    print("\n".join(lines))
    if args.out:
        note = f"{args.timer} clock, {args.threads} thread(s); GFLOP/s, best of three rounds of 20 calls"
        write(Path(args.out), "GEMM rates (GFLOP/s), bf16 vs fp32", lines, data=data, notes=[note])


if __name__ == "__main__":
    main()
