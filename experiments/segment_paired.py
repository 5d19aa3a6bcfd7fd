"""Image + mask against image alone, seed by seed: the paired view of a ``segment_scenarios.py`` result file.

With one training case, each seed draws its own case from the pool (``np.random.default_rng(seed)``), and the
image and image + mask runs of a seed train on that same case, so their difference is paired. This script lists the
per-seed Dice of both input modes, the drawn training case, the mean paired difference with its 95 % t interval,
the median difference, the relative gain of the means (the figure the docs' tables show), how many seeds the mask
wins, the Wilcoxon signed-rank p-value, the Spearman correlation between the gain and the image-only Dice (does the
mask help where the image alone is weak?), and the same means on the clean validation cases (``val_dice``), which
separate what the mask adds from how each mode bears the test-time intensity shift.

    python experiments/segment_paired.py experiments/results/segment_brain_onecase20/segment_brain.json \
        --out experiments/results/segment_brain_onecase20/paired.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from scipy import stats

from tensorslim.data.segment.sets import check_dataset


def paired_lines(runs: list[dict], dataset: str, cases: int) -> list[str]:
    """Markdown lines for one training-set size."""
    dice = {(run["inputs"], run["seed"]): run["dice"] for run in runs if run["train_cases"] == cases}
    val = {(run["inputs"], run["seed"]): run["val_dice"] for run in runs if run["train_cases"] == cases}
    seeds = sorted(seed for mode, seed in dice if mode == "image" and ("image+mask", seed) in dice)
    image = np.array([dice["image", seed] for seed in seeds])
    both = np.array([dice["image+mask", seed] for seed in seeds])
    diff = both - image
    val_image = np.array([val["image", seed] for seed in seeds])
    val_both = np.array([val["image+mask", seed] for seed in seeds])
    pool = check_dataset(dataset).sizes["train"]
    lines = [
        f"## {cases} training case(s), {len(seeds)} seeds",
        "",
        "| seed | training cases (pool index) | image | image+mask | difference | val image | val image+mask |",
        "|---|---|---|---|---|---|---|",
    ]
    for seed, a, b, va, vb in zip(seeds, image, both, val_image, val_both, strict=True):
        drawn = sorted(np.random.default_rng(seed).permutation(pool)[:cases].tolist())  # as the segment task draws
        lines.append(f"| {seed} | {drawn} | {a:.3f} | {b:.3f} | {b - a:+.3f} | {va:.3f} | {vb:.3f} |")
    half = stats.t.ppf(0.975, len(diff) - 1) * diff.std(ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else np.nan
    wilcoxon = stats.wilcoxon(diff).pvalue if np.any(diff != 0) else 1.0
    rho = stats.spearmanr(image, diff).statistic if len(diff) > 2 else np.nan
    lines += [
        "",
        f"- mean Dice: image {image.mean():.3f} ± {image.std(ddof=1):.3f}, image+mask {both.mean():.3f} ± "
        f"{both.std(ddof=1):.3f} (std over seeds); "
        f"relative gain of the means {100 * (both.mean() / image.mean() - 1):+.1f} %",
        f"- mean paired difference {diff.mean():+.3f} (median {np.median(diff):+.3f}), 95 % t interval "
        f"[{diff.mean() - half:+.3f}, "
        f"{diff.mean() + half:+.3f}]; the mask wins {int((diff > 0).sum())} of {len(diff)} seeds (ties "
        f"{int((diff == 0).sum())}); Wilcoxon signed-rank p = {wilcoxon:.3f}",
        f"- Spearman correlation of the difference with the image-only Dice: {rho:+.2f}",
        f"- clean validation Dice: image {val_image.mean():.3f}, image+mask {val_both.mean():.3f} (relative "
        f"{100 * (val_both.mean() / val_image.mean() - 1):+.1f} %; median paired difference "
        f"{np.median(val_both - val_image):+.3f})",
        "",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", help="a segment_<dataset>.json written by segment_scenarios.py")
    parser.add_argument("--out", required=True, help="the markdown file to write")
    args = parser.parse_args()
    data = json.loads(Path(args.result).read_text())
    runs = [run for run in data["runs"] if run["inputs"] in ("image", "image+mask")]
    dataset = runs[0]["dataset"]
    lines = [
        f"# Image + mask vs image, paired by seed: {dataset}",
        "",
        f"Command: `python experiments/segment_paired.py {args.result} --out {args.out}`",
        "",
        f"Runs: `{data['command']}`. Dice on the intensity-shifted test cases; `val`: Dice on the clean validation "
        "cases.",
        "",
    ]
    for cases in sorted({run["train_cases"] for run in runs}):
        lines += paired_lines(runs, dataset, cases)
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
