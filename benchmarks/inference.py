"""Inference speed as users see it: prefill latency and decode tokens/s with the KV cache, side by side in one run.

Methods: dense, CoLA (arXiv 2502.10940, §3), SVD, CoMERA (arXiv 2405.14377; its tensor-train layers), and the
weight-only quantized arms, all round-to-nearest with the token embeddings and output head quantized too
(:class:`tensorslim.quant.RTNConfig` ``(bits, embeddings=True)``, as llama.cpp's formats do): W8 and W4 (the dense
model on PyTorch's packed int8/int4 CPU kernels, the default), W4-float-cache (W4 multiplying by a cached
dequantized float weight, :func:`tensorslim.quant.set_weight_cache`) and CoLA+W4 (CoLA's factors at 4 bits). Every
model is built at random init: speed does not depend on the weights' values. For each batch size the same random
prompt is prefilled (one forward over ``--prompt-len`` tokens filling the cache) and then ``--new-tokens`` tokens
are decoded greedily one at a time through the cache, as :func:`tensorslim.generation.generate_ids` does. Methods
alternate within each repeat so that the shared machine's noise hits them alike; min/median/max are reported.

Memory is the state decoding holds: the bytes of every tensor the model holds (parameters, buffers, and the tensors
quantized layers derive and keep between calls: kernel scale tables, cached float weights) plus the KV cache at the
end of decoding; the transient activations of one step come on top.

Usage:
    python benchmarks/inference.py --presets 60m,350m --batch-sizes 1,8 --out benchmarks/results/inference
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _results import command, machine, write
from torch import nn

from tensorslim.books import count_params
from tensorslim.methods import build_for_method
from tensorslim.models.registry import model_config
from tensorslim.quant.kernels import kernel_dtype
from tensorslim.train.execution import autocast, cpu_flags, resolve_dtype

METHODS = ("dense", "cola", "svd", "comera", "w8", "w4", "w4-float-cache", "cola+w4")
# wall: what a user sees (all threads); cpu: this process's CPU time, which a shared machine disturbs less (with
# --threads 1 it is the single-core time; with more threads it sums the threads' time)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
QUANTIZED = {"w8": ("dense", 8), "w4": ("dense", 4), "w4-float-cache": ("dense", 4), "cola+w4": ("cola", 4)}


def build_model(preset: str, method: str, *, max_seq_len: int) -> tuple[nn.Module, int]:
    """``method``'s model of ``preset`` in eval mode (a quantized arm: its base method, then RTN with the
    embeddings and head) and its parameter count (a quantized arm: its base's, as codes)."""
    from tensorslim.quant import RTNConfig, quantize_, set_weight_cache

    torch.manual_seed(0)
    base, bits = QUANTIZED.get(method, (method, None))
    model, _, _ = build_for_method(preset, base, max_seq_len=max_seq_len)
    params = count_params(model).total
    if bits is not None:
        quantize_(model, RTNConfig(bits=bits, embeddings=True), None)
        set_weight_cache(model, method == "w4-float-cache")
    return model.eval(), params


def state_bytes(model: nn.Module, cache: Any) -> dict[str, int]:
    """Bytes of the weights (parameters and buffers, so the packed codes, plus what quantized layers derive and keep:
    kernel scale tables, cached float weights) and of the KV cache."""
    from tensorslim.quant import QuantLinear

    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    weights += sum(m.cached_bytes() for m in model.modules() if isinstance(m, QuantLinear))
    kv = sum(layer.nbytes for layer in cache.layers)  # the buffers, spare capacity included
    return {"weights": weights, "kv_cache": kv, "total": weights + kv}


@torch.no_grad()
def prefill_and_decode(
    model: nn.Module, prompt: torch.Tensor, new_tokens: int, dtype: str, clock: Callable[[], float]
) -> dict[str, Any]:
    """Seconds (by ``clock``) of the prefill and of ``new_tokens`` greedy decode steps; the cache's memory."""
    cache = model.new_cache()
    with autocast(dtype, prompt.device):
        start = clock()
        token = model(prompt, cache=cache)[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
        prefill = clock() - start
        start = clock()
        for _ in range(new_tokens):
            token = model(token, cache=cache)[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
        decode = clock() - start
    return {"prefill_s": prefill, "decode_s": decode, "memory": state_bytes(model, cache)}


def measure_preset(preset: str, args: argparse.Namespace, dtype: str) -> list[dict[str, Any]]:
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    max_seq_len = args.prompt_len + args.new_tokens
    built = {m: build_model(preset, m, max_seq_len=max_seq_len) for m in methods}
    models = {m: model for m, (model, _) in built.items()}
    vocab = model_config(preset).vocab_size
    rows = []
    for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
        prompt = torch.randint(vocab, (batch_size, args.prompt_len), generator=torch.Generator().manual_seed(0))
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
        for repeat in range(args.warmup + args.repeats):
            for method in methods:  # alternate so that machine noise hits all methods alike
                run = prefill_and_decode(models[method], prompt, args.new_tokens, dtype, CLOCKS[args.timer])
                if repeat >= args.warmup:
                    runs[method].append(run)
        for method in methods:
            prefill = [r["prefill_s"] for r in runs[method]]
            decode_tps = [batch_size * args.new_tokens / r["decode_s"] for r in runs[method]]
            rows.append(
                {
                    "preset": preset,
                    "method": method,
                    "batch_size": batch_size,
                    "params": built[method][1],
                    "prefill_s": {"min": min(prefill), "median": statistics.median(prefill), "max": max(prefill)},
                    "decode_tokens_per_s": {
                        "min": min(decode_tps),
                        "median": statistics.median(decode_tps),
                        "max": max(decode_tps),
                    },
                    "memory": runs[method][-1]["memory"],
                    "runs": runs[method],
                }
            )
    for row in rows:
        dense = next(r for r in rows if r["method"] == "dense" and r["batch_size"] == row["batch_size"])
        row["vs_dense"] = {
            "prefill_speedup": dense["prefill_s"]["median"] / row["prefill_s"]["median"],
            "decode_speedup": row["decode_tokens_per_s"]["median"] / dense["decode_tokens_per_s"]["median"],
            "memory": row["memory"]["total"] / dense["memory"]["total"],
        }
    return rows


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| preset | batch | method | params (M) | prefill (s) min / median / max | ×dense | decode tokens/s min / "
        "median / max | ×dense | weights + KV (MiB) | ×dense |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        p, d, ratio = row["prefill_s"], row["decode_tokens_per_s"], row["vs_dense"]
        lines.append(
            f"| {row['preset']} | {row['batch_size']} | {row['method']} | {row['params'] / 1e6:.1f} "
            f"| {p['min']:.3f} / **{p['median']:.3f}** / {p['max']:.3f} | {ratio['prefill_speedup']:.2f}× "
            f"| {d['min']:.1f} / **{d['median']:.1f}** / {d['max']:.1f} | {ratio['decode_speedup']:.2f}× "
            f"| {row['memory']['total'] / 2**20:,.0f} | {ratio['memory']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path, *, title: str) -> None:
    """Decode speed-up and memory against dense, per preset and batch size, with the command in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    groups = sorted({(r["preset"], r["batch_size"]) for r in rows}, key=lambda g: (g[0], g[1]))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / len(groups)
    for k, (preset, batch) in enumerate(groups):
        chosen = {r["method"]: r for r in rows if r["preset"] == preset and r["batch_size"] == batch}
        x = [i + k * width for i in range(len(methods))]
        axes[0].bar(x, [chosen[m]["vs_dense"]["decode_speedup"] for m in methods], width, label=f"{preset} b{batch}")
        axes[1].bar(x, [chosen[m]["vs_dense"]["memory"] for m in methods], width, label=f"{preset} b{batch}")
    titles = ("decode tokens/s ×dense (higher is better)", "weights + KV ×dense (lower is better)")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(methods))], methods, rotation=30)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="60m,350m")
    parser.add_argument("--methods", default=",".join(METHODS), help="dense is expected first (the reference)")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, all cores)")
    parser.add_argument("--timer", default="wall", choices=sorted(CLOCKS), help="wall clock or process CPU time")
    parser.add_argument("--dtype", default="fp32", help="fp32, bf16 or auto (autocast, as in training)")
    parser.add_argument("--out", default=None, help="output stem for .md/.json/.png")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dtype, probe = resolve_dtype(args.dtype, "cpu")
    load_at_start = os.getloadavg()
    rows = [row for preset in args.presets.split(",") for row in measure_preset(preset.strip(), args, dtype)]
    result = {
        "dtype": dtype,
        "precision_probe": probe and probe.to_dict(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_flags": sorted({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"} & cpu_flags()),
        "kernel_activations": str(kernel_dtype()).removeprefix("torch."),
        "load_average_start": load_at_start,
        "rows": rows,
    }
    table = markdown(result)
    print(table)
    if args.out:
        notes = [
            f"load average at the start: {tuple(round(x, 1) for x in load_at_start)}",
            f"CPU flags: {', '.join(result['cpu_flags'])}; kernels PyTorch dispatches to: "
            f"{result['cpu_capability']}; packed kernels' activations: {result['kernel_activations']}",
            f"precision: {dtype}; prompt {args.prompt_len} tokens, {args.new_tokens} decoded tokens, "
            f"{args.warmup} warm-up + {args.repeats} timed repeats, methods alternating; timer: {args.timer}",
        ]
        markdown_file = write(
            Path(args.out), "Inference: prefill and KV-cache decode", [table], data=result, notes=notes
        )
        plot(result, markdown_file.with_suffix(".png"), title=f"{command()}\n{machine()['cpu']}")


if __name__ == "__main__":
    main()
