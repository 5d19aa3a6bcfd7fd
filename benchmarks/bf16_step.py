"""The bf16 train step, fp32 vs autocast, on one model in one process, and where its time goes.

Variants (one LLaMA model, its fused AdamW and freed memory kept in the process, as in ``tensorslim bench``):

- ``fp32``: no autocast;
- ``autocast``: plain bf16 autocast (every forward casts the fp32 weights, backward casts their gradients back), what
  ``--dtype bf16`` trains with;
- ``fp32+compile``, ``autocast+compile``: the same with the model's blocks compiled by TorchInductor, as
  ``--compile`` does (``tensorslim.train.execution.compile_model``). A compiled variant needs its own process
  (``--processes``), since compiling is in place; its first step (compilation included) is timed on the wall clock
  and reported apart from the steady steps.

The variants alternate step by step (``tensorslim.bench.timing.alternate``). They all step the same model, so the
losses are not a comparison; the times are. Alternating in one process
has a catch: each variant frees and allocates differently, so the heap that one variant leaves makes the next one
fault in fresh pages (a 52 ms instead of 3 ms zero fill of the `60m` embedding gradient, seen in the profile). With
``--processes N`` each variant runs alone in a fresh process instead, the variants taking turns, N rounds.

With ``--profile`` one step of each variant also runs under torch.profiler: self time per operator family, split
into forward, backward and optimizer, and the GEMMs' achieved GFLOP/s from their shapes.

Usage (``OMP_WAIT_POLICY=PASSIVE`` as the CLI sets it; ``--method dense`` for the dense model, ``--method cola,dense``
with ``--processes`` for both, their processes taking turns):
    OMP_WAIT_POLICY=PASSIVE python benchmarks/bf16_step.py --preset 350m --threads 2 --timer wall --processes 2 \
        --warmup 2 --repeats 3 --profile --out benchmarks/results/bf16_step_350m_threads2_wall
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import _results
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from tensorslim.bench.timing import alternate
from tensorslim.methods import build_for_method
from tensorslim.tasks.lm import causal_lm_loss
from tensorslim.train.allocator import keep_freed_memory
from tensorslim.train.execution import autocast, compile_model
from tensorslim.train.optim import build_optimizer

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time, "thread": time.thread_time}
PHASES = ("forward", "backward", "optimizer")
# The work no change of precision bookkeeping removes: the products themselves and the one pass AdamW must make.
FLOOR = ("GEMMs (blocks)", "LM head GEMMs", "attention (flash)", "attention (bmm)", "AdamW kernel")
GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "mkldnn::_linear_pointwise")
VARIANTS = ("fp32", "autocast", "fp32+compile", "autocast+compile")
# Profiler events whose self time is TorchInductor's generated (fused) kernels: they carry no event of their own.
COMPILED = ("CompiledFxGraph", "CompiledFunction", "Compiled Region", "cpp_fused")


def make_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor, variant: str):
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r}; allowed: {', '.join(VARIANTS)}")

    def step() -> None:
        with record_function("forward"), autocast("bf16" if variant.startswith("autocast") else "fp32", "cpu"):
            loss = causal_lm_loss(model(batch), batch)
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return step


def gemm_flops(name: str, shapes: list[list[int]]) -> float:
    """FLOPs of one GEMM call from its input shapes (``mm``, ``addmm``, ``bmm``, oneDNN's linear)."""
    if name in ("aten::addmm", "aten::baddbmm"):
        shapes = shapes[1:]
    (a, b) = shapes[:2]
    if name == "mkldnn::_linear_pointwise":  # a (M, K), weight (N, K)
        return 2.0 * a[0] * a[1] * b[0]
    if name in ("aten::bmm", "aten::baddbmm"):
        return 2.0 * a[0] * a[1] * a[2] * b[2]
    return 2.0 * a[0] * a[1] * b[1]


def family(name: str, shapes: list[list[int]], vocab: int, attention_batch: int) -> str:
    """The operator family of one profiler event; ``attention_batch`` (batch × heads) tells attention's batched
    products (bf16 on CPU: ``tensorslim.functional.attention.matmul_causal_attention``) from other ``bmm``."""
    short = name.split("::")[-1]
    if any(tag in name for tag in COMPILED):
        return "fused kernels (Inductor)"
    if short in ("bmm", "baddbmm") and shapes and len(shapes[-1]) == 3 and shapes[-1][0] == attention_batch:
        return "attention (bmm)"
    if name in GEMMS:
        return "LM head GEMMs" if any(vocab in s for s in shapes) else "GEMMs (blocks)"
    if "scaled_dot_product" in short:
        return "attention (flash)"
    if short in ("_log_softmax", "_log_softmax_backward_data", "nll_loss_forward", "nll_loss_backward"):
        return "cross-entropy"
    if short.startswith("_fused_adam"):
        return "AdamW kernel"
    if short in ("copy_", "_to_copy"):
        return "casts and copies"
    if short == "cat":
        return "cat (stacked weights, latents)"
    if short in ("fill_", "zero_", "zeros", "empty", "empty_strided", "empty_like", "resize_"):
        return "allocation and zero fills"
    return "elementwise, norms, activations, other"


def profile_step(step: Callable[[], None], vocab: int, attention_batch: int) -> dict:
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    gemm = defaultdict(lambda: [0.0, 0.0, 0])  # shape key -> [seconds, flops, calls]
    kernels = defaultdict(lambda: [0.0, 0])  # Inductor kernel name -> [seconds, calls]
    for event in prof.events():
        phase, parent = None, event
        while parent is not None:
            if parent.name in PHASES:
                phase = parent.name
            parent = parent.cpu_parent
        if phase is None or event.name in PHASES:
            continue
        label = family(event.name, event.input_shapes or [], vocab, attention_batch)
        seconds[phase][label] += event.self_cpu_time_total / 1e6
        if event.name in GEMMS and event.input_shapes:
            first = 1 if event.name in ("aten::addmm", "aten::baddbmm") else 0
            key = f"{event.name.split('::')[-1]} {event.input_shapes[first]} x {event.input_shapes[first + 1]}"
            entry = gemm[key]
            entry[0] += event.self_cpu_time_total / 1e6
            entry[1] += gemm_flops(event.name, event.input_shapes)
            entry[2] += 1
        if "cpp_fused" in event.name:  # only with TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE=1
            kernels[event.name][0] += event.self_cpu_time_total / 1e6
            kernels[event.name][1] += 1
    return {"families": {p: dict(v) for p, v in seconds.items()}, "gemms": dict(gemm), "kernels": dict(kernels)}


def markdown(times: dict[str, list[float]], profiles: dict[str, dict], first: str) -> str:
    medians = {name: statistics.median(t) for name, t in times.items()}
    lines = [f"| variant | median (s) | min (s) | max (s) | {first} / variant |", "|---|---|---|---|---|"]
    for name, t in times.items():
        lines.append(
            f"| {name} | {medians[name]:.3f} | {min(t):.3f} | {max(t):.3f} | {medians[first] / medians[name]:.3f}× |"
        )
    text = "\n".join(lines) + "\n"
    for name, prof in profiles.items():
        fams = prof["families"]
        labels = sorted({k for v in fams.values() for k in v}, key=lambda k: -sum(fams[p].get(k, 0) for p in fams))
        total = sum(sum(v.values()) for v in fams.values())
        text += f"\n### Profile of one `{name}` step (self time, s)\n\n| family | " + " | ".join(PHASES)
        text += " | total | share |\n|---|" + "---|" * (len(PHASES) + 2) + "\n"
        for label in [*labels, "total"]:
            row = [
                sum(fams.get(p, {}).values()) if label == "total" else fams.get(p, {}).get(label, 0.0) for p in PHASES
            ]
            cells = " | ".join(f"{x:.3f}" for x in row)
            text += f"| {label} | {cells} | {sum(row):.3f} | {100 * sum(row) / total:.1f} % |\n"
        gemms = prof["gemms"]
        secs, flops = sum(v[0] for v in gemms.values()), sum(v[1] for v in gemms.values())
        share = sum(fams[p].get(k, 0.0) for p in fams for k in FLOOR) / total
        text += (
            f"\nFloor: {', '.join(FLOOR)} are {100 * share:.1f} % of the profiled time; that share of the median "
            f"step ({medians[name]:.3f} s) is **{share * medians[name]:.3f} s**, what the step would take if nothing "
            f"else took time.\n"
        )
        text += (
            f"\nGEMMs: {flops / 1e9:.1f} GFLOP in {secs:.3f} s = **{flops / secs / 1e9:.0f} GFLOP/s**. By shape:\n\n"
        )
        text += "| GEMM (input shapes) | calls | s | GFLOP/s |\n|---|---|---|---|\n"
        for key, (s, f, n) in sorted(gemms.items(), key=lambda kv: -kv[1][0])[:16]:
            text += f"| {key} | {n} | {s:.3f} | {f / s / 1e9:.0f} |\n"
        kernels = prof.get("kernels", {})
        if kernels:
            text += "\nInductor's fused kernels (TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE=1), the 20 slowest:\n\n"
            text += "| kernel | calls | s | share of the step's profile |\n|---|---|---|---|\n"
            for key, (s, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:20]:
                text += f"| {key} | {n} | {s:.3f} | {100 * s / total:.1f} % |\n"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="350m")
    parser.add_argument("--method", default="cola", help="a method, or several (comma-separated) with --processes")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--timer", choices=sorted(CLOCKS), default="wall")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variants", default="fp32,autocast", help=f"comma-separated: {', '.join(VARIANTS)}")
    parser.add_argument("--profile", action="store_true", help="also profile one step of each variant")
    parser.add_argument("--processes", type=int, default=0, help="N rounds of one fresh process per variant")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a child of --processes
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.processes:
        return drive(args)
    if "," in args.method:
        raise ValueError(f"method={args.method!r}: several methods need --processes (one model per process)")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    keep_freed_memory()
    torch.manual_seed(0)
    model, _, _ = build_for_method(args.preset, args.method, max_seq_len=args.seq_len)
    optimizer = build_optimizer(model, lr=1e-4, weight_decay=0.0)
    vocab = model.config.vocab_size
    batch = torch.randint(vocab, (args.batch_size, args.seq_len), generator=torch.Generator().manual_seed(0))
    names = args.variants.split(",")
    first_steps = {}
    if any(name.endswith("+compile") for name in names):
        if len(names) > 1:
            raise ValueError(f"variants={args.variants!r}: a compiled variant runs alone (use --processes)")
        compile_model(model)
        start = time.perf_counter()  # wall clock: Inductor builds its C++ kernels in worker processes
        make_step(model, optimizer, batch, names[0])()
        first_steps[names[0]] = time.perf_counter() - start
    cases = {name: make_step(model, optimizer, batch, name) for name in names}
    times = alternate(cases, repeats=args.repeats, warmup=args.warmup, clock=CLOCKS[args.timer])
    attention_batch = args.batch_size * model.config.n_heads
    profiles = {}
    if args.profile:
        profiles = {name: profile_step(step, vocab, attention_batch) for name, step in cases.items()}
    if args.json:
        print(json.dumps({"times_s": times, "profiles": profiles, "first_step_wall_s": first_steps}))
        return None
    report(args, times, profiles, {name: [t] for name, t in first_steps.items()})
    return None


