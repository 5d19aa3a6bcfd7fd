"""How long idle OpenMP threads should spin before they sleep: train-step speed per wait policy, quiet and loaded.

PyTorch's Linux wheels run their CPU kernels on GNU OpenMP (libgomp). Between two parallel regions a worker thread
spins ``GOMP_SPINCOUNT`` times, then sleeps on a futex; ``OMP_WAIT_POLICY=PASSIVE`` sleeps at once. Spinning makes
the next region start sooner, which matters for a step made of many short regions (CoLA's rank-r products), but a
spinning thread takes a core from any other process that wants it. This script measures both sides.

Each (workload, policy) runs in a fresh process (the policy is read when libgomp loads), the policies taking turns,
while ``--loads`` busy-loop processes (other jobs' stand-ins) run beside it. The figure is the median wall-clock step
over ``--seconds`` of steady steps, after warm-up; the ratio is against ``passive`` at the same load.

Usage:
    python benchmarks/openmp_wait.py --workloads tiny-cola --loads 0,1,2 --out benchmarks/results/openmp_wait_tiny
    python benchmarks/openmp_wait.py --workloads 350m-cola-fp32,350m-dense-fp32,350m-cola-bf16,350m-dense-bf16 \
        --loads 0,1 --out benchmarks/results/openmp_wait_350m
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _results import table, write

# name -> (preset, method, dtype, batch size, sequence length); tiny-cola is `make demo`'s step
WORKLOADS = {
    "tiny-cola": ("tiny", "cola", "fp32", 16, 128),
    "350m-cola-fp32": ("350m", "cola", "fp32", 1, 256),
    "350m-dense-fp32": ("350m", "dense", "fp32", 1, 256),
    "350m-cola-bf16": ("350m", "cola", "bf16", 1, 256),
    "350m-dense-bf16": ("350m", "dense", "bf16", 1, 256),
}
HOG = "while True: pass"


def policy_env(policy: str) -> dict[str, str]:
    """``passive``, ``default`` (libgomp's own: 300,000 spins) or ``spin:N``, as environment variables."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if policy == "passive":
        return {**env, "OMP_WAIT_POLICY": "PASSIVE"}
    if policy == "default":
        return env
    if policy.startswith("spin:") and policy[5:].isdigit():
        return {**env, "GOMP_SPINCOUNT": policy[5:]}
    raise ValueError(f"policy={policy!r}; allowed: passive, default, spin:N")


def child(workload: str, seconds: float, warmup: int) -> dict[str, float]:
    """Steady-state step times of one workload in this process (run with the policy's environment)."""
    import torch

    from tensorslim.methods import build_for_method
    from tensorslim.tasks.lm import causal_lm_loss
    from tensorslim.train.allocator import keep_freed_memory
    from tensorslim.train.execution import autocast
    from tensorslim.train.optim import build_optimizer

    preset, method, dtype, batch_size, seq_len = WORKLOADS[workload]
    keep_freed_memory()  # as training and `tensorslim bench` do
    torch.manual_seed(0)
    model, _, _ = build_for_method(preset, method, max_seq_len=seq_len)
    optimizer = build_optimizer(model, lr=1e-4, weight_decay=0.0)
    batch = torch.randint(model.config.vocab_size, (batch_size, seq_len))

    def step() -> None:
        with autocast(dtype, "cpu"):
            loss = causal_lm_loss(model(batch), batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {"step_s": median, "steps": len(times), "tokens_per_s": batch_size * seq_len / median}


def run_one(workload: str, policy: str, seconds: float, warmup: int) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", workload, "--seconds", str(seconds), "--warmup", str(warmup)]
    result = subprocess.run(command, env=policy_env(policy), capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace) -> list[dict[str, object]]:
    rows = []
    for load in args.loads:
        hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(load)]
        try:
            time.sleep(1)
            for round_index in range(args.rounds):
                for workload in args.workloads:
                    for policy in args.policies:  # in turns, so that drifts hit every policy alike
                        figures = run_one(workload, policy, args.seconds, args.warmup)
                        rows.append(
                            {"load": load, "round": round_index, "workload": workload, "policy": policy, **figures}
                        )
                        print(json.dumps(rows[-1]), flush=True)
        finally:
            for hog in hogs:
                hog.kill()
    return rows


def policy_table(rows: list[dict[str, object]], policies: list[str]) -> list[str]:
    """Median step time per workload and load, one column per policy, with passive's median over each."""
    cells = []
    keys = dict.fromkeys((r["workload"], r["load"]) for r in rows)
    for workload, load in keys:
        median = {
            p: statistics.median(
                r["step_s"] for r in rows if (r["workload"], r["load"], r["policy"]) == (workload, load, p)
            )
            for p in policies
        }
        base = median.get("passive")
        shown = [f"{median[p]:.3f} s" + (f" ({base / median[p]:.2f}×)" if base else "") for p in policies]
        cells.append([workload, load, *shown])
    return table(["workload", "other busy processes", *policies], cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="tiny-cola", type=lambda s: s.split(","))
    parser.add_argument("--policies", default="passive,spin:3000,spin:10000,spin:100000", type=lambda s: s.split(","))
    parser.add_argument("--loads", default="0,1", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--seconds", type=float, default=8.0, help="steady steps timed per run")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.seconds, args.warmup)))
        return
    for name in args.workloads:
        if name not in WORKLOADS:
            parser.error(f"workload {name!r}; allowed: {', '.join(WORKLOADS)}")
    for policy in args.policies:
        policy_env(policy)
    rows = measure(args)
    lines = policy_table(rows, args.policies)
    print("\n".join(lines))
    if args.out:
        note = "figure: median wall-clock step (s) at torch's thread count; in brackets, passive's median / this one's"
        title = "Train-step time per OpenMP wait policy, quiet and with busy processes beside it"
        write(args.out, title, lines, data=rows, notes=[note])


if __name__ == "__main__":
    main()
