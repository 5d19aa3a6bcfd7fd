"""One Dice-vs-training-cases figure from several ``segment_scenarios.py`` result files (e.g. the image/image+mask grid
and the mask-only grid of the same data set, run as separate commands).

    python experiments/segment_plot.py experiments/results/segment_brain_lowdata/segment_brain.json \
        experiments/results/segment_brain_lowdata_mask/segment_brain.json \
        --out experiments/results/segment_brain_modes.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tensorslim.tasks.segment.plots import plot_dice_curves


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="segment_<dataset>.json files written by segment_scenarios.py")
    parser.add_argument("--out", required=True, help="the PNG to write")
    args = parser.parse_args()
    rows, datasets = [], set()
    for path in args.results:
        runs = json.loads(Path(path).read_text())["runs"]
        rows += [run for run in runs if run["inputs"] != "constant"]
        datasets |= {run["dataset"] for run in runs}
    if len(datasets) != 1:
        raise SystemExit(f"the files hold data sets {sorted(datasets)}; allowed: one")
    rows.sort(key=lambda run: ("mask", "image", "image+mask", "prior", "image+prior").index(run["inputs"]))
    plot_dice_curves(rows, Path(args.out), title=f"{datasets.pop()}: test Dice vs training cases")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