def drive(args: argparse.Namespace) -> None:
    """``--processes``: every variant in its own fresh process, in turns; the first round's children profile."""
    times: dict[str, list[float]] = defaultdict(list)
    profiles: dict[str, dict] = {}
    first_steps: dict[str, list[float]] = defaultdict(list)
    methods = args.method.split(",")
    for round_ in range(args.processes):
        for method, name in itertools.product(methods, args.variants.split(",")):
            child = [sys.executable, __file__, "--json", "--variants", name, "--method", method]
            for key in ("preset", "batch_size", "seq_len", "threads", "timer", "warmup", "repeats"):
                if getattr(args, key) is not None:
                    child += ["--" + key.replace("_", "-"), str(getattr(args, key))]
            child += ["--profile"] if args.profile and round_ == 0 else []
            found = json.loads(
                subprocess.run(child, check=True, capture_output=True, text=True).stdout.splitlines()[-1]
            )
            label = name if len(methods) == 1 else f"{method} {name}"
            times[label] += found["times_s"][name]
            if name in found["profiles"]:
                profiles[label] = found["profiles"][name]
            for seconds in found["first_step_wall_s"].values():
                first_steps[label].append(seconds)
            print(f"round {round_} {label}: {found['times_s'][name]}", file=sys.stderr, flush=True)
    report(args, dict(times), profiles, dict(first_steps))


