"""Batch-1 matrix-vector products at one and two threads, with the weights streamed from memory as in decoding.

Cycles through enough distinct matrices of each shape (about 300 MB) that none is in cache, and reports the best of
four passes per shape, product and thread count. Products of ``x (1, cols)`` with a weight ``(rows, cols)``:
``F.linear`` (BLAS), ``torch.mv``, a batched GEMM over two row halves, oneDNN's matmul (``onednn``), and ``x @ Wᵀ``
with the weight stored transposed, ``(cols, rows)`` contiguous (``stored-t``: the same product from the other memory
layout, which tells whether a short-row factor such as CoLA's ``B (d_out, r)`` is slow because of its layout).
Diagnostic: a shared machine moves these figures.

Usage:
    OMP_WAIT_POLICY=PASSIVE python benchmarks/decode_gemv_threads.py --out benchmarks/results/decode_gemv_threads
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from _results import table, write

SHAPES = ((256, 1024), (1024, 256), (2736, 256), (2736, 1024), (1024, 1024))  # CoLA's 350m factors; dense layers
PRODUCTS = ("linear", "mv", "bmm2", "onednn", "stored-t")


def seconds_per_product(rows: int, cols: int, threads: int, product: str) -> float:
    torch.set_num_threads(threads)
    count = max(8, int(300e6 / (rows * cols * 4)))
    weights = [torch.randn(rows, cols) for _ in range(count)]
    x = torch.randn(1, cols)
    halves = [w.view(2, rows // 2, cols) for w in weights]
    stored_t = [w.t().contiguous() for w in weights] if product == "stored-t" else []  # (cols, rows)
    best = float("inf")
    for _ in range(4):
        start = time.perf_counter()
        if product == "linear":
            for w in weights:
                F.linear(x, w)
        elif product == "mv":
            for w in weights:
                torch.mv(w, x[0])
        elif product == "onednn":
            for w in weights:
                torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
        elif product == "stored-t":
            for w in stored_t:
                torch.mm(x, w)
        else:
            for w in halves:
                torch.bmm(x.expand(2, 1, cols), w.transpose(1, 2))
        best = min(best, (time.perf_counter() - start) / count)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows_out, data = [], []
    for rows, cols in SHAPES:
        for product in PRODUCTS:
            cells = []
            for threads in (1, 2):
                s = seconds_per_product(rows, cols, threads, product)
                cells.append(f"{s * 1e6:.0f}, {rows * cols * 4 / s / 1e9:.1f}")
                data.append({"shape": [rows, cols], "product": product, "threads": threads, "seconds": s})
            rows_out.append([f"{rows}×{cols}", product, *cells])
    lines = table(["shape", "product", "1 thread (µs, GB/s)", "2 threads (µs, GB/s)"], rows_out)
    print("\n".join(lines))
    if args.out:
        write(Path(args.out), "Batch-1 GEMV, weights streamed from memory, 1 vs 2 threads", lines, data=data)


if __name__ == "__main__":
    main()
