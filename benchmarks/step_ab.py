"""``tensorslim bench`` on two versions of the code, each run in a fresh process, the versions taking turns.

``--before`` and ``--after`` are git commits; each one's ``tensorslim/`` is exported (``git archive``) into a temporary
directory, and every round runs ``python -m tensorslim bench <bench args>`` once with that directory first on
``PYTHONPATH`` (before, after; the next round after, before). Per version and row (method × precision) the table gives
the median over rounds of each run's median step, and the headline ratios: dense / method in the same
precision, fp32 / bf16 of the same method, and before / after.

Usage (the bench arguments follow ``--``):
    OMP_NUM_THREADS=1 python benchmarks/step_ab.py --before 947518a --after HEAD --rounds 2 \
        --out benchmarks/results/step_ab_350m_threads1_thread -- --preset 350m --batch-size 1 --seq-len 256 \
        --methods dense,cola --dtype fp32,bf16 --threads 1 --timer thread --warmup 1 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _results import table, write

REPO = Path(__file__).resolve().parent.parent


def export(commit: str, into: Path) -> str:
    """Writes ``commit``'s ``tensorslim/`` under ``into``; returns the full commit id."""
    sha = subprocess.run(["git", "rev-parse", commit], cwd=REPO, check=True, capture_output=True, text=True)
    archive = subprocess.run(
        ["git", "archive", sha.stdout.strip(), "tensorslim"], cwd=REPO, check=True, capture_output=True
    )
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return sha.stdout.strip()


def run_bench(code: Path, bench_args: list[str], out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(code))
    cmd = [sys.executable, "-m", "tensorslim", "bench", *bench_args, "--out", str(out)]
    subprocess.run(cmd, env=env, check=True, cwd=code, stdout=subprocess.DEVNULL)
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    return {row["label"]: row["step_time_s"] for row in rows}


def ratios(medians: dict[str, float]) -> dict[str, float]:
    """dense / method within a precision, and fp32 / bf16 of a method (labels look like ``cola bf16``)."""
    out = {}
    for label, seconds in medians.items():
        method, dtype = label.rsplit(" ", 1)
        if method != "dense" and f"dense {dtype}" in medians:
            out[f"{label}: dense / {method}"] = medians[f"dense {dtype}"] / seconds
        if dtype != "fp32" and f"{method} fp32" in medians:
            out[f"{label}: fp32 / {dtype}"] = medians[f"{method} fp32"] / seconds
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git commit of the code before the change")
    parser.add_argument("--after", required=True, help="git commit of the code after it")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", required=True, help="output stem for .md/.json")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="-- then the arguments of `tensorslim bench`")
    args = parser.parse_args()
    bench_args = args.bench_args[1:] if args.bench_args[:1] == ["--"] else args.bench_args
    times: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory() as tmp:
        code = {name: Path(tmp) / name for name in times}
        shas = {name: export(getattr(args, name), code[name]) for name in times}
        for round_ in range(args.rounds):
            for name in ("before", "after") if round_ % 2 == 0 else ("after", "before"):
                result = run_bench(code[name], bench_args, Path(tmp) / f"{name}{round_}")
                for label, seconds in result.items():
                    times[name].setdefault(label, []).append(seconds)
                print(name, round_, result, flush=True)
    medians = {name: {label: statistics.median(t) for label, t in rows.items()} for name, rows in times.items()}
    rows = []
    for label in medians["before"]:
        b, a = medians["before"][label], medians["after"][label]
        rows.append([label, f"{b:.3f}", f"{a:.3f}", f"{b / a:.3f}×"])
    before_r, after_r = ratios(medians["before"]), ratios(medians["after"])
    lines = [
        *table(["row", "before (s)", "after (s)", "before / after"], rows),
        *table(
            ["ratio", "before", "after"], [[key, f"{before_r[key]:.3f}×", f"{after_r[key]:.3f}×"] for key in before_r]
        ),
    ]
    print("\n".join(lines))
    note = (
        f"before {shas['before']}, after {shas['after']}; {args.rounds} rounds; each cell the median over rounds of "
        "one run's median step"
    )
    record = {"before": shas["before"], "after": shas["after"], "times_s": times}
    write(
        Path(args.out),
        "`tensorslim bench`, before and after, fresh processes in turns",
        lines,
        data=record,
        notes=[note],
    )


if __name__ == "__main__":
    main()
