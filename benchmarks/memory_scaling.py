"""Memory entries and time per token vs document length: a bounded memory (LRA, fixed capacity) stays flat, full
attention grows. Both read the same documents in the same run, chunk by chunk, then decode token by token.

Usage:
    PYTHONPATH=. .venv/bin/python benchmarks/memory_scaling.py --out benchmarks/results/memory_scaling
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import _results
import torch

from tensorslim.layers.memory import MemoryConfig, equip_memory_, memory_stores
from tensorslim.models.registry import build_model
from tensorslim.tasks.longctx.streaming import generate


@torch.no_grad()
def measure(model: torch.nn.Module, config: MemoryConfig, ids: torch.Tensor, *, decode: int) -> dict[str, float]:
    """Peak entries and milliseconds per decoded token after reading ``ids`` as the prompt."""
    equipped = copy.deepcopy(model)
    equip_memory_(equipped, config)
    start = time.perf_counter()
    generate(equipped, ids, max_new_tokens=decode)
    seconds = time.perf_counter() - start
    stores = memory_stores(equipped)
    return {
        "peak_entries": max(s.peak for s in stores),
        "entries_at_end": max(s.size for s in stores),
        "ms_per_token": 1e3 * seconds / (ids.shape[1] + decode),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--capacity", type=int, default=128)
    parser.add_argument("--chunk", type=int, default=32)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)  # the machine is shared: more threads than free cores only thrash
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=4096).eval()  # timing needs no training; the shape is the tiny preset's
    rows = []
    for length in args.lengths:
        ids = torch.randint(0, 4096, (1, length))
        configs = {
            "full attention": MemoryConfig(capacity=length + args.decode, chunk=args.chunk, policy="fifo"),
            f"LRA + 4 sinks @ {args.capacity}": MemoryConfig(
                capacity=args.capacity, chunk=args.chunk, policy="lra", sinks=4
            ),
        }
        for name, config in configs.items():  # side by side at each length
            rows.append({"length": length, "memory": name, **measure(model, config, ids, decode=args.decode)})
            print(json.dumps(rows[-1]), flush=True)
    write(rows, args)


def write(rows: list[dict], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name in dict.fromkeys(r["memory"] for r in rows):
        points = [r for r in rows if r["memory"] == name]
        left.plot([r["length"] for r in points], [r["peak_entries"] for r in points], marker="o", label=name)
        right.plot([r["length"] for r in points], [r["ms_per_token"] for r in points], marker="o", label=name)
    for ax, label in ((left, "peak attended entries per layer"), (right, "ms per token (shared CPU, noisy)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("document length (tokens)")
        ax.set_ylabel(label)
        ax.legend()
    figure.tight_layout()
    figure.savefig(out.with_suffix(".png"), dpi=110)
    columns = ["length", "memory", "peak entries", "entries at end", "ms/token"]
    cells = [
        [r["length"], r["memory"], r["peak_entries"], r["entries_at_end"], f"{r['ms_per_token']:.2f}"] for r in rows
    ]
    lines = [
        f"Tiny LLaMA preset (random weights), prompt read in chunks of {args.chunk}, then {args.decode} tokens decoded "
        "one at a time; time per token over prompt + decoding. Timings on a shared machine are noisy: compare rows "
        "of the same length only.",
        "",
        *_results.table(columns, cells),
        f"![scaling]({out.with_suffix('.png').name})",
    ]
    _results.write(out, "Bounded memory: entries and time per token vs document length", lines, data=rows)


if __name__ == "__main__":
    main()
