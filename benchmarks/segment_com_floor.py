"""How well does the body silhouette alone place the heart? A reference for the mask-only centre-of-mass error.

The heart phantoms (``tensorslim.segment.phantoms``) place the heart relative to the body ellipse plus a small
independent jitter, so no silhouette-only predictor can place the heart's centre of mass exactly. This script fits a
least-squares regression from silhouette moments (centroid, second moments, their products and squares) to the
heart's centre of mass (mm) on many phantoms, and reports its mean error on phantoms it did not see: a yardstick
for the U-Net, which sees only 1-12 training cases.

    python benchmarks/segment_com_floor.py --sizes 96,128 --fit 500 --held-out 200

writes ``benchmarks/results/segment_com_floor.md``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from scipy import ndimage

from tensorslim.segment.masks import global_mask
from tensorslim.segment.phantoms import heart_case


def features(mask: np.ndarray) -> list[float]:
    rows, cols = (axis.astype(float) for axis in np.nonzero(mask))
    mr, mc = rows.mean(), cols.mean()
    srr, scc, src = ((rows - mr) ** 2).mean(), ((cols - mc) ** 2).mean(), ((rows - mr) * (cols - mc)).mean()
    corr = src / np.sqrt(srr * scc)
    return [
        1.0,
        mr,
        mc,
        srr,
        scc,
        src,
        np.sqrt(srr),
        np.sqrt(scc),
        corr,
        mr * mr,
        mc * mc,
        mr * mc,
        mr * corr,
        mc * corr,
    ]


def error_mm(size: int, fit: int, held_out: int) -> tuple[float, float]:
    x, y, spacing = [], [], 0.0
    for i in range(fit + held_out):
        image, heart, spacing = heart_case(np.random.default_rng([9, size, i]), size=size)  # not a split's seeds
        x.append(features(global_mask(image)))
        y.append(np.asarray(ndimage.center_of_mass(heart)) * spacing)
    x, y = np.asarray(x), np.asarray(y)
    weights, *_ = np.linalg.lstsq(x[:fit], y[:fit], rcond=None)
    return float(np.linalg.norm(x[fit:] @ weights - y[fit:], axis=1).mean()), spacing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="96,128")
    parser.add_argument("--fit", type=int, default=500)
    parser.add_argument("--held-out", type=int, default=200)
    args = parser.parse_args()
    lines = [
        "# Heart centre of mass from the silhouette alone: a regression yardstick",
        "",
        f"Command: `python benchmarks/segment_com_floor.py --sizes {args.sizes} --fit {args.fit} "
        f"--held-out {args.held_out}`",
        "",
        f"Least squares from silhouette moments to the heart's centre of mass, fit on {args.fit} phantoms, scored on "
        f"{args.held_out} others (mean Euclidean error).",
        "",
        "| image side | pixel (mm) | CoM error (mm) |",
        "|---|---|---|",
    ]
    for size in (int(s) for s in args.sizes.split(",")):
        error, spacing = error_mm(size, args.fit, args.held_out)
        lines.append(f"| {size} | {spacing:.2f} | {error:.2f} |")
        print(lines[-1], flush=True)
    Path("benchmarks/results/segment_com_floor.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
