"""The test suite quiet and beside busy processes: wall time and pass/fail of each run.

Each round runs ``pytest`` (the same arguments every time) once with no extra load and once with ``--busy``
pure-Python spinning processes beside it; the result file records both, the load average and the machine. By
default the whole suite as ``make test`` runs it; ``--tests`` narrows it (e.g. ``tests/distributed``).

``--fresh-clone`` runs what CI runs (``.ci/run``: ``make test``) on a fresh clone of the commit checked out here, in
a temporary folder, beside ``--busy`` spinning processes, once per round: no file that is not committed, no cache and
no build output of this checkout takes part. The clone uses the virtual environment that runs this script (make's
``BIN``; its set-up steps, which install packages, are not run) with the clone first on ``PYTHONPATH``, so that the
clone's code is what the tests and their subprocesses import. Each round appends a row to the result file (its JSON
keeps the rows of earlier runs): date, commit, wall time, exit code, pytest's summary line, load before and after, CPU
kind. With ``--tests``, the clone runs ``pytest`` on those paths instead of ``make test`` (a quick check).

    python benchmarks/suite_under_load.py --rounds 3 --busy 2 --out benchmarks/results/suite_under_load.md
    python benchmarks/suite_under_load.py --rounds 1 --busy 2 --tests tests/distributed --out /tmp/dist.md
    python benchmarks/suite_under_load.py --fresh-clone --busy 2 --out benchmarks/results/suite_fresh_clone.md
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from _results import cpu_kind, table, write

ROOT = Path(__file__).resolve().parents[1]


# pytest's last line: "==== 3 failed, 1431 passed, 2 skipped in 2280.51s (0:38:00) ====" (-q drops the "="s)
SUMMARY = re.compile(
    r"^=*\s*((\d+ (passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?)|no tests ran)\b.* in .*?)\s*=*$"
)


@contextmanager
def spinning(busy: int) -> Iterator[None]:
    """``busy`` pure-Python processes spinning on the CPU while the block runs."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def pytest_summary(output: str) -> str:
    """pytest's summary line in ``output`` (the last one: make test runs pytest once), or ``"no summary"``."""
    found = [match.group(1) for line in output.splitlines() if (match := SUMMARY.match(line.strip()))]
    return found[-1] if found else "no summary"


def run_suite(tests: list[str], workers: int, busy: int) -> tuple[float, int, str, float]:
    """``(seconds, exit code, pytest's summary line, 1-minute load at the end)`` of one run beside ``busy``
    spinning processes."""
    with spinning(busy):
        start = time.monotonic()
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers), *tests]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        seconds = time.monotonic() - start
    return seconds, done.returncode, pytest_summary(done.stdout), os.getloadavg()[0]


def clone_head(into: Path) -> str:
    """A fresh clone of the commit checked out in this repository, in ``into``; its commit."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    commit = commit.stdout.strip()
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(into)], check=True)
    subprocess.run(["git", "checkout", "--quiet", "--detach", commit], cwd=into, check=True)
    return commit


def ci_command(tests: list[str], workers: int) -> list[str]:
    """``make test`` with this script's virtual environment as ``BIN``, its set-up targets taken as done (``-o``:
    they install packages into it); with ``tests``, pytest on those paths alone."""
    bin_dir = Path(sys.prefix) / "bin"
    if tests:
        return [str(bin_dir / "python"), "-m", "pytest", "-q", "-n", str(workers), "--durations=15", *tests]
    done = [arg for target in (".installed", ".installed-llama-cpp") for arg in ("-o", str(bin_dir / target))]
    return ["make", "test", f"BIN={bin_dir}", *done]


def run_fresh_clone(tests: list[str], workers: int, busy: int) -> dict[str, Any]:
    """One run of :func:`ci_command` on a fresh clone beside ``busy`` spinning processes: its row."""
    with tempfile.TemporaryDirectory(prefix="tensorslim-clone-") as tmp:
        clone = Path(tmp) / "tensorslim"
        commit = clone_head(clone)
        command = ci_command(tests, workers)
        env = {**os.environ, "PYTHONPATH": str(clone)}
        load_before = os.getloadavg()[0]
        with spinning(busy):
            start = time.monotonic()
            done = subprocess.run(command, cwd=clone, env=env, capture_output=True, text=True)
            seconds = time.monotonic() - start
    output = done.stdout + done.stderr
    return {
        "date": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        "commit": commit[:12],
        "command": " ".join(command).replace(sys.prefix, "<venv>"),  # no path of this machine in the record
        "busy": busy,
        "seconds": round(seconds),
        "exit": done.returncode,
        "pytest": pytest_summary(done.stdout),
        "load_before": round(load_before, 1),
        "load_after": round(os.getloadavg()[0], 1),
        "cpu": cpu_kind(),
        "tail": output.splitlines()[-40:] if done.returncode else [],  # what failed, for a red run
    }


def earlier_rows(out: Path) -> list[dict[str, Any]]:
    """The rows a previous ``--fresh-clone`` run wrote to ``out``'s JSON (none when there is none)."""
    path = out.with_suffix(".json")
    if not path.is_file():
        return []
    result = json.loads(path.read_text()).get("result")
    return list(result.get("rows", [])) if isinstance(result, dict) else []


def record_fresh_clone(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    columns = ["date", "commit", "busy processes", "seconds", "exit", "pytest", "load before, after", "CPU"]
    body = [
        [
            r["date"],
            r["commit"],
            r["busy"],
            r["seconds"],
            r["exit"],
            r["pytest"],
            f"{r['load_before']}, {r['load_after']}",
            r["cpu"],
        ]
        for r in rows
    ]
    notes = [
        "each row: a fresh clone of the commit in a temporary folder, beside the busy processes, running "
        f"`{rows[-1]['command']}` (`<venv>`: the virtual environment of the python that ran the command above; the "
        "clone first on PYTHONPATH)",
        "a red row's last 40 lines of output are in the JSON beside this file",
    ]
    title = "make test on a fresh clone beside busy processes"
    write(args.out, title, table(columns, body), data={"rows": rows}, notes=notes)


def fresh_clone_rounds(args: argparse.Namespace) -> None:
    rows = earlier_rows(args.out)
    for round_number in range(1, args.rounds + 1):
        row = run_fresh_clone(args.tests, args.workers, args.busy)
        rows.append(row)
        record_fresh_clone(args, rows)
        print(f"round {round_number}: {row['seconds']} s, exit {row['exit']}, {row['pytest']}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--busy", type=int, default=2, help="spinning processes beside the loaded runs")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (make test: 2)")
    parser.add_argument("--tests", nargs="*", default=[], help="test paths (default: the whole suite)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--fresh-clone",
        action="store_true",
        help="make test on a fresh clone of HEAD beside --busy processes, a row appended per round",
    )
    args = parser.parse_args()
    if args.fresh_clone:
        fresh_clone_rounds(args)
        return
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
