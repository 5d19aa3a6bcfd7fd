"""The ``bert6`` masked-LM train step, before vs after the fifth round, dense and CoMERA, in one process.

The step is ``tensorslim bench``'s (``tensorslim.bench.harness``: batch 8 × 128, AdamW, the same synthetic batch). Four
cases alternate within each repeat: dense and CoMERA, each with the code as it was before this round and as it is
now. "Before" swaps back, for its own calls only, the four things this round changed (docs/speed.md, "Fifth round"):

* the dropout mask drawn in one serial ``torch.rand`` (now: slices drawn on all threads);
* TT cores contracted through autograd at the intra-op thread count (now: a written-out backward, on one thread
  up to 16.7 MFLOP, :func:`tensorslim.layers.tt.tt_factors`), and the TT embedding looked up at the thread count
  (now: on one thread, forward and backward, :func:`tensorslim.functional.threads.one_thread_graph`);
* the AdamW update at the thread count (now: on one thread when the parameters average under 32,768 elements);
* the slices of :func:`tensorslim.functional.tt.token_sum_mm` summed by ``.sum(0)`` (now: in-place adds).

``--timer wall`` (default) is what a user sees, on a quiet machine. ``--timer thread`` (the main thread's CPU time,
with ``OMP_WAIT_POLICY=PASSIVE``) is a diagnostic for a loaded machine; it leaves out the time the main thread
waits for the others, which is most of what this round removed. When the process runs with an ``LD_PRELOAD``
library that exports ``omp_regions()`` (``benchmarks/omp_regions.c``, which counts ``GOMP_parallel`` calls), the
OpenMP parallel regions opened per step are reported as well.

Usage: ``python benchmarks/bert6_step.py --threads 2 --repeats 5 --out /tmp/bert6_step``
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the CLI (tensorslim.cli.main); before torch loads OpenMP

import argparse  # noqa: E402
import ctypes  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

import tensorslim.functional.dropout as dropout_module  # noqa: E402
import tensorslim.functional.tt as tt_functional  # noqa: E402
import tensorslim.layers.tt as tt_layers  # noqa: E402
import tensorslim.layers.tt_embedding as tt_embedding  # noqa: E402
import tensorslim.train.optim as optim_module  # noqa: E402
from tensorslim.bench.harness import BenchConfig, _Arm, machine_description, synthetic_batch  # noqa: E402
from tensorslim.bench.timing import alternate, summarize_ms  # noqa: E402


def _round4_token_sum_mm(a: torch.Tensor, b: torch.Tensor, *, pieces: int | None = None) -> torch.Tensor:
    """:func:`tensorslim.functional.tt.token_sum_mm` as it was before this round (this benchmark's baseline)."""
    if pieces is None:
        pieces = torch.get_num_threads() if a.device.type == "cpu" else 1
    chunk = a.shape[0] // max(pieces, 1)
    if pieces <= 1 or chunk == 0:
        return a.t() @ b
    head = pieces * chunk
    a_head = a[:head].reshape(pieces, chunk, a.shape[1]).transpose(1, 2)
    out = torch.bmm(a_head, b[:head].reshape(pieces, chunk, b.shape[1])).sum(0)
    if head < a.shape[0]:
        out.addmm_(a[head:].t(), b[head:])
    return out


def _at_thread_count(fn, *inputs):
    """``one_thread_graph`` before this round: the function run as is, at the intra-op thread count."""
    return tuple(fn(*inputs))


def _round4_tt_factors(layers):
    """``tt_factors`` before this round: autograd records each layer's contraction at the thread count."""
    return [tt_functional.tt_linear_factors(layer.effective_cores(), n_in=layer.n_in) for layer in layers]


@contextmanager
def before() -> Iterator[None]:
    """The code as it was before this round, for the calls made inside the block."""
    saved = (
        dropout_module._SPLIT_MIN,
        tt_functional.token_sum_mm,
        tt_layers.tt_factors,
        tt_embedding.one_thread_graph,
        optim_module.update_small_on_one_thread,
    )
    dropout_module._SPLIT_MIN = 1 << 62  # never split: one torch.rand
    tt_functional.token_sum_mm = _round4_token_sum_mm
    tt_layers.tt_factors = _round4_tt_factors
    tt_embedding.one_thread_graph = _at_thread_count
    optim_module.update_small_on_one_thread = lambda optimizer: optimizer  # only read when an optimizer is built
    try:
        yield
    finally:
        (
            dropout_module._SPLIT_MIN,
            tt_functional.token_sum_mm,
            tt_layers.tt_factors,
            tt_embedding.one_thread_graph,
            optim_module.update_small_on_one_thread,
        ) = saved


@contextmanager
def now() -> Iterator[None]:
    yield


def _region_counter() -> Callable[[], int] | None:
    """``omp_regions()`` from an ``LD_PRELOAD``-ed counter (benchmarks/omp_regions.c), or None."""
    try:
        count = ctypes.CDLL(None).omp_regions
    except AttributeError:
        return None
    count.restype = ctypes.c_longlong
    return count


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    clock = {"thread": time.thread_time, "cpu": time.process_time}.get(args.timer, time.perf_counter)
    config = BenchConfig(preset=args.preset, task="mlm", methods="comera", batch_size=args.batch_size, seq_len=128)
    batch = synthetic_batch(config)
    variants = {"before": before, "now": now}
    arms = {}
    for method in args.methods.split(","):
        for name, variant in variants.items():
            with variant():
                arms[f"{method} {name}"] = (_Arm(config, method), variant)
    regions = _region_counter()
    region_counts: dict[str, int] = {}

    def case(label: str) -> Callable[[], None]:
        arm, variant = arms[label]

        def step() -> None:
            start = regions() if regions else 0
            with variant():
                arm.step(batch, timed=False, clock=time.perf_counter)
            if regions:
                region_counts[label] = regions() - start

        return step

    load_before = os.getloadavg()
    times = alternate({label: case(label) for label in arms}, repeats=args.repeats, warmup=args.warmup, clock=clock)
    summary = summarize_ms(times)
    ratios = {
        name: summary[f"dense {name}"]["median_ms"] / summary[f"comera {name}"]["median_ms"]
        for name in variants
        if f"dense {name}" in summary and f"comera {name}" in summary
    }
    env = " ".join(f"{key}={os.environ[key]}" for key in ("LD_PRELOAD", "OMP_WAIT_POLICY") if os.environ.get(key))
    return {
        "command": f"{env} python " + " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_description(),
        "load_average_before_after": [load_before, os.getloadavg()],
        "timer": args.timer,
        "threads": args.threads,
        "steps": summary,
        "dense_over_comera": ratios,
        "omp_regions_per_step": region_counts or None,
    }


def _kind(result: dict) -> str:
    """Whether the figures are what a user sees (wall clock on a quiet machine) or a diagnostic."""
    loaded = max(load[0] for load in result["load_average_before_after"]) > 1.5
    if result["timer"] == "wall" and not loaded:
        return "wall clock on a quiet machine: what a user sees"
    why = "shared, loaded machine" if loaded else "not the wall clock"
    return f"diagnostic ({why}): the ratios side by side count, not the absolute times"


def markdown(result: dict) -> str:
    timer = {"wall": "wall clock", "thread": "main-thread CPU time (diagnostic)", "cpu": "process CPU time"}
    machine = result["machine"]
    lines = [
        "# bert6 MLM train step, before vs after the fifth round (one process, cases alternating)",
        "",
        f"- command: `{result['command']}`",
        f"- date: {result['date']}; timer: {timer[result['timer']]}, threads: {result['threads']}",
        f"- machine: {machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}, "
        f"OMP_WAIT_POLICY={machine['omp_wait_policy']}",
        "- load average (1, 5, 15 min) before / after: "
        + " / ".join(", ".join(f"{x:.2f}" for x in load) for load in result["load_average_before_after"]),
        f"- {_kind(result)}",
        "",
        "| case | median (ms) | min | max | n | OpenMP regions per step |",
        "|---|---|---|---|---|---|",
    ]
    regions = result["omp_regions_per_step"] or {}
    for label, row in result["steps"].items():
        lines.append(
            f"| {label} | **{row['median_ms']:.1f}** | {row['min_ms']:.1f} | {row['max_ms']:.1f} | {row['n']} | "
            f"{regions.get(label, '–')} |"
        )
    lines += ["", "| code | dense ÷ CoMERA |", "|---|---|"]
    lines += [f"| {name} | **{ratio:.2f}×** |" for name, ratio in result["dense_over_comera"].items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="bert6")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--methods", default="dense,comera")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--timer", choices=("wall", "thread", "cpu"), default="wall")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
