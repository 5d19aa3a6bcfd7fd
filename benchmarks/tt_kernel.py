"""The TT linear layer's kernel, before vs after this round, next to dense, at 1 and 2 threads (one process).

TT 768×768 (CoMERA shapes [12,8,8 ‖ 8,8,12], r=30, bias), forward+backward on ``--tokens`` rows, as
``benchmarks/comera_layers.py`` times it, in three cases that alternate within each repeat: dense ``nn.Linear``, the
TT layer with the previous kernel (round 3: BLAS GEMMs, latent kept ``(r, B)``; kept below only as this benchmark's
baseline), and the TT layer now (:func:`tensorslim.functional.tt.tt_linear`: oneDNN for the token-parallel GEMMs,
one token slice per thread for the sums over tokens).

``--timer wall`` (default) is what a user sees, on a quiet machine. ``--timer thread`` is a diagnostic for a loaded
machine: the main thread's CPU time, run with ``OMP_WAIT_POLICY=PASSIVE`` so that a thread waiting for the others
sleeps instead of spinning. The main thread takes part in every parallel region and runs every serial part, so its
CPU time approximates the step's critical path; it leaves out the time spent waiting for the other thread, so it
reads somewhat lower than a quiet wall clock (the TT layer at 2 threads: 14 vs 16–17 ms).

Usage: ``OMP_WAIT_POLICY=PASSIVE python benchmarks/tt_kernel.py --threads 1,2 --timer thread --out /tmp/tt_kernel``
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
from torch import nn

from tensorslim.bench.harness import machine_description
from tensorslim.bench.timing import alternate, summarize_ms
from tensorslim.functional.tt import tt_linear_factors
from tensorslim.layers.tt import TTConfig, TTLinear


class _Round3FactoredMatmul(torch.autograd.Function):
    """The TT layer's token-dependent GEMMs as they were before this round (this benchmark's baseline)."""

    @staticmethod
    def forward(ctx, x, left, right, bias):
        latent_t = left.t() @ x.t()  # (r, B)
        latent_t = torch.cat([latent_t, latent_t.new_ones(1, latent_t.shape[1])])  # (r+1, B)
        right = torch.cat([right, bias[None]])  # (r+1, d_out)
        ctx.save_for_backward(x, left, right, latent_t)
        return latent_t.t() @ right

    @staticmethod
    def backward(ctx, grad_out):
        x, left, right, latent_t = ctx.saved_tensors
        rank = left.shape[1]
        grad_out = grad_out.contiguous()
        grad_latent_t = right[:rank] @ grad_out.t()  # (r, B)
        grad_rows = latent_t @ grad_out  # (r+1, d_out)
        return grad_latent_t.t() @ left.t(), (grad_latent_t @ x).t(), grad_rows[:rank], grad_rows[rank]


def cases(tokens: int) -> dict[str, Callable[[], object]]:
    torch.manual_seed(0)
    dense = nn.Linear(768, 768)
    tt = TTLinear.from_dense(dense, TTConfig(rank=30, init="random"))
    x = torch.randn(tokens, 768, requires_grad=True)
    grad = torch.randn(tokens, 768)  # dense and contiguous, as from a real next layer
    params = [x, *tt.parameters()]

    def round3() -> list[torch.Tensor]:
        left, right = tt_linear_factors(list(tt.cores), n_in=tt.n_in)
        return torch.autograd.grad(_Round3FactoredMatmul.apply(x, left, right, tt.bias), params, grad)

    def now() -> list[torch.Tensor]:
        return torch.autograd.grad(tt(x), params, grad)

    for a, b in zip(round3(), now(), strict=True):  # the two kernels agree before anything is timed
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * b.abs().max().item())
    return {
        "dense": lambda: torch.autograd.grad(dense(x), [x, *dense.parameters()], grad),
        "tt_round3": round3,
        "tt_now": now,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts, each measured in turn")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--timer", choices=("wall", "thread"), default="wall")
    parser.add_argument("--out", default=None, help="write <out>.json and <out>.md")
    args = parser.parse_args()
    clock = time.perf_counter if args.timer == "wall" else time.thread_time
    steps = cases(args.tokens)
    runs = {}
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        load = os.getloadavg()
        timings = summarize_ms(alternate(steps, repeats=args.repeats, clock=clock))
        dense = timings["dense"]["median_ms"]
        runs[threads] = {
            "load_average_before": load,
            "timings": timings,
            "dense_over": {name: dense / row["median_ms"] for name, row in timings.items() if name != "dense"},
        }
    result = {
        "command": "python benchmarks/tt_kernel.py " + " ".join(sys.argv[1:]),
        "env": {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY")},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_description(),
        "tokens": args.tokens,
        "timer": args.timer,
        "runs": runs,
    }
    print(json.dumps(result, indent=2))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
        out.with_suffix(".md").write_text(markdown(result))


def markdown(result: dict) -> str:
    wait = result["env"]["OMP_WAIT_POLICY"]
    lines = [
        "# TT 768² layer kernel, forward + backward, before vs after (CPU, fp32)",
        "",
        f"- command: `{'OMP_WAIT_POLICY=' + wait + ' ' if wait else ''}{result['command']}`",
        f"- date: {result['date']}; machine: {result['machine']['cpu']}, {result['machine']['cores']} cores",
        f"- timer: {result['timer']} ({'wall clock' if result['timer'] == 'wall' else 'main-thread CPU time'}); "
        f"{result['tokens']} tokens; cases alternate within each repeat; medians",
        "",
        "| threads | load avg (1 min) | dense (ms) | TT round 3 (ms) | TT now (ms) | dense / round 3 | dense / now |",
        "|---|---|---|---|---|---|---|",
    ]
    for threads, run in result["runs"].items():
        t = run["timings"]
        lines.append(
            f"| {threads} | {run['load_average_before'][0]:.1f} | {t['dense']['median_ms']:.1f} | "
            f"{t['tt_round3']['median_ms']:.2f} | {t['tt_now']['median_ms']:.2f} | "
            f"{run['dense_over']['tt_round3']:.2f}× | **{run['dense_over']['tt_now']:.2f}×** |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
