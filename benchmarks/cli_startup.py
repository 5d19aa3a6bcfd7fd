"""Wall time of ``tensorslim --help``, every subcommand's ``--help`` and ``--version`` (each a fresh interpreter).

Each command runs ``--reps`` times, interleaved with the others; the median is kept. The result file records the
command line, the CPU kind, the load and the date, because the shared machine's load moves the figures.

Usage:
    python benchmarks/cli_startup.py --out benchmarks/results/cli_startup.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from tensorslim.cli.main import COMMANDS


def cpu_kind() -> str:
    """The CPU's model name and its bf16/AMX flags, from ``/proc/cpuinfo``."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    found = [flag for flag in ("avx512_bf16", "amx_tile") if flag in flags]
    return f"{name or platform.processor()} (flags: {', '.join(found) or 'no avx512_bf16, no amx_tile'})"


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tensorslim", *argv], check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--out", required=True, help="the Markdown result file")
    args = parser.parse_args()
    commands = [["--help"], ["--version"]] + [[name, "--help"] for name in COMMANDS]
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {" ".join(argv): [] for argv in commands}
    for _ in range(args.reps):
        for argv in commands:
            times[" ".join(argv)].append(wall(argv))
    rows = [f"| `tensorslim {name}` | {statistics.median(t):.3f} | {max(t):.3f} |" for name, t in times.items()]
    report = "\n".join(
        [
            "# `tensorslim` start-up: wall seconds per command (fresh interpreter each)",
            "",
            f"- command: `python benchmarks/cli_startup.py --reps {args.reps} --out {args.out}`",
            f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; Python {platform.python_version()}",
            f"- CPU: {cpu_kind()}; {os.cpu_count()} cores",
            f"- load average (1, 5, 15 min) before: {load_before}, after: {os.getloadavg()}"
            " (a machine shared with other jobs)",
            "",
            "| command | median s | max s |",
            "|---|---|---|",
            *rows,
            "",
        ]
    )
    Path(args.out).write_text(report)
    print(report)


if __name__ == "__main__":
    main()
