"""Diagnostic, not a user-facing speed figure: one-thread CPU time of this round's kernel changes, before vs after,
side by side in one process (alternating repeats; each case's thread CPU time, so other processes on a shared
machine disturb it less than the wall clock).

1. TT linear 768×768 (CoMERA shapes [12,8,8 ‖ 8,8,12], r=30, bias), forward+backward on ``--tokens`` rows: the
   previous ``_FactoredMatmul`` (latent ``(B, r)``, ``addmm`` bias, column-sum bias gradient; kept below only as this
   diagnostic's baseline) vs :func:`tensorslim.functional.tt.tt_linear` as it is now (in round 3, when the results
   file was written: latent ``(r, B)``, bias as a GEMM row; since round 4, ``benchmarks/tt_kernel.py``), and dense
   ``nn.Linear``.
2. 4-bit ``QuantLinear`` forward at batch 1 (decode) for the ``350m`` MLP shape 1024→2736: dequantizing every call
   with the previous bit-by-bit unpacking, dequantizing every call now (``set_weight_cache(model, False)``), and the
   default cached dequantized weight; dense ``nn.Linear`` for reference.

Usage: ``python benchmarks/speed_fixes.py --repeats 20 --out benchmarks/results/speed_fixes_threads1``
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.bench.harness import machine_description
from tensorslim.bench.timing import alternate, summarize_ms
from tensorslim.functional.tt import tt_linear_factors
from tensorslim.layers.tt import TTConfig, TTLinear
from tensorslim.quant import RTNConfig, quantize_, set_weight_cache
from tensorslim.quant.quantizer import dequantize


class _PreviousFactoredMatmul(torch.autograd.Function):
    """The TT layer's token-dependent GEMMs as they were before this round (the diagnostic's baseline)."""

    @staticmethod
    def forward(ctx, x, left, right, bias):
        latent = x @ left  # (B, r)
        out = torch.addmm(bias, latent, right)  # (B, d_out)
        ctx.save_for_backward(x, left, right, latent)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, left, right, latent = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_latent = grad_out @ right.t()
        return grad_latent @ left.t(), (grad_latent.t() @ x).t(), latent.t() @ grad_out, grad_out.sum(0)


def _previous_unpack(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """The bit-by-bit unpacking every dequantizing call used before this round (the diagnostic's baseline)."""
    stream = (packed.to(torch.int32)[:, None] >> torch.arange(8, dtype=torch.int32)) & 1
    stream = stream.reshape(-1)[: numel * bits].reshape(numel, bits)
    return (stream * 2 ** torch.arange(bits, dtype=torch.int32)).sum(dim=1).to(torch.uint8)


def tt_cases(tokens: int) -> dict[str, Callable[[], object]]:
    torch.manual_seed(0)
    dense = nn.Linear(768, 768)
    tt = TTLinear.from_dense(dense, TTConfig(rank=30, init="random"))
    x = torch.randn(tokens, 768, requires_grad=True)
    grad = torch.randn(tokens, 768)
    params = [x, *tt.parameters()]

    def previous() -> list[torch.Tensor]:
        left, right = tt_linear_factors(list(tt.cores), n_in=tt.n_in)
        return torch.autograd.grad(_PreviousFactoredMatmul.apply(x, left, right, tt.bias), params, grad)

    def now() -> list[torch.Tensor]:
        return torch.autograd.grad(tt(x), params, grad)

    for a, b in zip(previous(), now(), strict=True):  # the two formulations agree before anything is timed
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * b.abs().max().item())
    return {
        "tt_previous": previous,
        "tt_now": now,
        "dense": lambda: torch.autograd.grad(dense(x), [x, *dense.parameters()], grad),
    }


@torch.no_grad()
def w4_cases() -> dict[str, Callable[[], object]]:
    torch.manual_seed(0)
    dense = nn.Linear(1024, 2736, bias=False)
    quantized = []
    for cache in (False, True):  # the same RTN codes twice: one model dequantizes per call, one keeps its cache
        model = nn.Sequential(nn.Linear(1024, 2736, bias=False))
        model[0].load_state_dict(dense.state_dict())
        quantize_(model, RTNConfig(bits=4), None)
        set_weight_cache(model, cache)
        quantized.append(model[0])
    packed, cached = quantized
    x = torch.randn(1, 1024)
    numel = packed.in_features * packed.out_features

    def previous() -> torch.Tensor:
        codes = _previous_unpack(packed.packed, packed.bits, numel).view(packed.out_features, packed.in_features)
        return F.linear(x, dequantize(codes, packed.grid))

    torch.testing.assert_close(previous(), packed(x), rtol=0, atol=0)
    torch.testing.assert_close(cached(x), packed(x), rtol=0, atol=0)
    return {
        "w4_per_call_previous": previous,
        "w4_per_call_now": lambda: packed(x),
        "w4_cached": lambda: cached(x),
        "dense": lambda: dense(x),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = {
        "command": "python benchmarks/speed_fixes.py " + " ".join(sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_description(),
        "tt_768_fwd_bwd": summarize_ms(alternate(tt_cases(args.tokens), repeats=args.repeats, clock=time.thread_time)),
        "w4_1024x2736_batch1": summarize_ms(alternate(w4_cases(), repeats=args.repeats, clock=time.thread_time)),
    }
    result["load_average_after"] = list(os.getloadavg())
    lines = [
        "# Diagnostic: one-thread CPU time of this round's kernel changes (not a wall-clock speed figure)",
        "",
        f"- command: `{result['command']}`",
        f"- date: {result['date']}; machine: {result['machine']['cpu']}, {result['machine']['cores']} cores, "
        f"torch {result['machine']['torch']}; load average before {result['machine']['load_average']}, "
        f"after {result['load_average_after']} (shared machine)",
        "",
        "| case | median (ms) | min (ms) | ×previous (median) |",
        "|---|---|---|---|",
    ]
    for group, previous in (("tt_768_fwd_bwd", "tt_previous"), ("w4_1024x2736_batch1", "w4_per_call_previous")):
        base = result[group][previous]["median_ms"]
        for name, t in result[group].items():
            lines.append(
                f"| {group}: {name} | {t['median_ms']:.2f} | {t['min_ms']:.2f} | {base / t['median_ms']:.2f}× |"
            )
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        Path(args.out).with_suffix(".md").write_text(table)
        Path(args.out).with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
