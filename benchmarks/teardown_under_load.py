"""Finished two-process runs beside busy processes: each must exit 0, without the teardown abort ("terminate
called without an active exception") and without a gloo thread left alive after the run.

Each run is ``tests.distributed.workers.teardown_main`` (two Trainer steps of ``tiny`` on two gloo processes, the
layouts cycling through dp, dp-shard (FSDP2), tp and tp-overlap), with ``--busy`` pure-Python spinning processes
beside it for the whole loop. The result file records every run and the machine.

    python benchmarks/teardown_under_load.py --runs 20 --busy 2 --out benchmarks/results/teardown_under_load.md
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _results import table, write  # noqa: E402

from tests.distributed.test_teardown import run_layout  # noqa: E402
from tests.distributed.workers import TEARDOWN_LAYOUTS  # noqa: E402

CORPUS = ["argparse", "ast", "calendar", "csv", "dataclasses", "difflib", "fractions", "functools", "heapq"]


def corpus(folder: Path) -> Path:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    folder.mkdir()
    for name in CORPUS:
        shutil.copy(stdlib / f"{name}.py", folder / f"{name}.txt")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--busy", type=int, default=2, help="spinning processes beside the runs")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    layouts = list(TEARDOWN_LAYOUTS)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    rows: list[tuple[int, str, float, list[str]]] = []
    loads: list[float] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            data = corpus(Path(tmp) / "corpus")
            for i in range(args.runs):
                layout = layouts[i % len(layouts)]
                start = time.monotonic()
                failures = run_layout(layout, data, Path(tmp) / f"run{i}")
                loads.append(os.getloadavg()[0])
                rows.append((i + 1, layout, time.monotonic() - start, failures))
                print(f"run {i + 1} {layout}: {failures or 'ok'}", flush=True)
                record(args, rows, loads)  # after every run, so an interrupted loop still leaves its record
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    sys.exit(0 if all(not failures for *_, failures in rows) else 1)


def record(args: argparse.Namespace, rows: list[tuple[int, str, float, list[str]]], loads: list[float]) -> None:
    passed = sum(not failures for *_, failures in rows)
    notes = [
        f"1-minute load average during the loop: {min(loads):.1f} to {max(loads):.1f}, {args.busy} busy processes",
        f"result: **{passed} of {len(rows)} runs clean** ({args.runs} planned; clean: exit 0, no abort, no gloo "
        "thread alive after the run)",
    ]
    body = [
        (number, layout, f"{seconds:.0f}", "; ".join(failures)[:300] if failures else "clean")
        for number, layout, seconds, failures in rows
    ]
    title = "Finished parallel runs beside busy processes: exit code, abort, gloo threads left"
    write(args.out, title, table(["run", "layout", "seconds", "result"], body), notes=notes)


if __name__ == "__main__":
    main()
