"""Does a longer run help the adapter methods at K = 100? A training-length choice made on the development set.

The K = 100 sweep of ``adapters_protocol.py`` trains every method for 5 epochs (32 steps of 16 titles) at each rate of
its three-rate grid, and the development accuracy picks the rate per seed. This script adds one longer run per method
and seed — 15 epochs (94 steps) at the middle rate of its grid, ``adapters_protocol.py --rates middle --epochs 15`` —
and lets the development accuracy pick among the four runs (three rates × 32 steps, the middle rate × 94 steps; a tie
keeps the earlier, shorter run). Every method gets the same four-run grid, so the rows stay comparable (UniPELT's
protocol, Mao et al., arXiv 2110.07577, §4.1, selects on development data only).

    python experiments/adapters_steps.py --sweep experiments/results/adapters_bbc_titles.jsonl \\
        --long experiments/results/adapters_steps.jsonl --out experiments/results/adapters_steps

Writes ``<out>.json`` and ``<out>.md``: per method, the mean development accuracy at the middle rate for both
lengths, how many seeds chose the longer run, and the test accuracy (mean ± std over seeds) under the three-run and
the four-run choice. Only runs of each method's default variant (:func:`adapters_protocol.variant`) count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from adapters_protocol import LR_GRIDS, variant


def choose(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the best development accuracy; a tie keeps the earlier run."""
    best = runs[0]
    for run in runs[1:]:
        if run["dev_accuracy"] > best["dev_accuracy"]:
            best = run
    return best


def compare(sweep: list[dict[str, Any]], long: list[dict[str, Any]], *, k: int = 100) -> dict[str, dict[str, Any]]:
    """Per method with long runs: the development means, the long run's wins and both protocols' test accuracy (%).

    Raises:
        ValueError: a seed with a long run lacks part of the method's three-rate grid in ``sweep``.
    """
    out = {}
    for method in dict.fromkeys(r["method"] for r in long if "steps" in r and r["k"] == k):
        grid = LR_GRIDS[method]
        middle = grid[len(grid) // 2]
        short_runs, long_runs, wins, three, four = [], [], 0, [], []
        for run in sorted((r for r in long if r["method"] == method and r["k"] == k), key=lambda r: r["seed"]):
            mine = [r for r in sweep if variant(r) == variant(run) and r["k"] == k and r["seed"] == run["seed"]]
            by_rate = {r["lr"]: r for r in mine if r["steps"] != run["steps"]}
            if set(by_rate) < set(grid) or len({r["steps"] for r in by_rate.values()}) != 1:
                raise ValueError(f"{method} seed {run['seed']}: the sweep lacks one length × the grid {grid}")
            short = [by_rate[lr] for lr in grid]
            chosen = choose([*short, run])
            wins += chosen is run
            short_runs.append(by_rate[middle])
            long_runs.append(run)
            three.append(100 * choose(short)["test_accuracy"])
            four.append(100 * chosen["test_accuracy"])
        out[method] = {
            "seeds": len(long_runs),
            "steps": [short_runs[0]["steps"], long_runs[0]["steps"]],
            "middle_lr": middle,
            "dev_short": statistics.fmean(r["dev_accuracy"] for r in short_runs),
            "dev_long": statistics.fmean(r["dev_accuracy"] for r in long_runs),
            "long_chosen": wins,
            "test_three": [statistics.fmean(three), statistics.stdev(three) if len(three) > 1 else 0.0],
            "test_four": [statistics.fmean(four), statistics.stdev(four) if len(four) > 1 else 0.0],
        }
    return out


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=Path, required=True, help="the K=100 sweep's runs (.jsonl)")
    parser.add_argument("--long", type=Path, required=True, help="the longer runs at the middle rate (.jsonl)")
    parser.add_argument("--out", type=Path, required=True, help="output prefix: .json, .md")
    args = parser.parse_args(argv)
    table = compare(_read(args.sweep), _read(args.long))
    command = "python experiments/adapters_steps.py " + " ".join(sys.argv[1:] if argv is None else argv)
    args.out.with_suffix(".json").write_text(json.dumps({"command": command, "table": table}, indent=2) + "\n")
    lines = [
        f"```\n{command}\n```\n",
        "| method | steps (short, long) | middle rate | dev short | dev long | long run chosen | test, 3 runs "
        "| test, 4 runs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method, row in table.items():
        lines.append(
            f"| {method} | {row['steps'][0]}, {row['steps'][1]} | {row['middle_lr']:g} | {row['dev_short']:.3f} "
            f"| {row['dev_long']:.3f} | {row['long_chosen']} of {row['seeds']} "
            f"| {row['test_three'][0]:.1f} ± {row['test_three'][1]:.1f} "
            f"| {row['test_four'][0]:.1f} ± {row['test_four'][1]:.1f} |"
        )
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
