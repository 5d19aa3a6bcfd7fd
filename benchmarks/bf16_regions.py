"""OpenMP parallel regions per train step (outer and nested apart), fp32 vs bf16 autocast.

Every outer region wakes the other threads (with ``OMP_WAIT_POLICY=PASSIVE``, as the CLI sets it, from sleep); a
nested one runs inline on its thread. The counts do not depend on the machine's load. Needs the counter preloaded:

    gcc -O2 -shared -fPIC -o /tmp/omp_regions_nested.so benchmarks/omp_regions_nested.c -ldl -lgomp
    LD_PRELOAD=/tmp/omp_regions_nested.so OMP_WAIT_POLICY=PASSIVE python benchmarks/bf16_regions.py --preset 350m \
        --out benchmarks/results/bf16_regions_350m
"""

from __future__ import annotations

import argparse
import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F
from _results import table, write

from benchmarks.bf16_step import make_step
from tensorslim.methods import build_for_method
from tensorslim.train.allocator import keep_freed_memory
from tensorslim.train.optim import build_optimizer


def counters() -> tuple[ctypes._CFuncPtr, ctypes._CFuncPtr]:
    library = ctypes.CDLL(None)
    try:
        outer, nested = library.omp_outer_regions, library.omp_nested_regions
    except AttributeError:
        raise SystemExit("preload the counter: LD_PRELOAD=/tmp/omp_regions_nested.so (see the docstring)") from None
    outer.restype = nested.restype = ctypes.c_longlong
    return outer, nested


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="350m")
    parser.add_argument("--method", default="cola")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    outer, nested = counters()
    torch.manual_seed(0)
    model, _, _ = build_for_method(args.preset, args.method, max_seq_len=args.seq_len)
    optimizer = build_optimizer(model, lr=1e-4, weight_decay=0.0)
    batch = torch.randint(model.config.vocab_size, (1, args.seq_len), generator=torch.Generator().manual_seed(0))
    rows = []
    for variant in ("fp32", "autocast"):
        step = make_step(model, optimizer, batch, variant)
        step()
        step()
        before = outer(), nested()
        step()
        rows.append([variant, f"{outer() - before[0]:,}", f"{nested() - before[1]:,}"])
    config = model.config
    for dtype in (torch.float32, torch.bfloat16):  # one layer's attention, forward and backward
        shape = (1, config.n_heads, args.seq_len, config.d_model // config.n_heads)
        q, k, v = (torch.randn(shape, dtype=dtype, requires_grad=True) for _ in range(3))
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        before = outer(), nested()
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        name = f"one layer's flash attention, {str(dtype).removeprefix('torch.')}, forward + backward"
        rows.append([name, f"{outer() - before[0]:,}", f"{nested() - before[1]:,}"])
    lines = table(["step", "outer regions", "nested regions"], rows)
    print("\n".join(lines))
    if args.out:
        title = f"OpenMP regions per train step ({args.method} {args.preset}, batch 1 × {args.seq_len})"
        notes = [
            f"{args.threads} threads; the counting library preloaded (`LD_PRELOAD`, built from omp_regions_nested.c)",
            "counts, not times: the machine's load does not change them",
        ]
        write(Path(args.out), title, lines, data=rows, notes=notes)


if __name__ == "__main__":
    main()
