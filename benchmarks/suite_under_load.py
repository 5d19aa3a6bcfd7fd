"""The test suite quiet and beside busy processes: wall time and pass/fail of each run.

Each round runs ``pytest`` (the same arguments every time) once with no extra load and once with ``--busy``
pure-Python spinning processes beside it; the result file records both, the load average and the machine. By
default the whole suite as ``make test`` runs it; ``--tests`` narrows it (e.g. ``tests/distributed``).

    python benchmarks/suite_under_load.py --rounds 3 --busy 2 --out benchmarks/results/suite_under_load.md
    python benchmarks/suite_under_load.py --rounds 1 --busy 2 --tests tests/distributed --out /tmp/dist.md
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from _results import table, write

ROOT = Path(__file__).resolve().parents[1]


def run_suite(tests: list[str], workers: int, busy: int) -> tuple[float, int, str, float]:
    """``(seconds, exit code, pytest's summary line, 1-minute load at the end)`` of one run beside ``busy``
    spinning processes."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        start = time.monotonic()
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers), *tests]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        seconds = time.monotonic() - start
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    summary = next((line for line in reversed(done.stdout.splitlines()) if " in " in line), "no summary")
    return seconds, done.returncode, summary.strip("= "), os.getloadavg()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--busy", type=int, default=2, help="spinning processes beside the loaded runs")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (make test: 2)")
    parser.add_argument("--tests", nargs="*", default=[], help="test paths (default: the whole suite)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = []
    for round_number in range(1, args.rounds + 1):
        for busy in (0, args.busy):
            seconds, code, summary, load = run_suite(args.tests, args.workers, busy)
            rows.append((round_number, busy, seconds, code, summary, load))
            print(f"round {round_number}, {busy} busy: {seconds:.0f} s, exit {code}, {summary}", flush=True)
            record(args, rows)


def record(args: argparse.Namespace, rows: list[tuple[int, int, float, int, str, float]]) -> None:
    notes = [f"tests: {' '.join(args.tests) or 'the whole suite'}, `pytest -q -n {args.workers}`"]
    body = [(r, b, f"{s:.0f}", c, summary, f"{load:.1f}") for r, b, s, c, summary, load in rows]
    columns = ["round", "busy processes", "seconds", "exit", "pytest", "load at the end"]
    write(args.out, f"The test suite quiet and beside {args.busy} busy processes", table(columns, body), notes=notes)


if __name__ == "__main__":
    main()
