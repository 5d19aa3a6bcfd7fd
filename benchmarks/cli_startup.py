"""Wall time of ``tensorslim --help``, every subcommand's ``--help`` and ``--version`` (each a fresh interpreter).

Each command runs ``--reps`` times, interleaved with the others; the median is kept. The result file records the
command line, the CPU kind, the load and the date, because the shared machine's load moves the figures.

Usage:
    python benchmarks/cli_startup.py --out benchmarks/results/cli_startup.md
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _results import table, write

from tensorslim.cli.main import COMMANDS


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
    times: dict[str, list[float]] = {" ".join(argv): [] for argv in commands}
    for _ in range(args.reps):
        for argv in commands:
            times[" ".join(argv)].append(wall(argv))
    rows = [[f"`tensorslim {name}`", f"{statistics.median(t):.3f}", f"{max(t):.3f}"] for name, t in times.items()]
    lines = table(["command", "median s", "max s"], rows)
    title = "`tensorslim` start-up: wall seconds per command (fresh interpreter each)"
    print(write(Path(args.out), title, lines).read_text())


if __name__ == "__main__":
    main()