def first_step_table(first_steps: dict[str, list[float]]) -> str:
    """The compiled variants' first steps (wall clock, compilation included), one per process in order."""
    if not first_steps:
        return ""
    text = "\n| compiled variant | first step per process, wall clock (s) |\n|---|---|\n"
    for name, seconds in first_steps.items():
        text += f"| {name} | {', '.join(f'{s:.1f}' for s in seconds)} |\n"
    return text


def report(args: argparse.Namespace, times: dict, profiles: dict, first_steps: dict[str, list[float]]) -> None:
    """Print the tables and, with ``--out``, write them and the raw figures through ``_results``."""
    first = next(iter(times))
    threads = args.threads or torch.get_num_threads()
    text = markdown(times, profiles, first) + first_step_table(first_steps)
    print(text)
    if args.out:
        note = (
            f"{args.timer} clock, {threads} thread(s); a diagnostic. The profiler's self times are wall clock per op "
            "and grow with the load, so read the shares (and the GEMM rates as lower bounds)"
        )
        title = f"bf16 train step ({args.method} {args.preset}, batch {args.batch_size} × {args.seq_len})"
        data = {"args": vars(args), "times_s": times, "first_step_wall_s": first_steps, "profiles": profiles}
        _results.write(Path(args.out), title, text.splitlines(), data=data, notes=[note])


if __name__ == "__main__":
    main()
