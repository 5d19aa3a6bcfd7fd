"""The optimizer side of a bf16 step, on the shapes of the CoLA ``350m`` weights that autocast casts whole.

Cases, alternating in one process (``tensorslim.bench.timing.alternate``), all on the same fp32 weights and AdamW
state, from the same bf16 gradients:

- ``autocast``: what plain autocast costs around the update: the forward's fp32 → bf16 weight casts, the backward's
  bf16 → fp32 gradient casts, and the fused AdamW step;
- ``AdamW alone``: the fused step on ready fp32 gradients, the memory-bound pass no precision scheme avoids.

Usage:
    python benchmarks/bf16_adamw_pass.py --threads 1 --timer thread --out benchmarks/results/bf16_adamw_pass_threads1
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from _results import table, write
from torch import nn

from tensorslim.bench.timing import alternate
from tensorslim.layers.lowrank import LowRankLinear
from tensorslim.methods import build_for_method
from tensorslim.train.allocator import keep_freed_memory

CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}


def cast_weights(model: nn.Module) -> list[nn.Parameter]:
    """The weights autocast casts whole to bf16 in every forward: ``nn.Linear``'s and ``LowRankLinear``'s factors
    (``B`` only without rank gates), less any that another module also holds (a head tied to the embedding)."""
    holders: dict[int, int] = {}
    for module in model.modules():
        for param in module._parameters.values():
            if param is not None:
                holders[id(param)] = holders.get(id(param), 0) + 1
    found = []
    for module in model.modules():
        if type(module) is nn.Linear:
            found.append(module.weight)
        elif type(module) is LowRankLinear:
            found += [module.weight_a] + ([] if module.gated else [module.weight_b])
    return [p for p in found if p.requires_grad and holders[id(p)] == 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="350m")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timer", choices=sorted(CLOCKS), default="thread")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    torch.manual_seed(0)
    model, _, _ = build_for_method(args.preset, "cola")
    params = cast_weights(model)
    generator = torch.Generator().manual_seed(0)
    grads = [1e-3 * torch.randn(p.shape, generator=generator).bfloat16() for p in params]
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)
    for p, g in zip(params, grads, strict=True):  # the first step creates the state
        p.grad = g.float()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    def autocast_like() -> None:
        casts = [p.to(torch.bfloat16) for p in params]  # the forward's casts (kept until backward, as autocast does)
        for p, g in zip(params, grads, strict=True):
            p.grad = g.float()  # the backward's casts
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del casts

    fp32_grads = [g.float() for g in grads]

    def adamw_alone() -> None:
        for p, g in zip(params, fp32_grads, strict=True):
            p.grad = g
        optimizer.step()
        for p in params:
            p.grad = None

    cases = {"autocast (casts + AdamW)": autocast_like}
    cases["AdamW alone (fp32 gradients ready)"] = adamw_alone
    times = alternate(cases, repeats=args.repeats, warmup=1, clock=CLOCKS[args.timer])
    elements = sum(p.numel() for p in params)
    rows = [[name, f"{statistics.median(t):.3f}", f"{min(t):.3f}", f"{max(t):.3f}"] for name, t in times.items()]
    lines = table(["case", "median (s)", "min (s)", "max (s)"], rows)
    print("\n".join(lines))
    if args.out:
        title = (
            f"The optimizer side of a bf16 step ({args.preset} CoLA weights autocast casts: {len(params)} tensors, "
            f"{elements / 1e6:.1f} M elements)"
        )
        notes = [f"{args.timer} clock, {args.threads} thread(s); a diagnostic"]
        write(Path(args.out), title, lines, data={name: list(t) for name, t in times.items()}, notes=notes)


if __name__ == "__main__":
    main()
