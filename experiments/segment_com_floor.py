"""How well does the body silhouette alone place the heart? A reference for the mask-only centre-of-mass error.

The heart phantoms (``tensorslim.data.segment.phantoms``) place the heart relative to the body ellipse plus a small
independent jitter, so no silhouette-only predictor can place the heart's centre of mass exactly. Three predictors of
the heart's centre of mass (mm), each scored by its mean Euclidean error on phantoms it did not see:

* ``regression``: least squares from silhouette moments (centroid, second moments, their products and squares),
  fit on ``--fit`` phantoms. It is linear in the moments, while the phantom turns an axis-scaled offset with the
  body, so it is a loose yardstick.
* ``ellipse``: the moment-matched ellipse of the silhouette (``body_from_silhouette``) and the phantom's own
  placement rule without jitter (``nominal_heart``): no fit at all.
* ``oracle``: the same placement rule on the true body ellipse. What remains is the heart's own jitter (and
  pixelation): the floor for any silhouette-only predictor that knows the rule.

    python experiments/segment_com_floor.py --sizes 96,128 --fit 500 --held-out 200

writes ``experiments/results/segment_com_floor.md``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from scipy import ndimage

from tensorslim.data.segment.masks import global_mask
from tensorslim.data.segment.phantoms import body_from_silhouette, draw_body, heart_case, nominal_heart
from tensorslim.data.segment.sets import SPLITS, IntensityShift, load_split


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


def errors_mm(size: int, fit: int, held_out: int) -> tuple[dict[str, float], float]:
    """Mean held-out centre-of-mass error (mm) of each predictor at ``size × size``, and the pixel size."""
    x, y, ellipse, oracle, spacing = [], [], [], [], 0.0
    for i in range(fit + held_out):
        seed = [9, size, i]  # not a split's seeds
        image, heart, spacing = heart_case(np.random.default_rng(seed), size=size)
        silhouette = global_mask(image)
        x.append(features(silhouette))
        y.append(np.asarray(ndimage.center_of_mass(heart)) * spacing)
        if i >= fit:
            for out, body in (
                (ellipse, body_from_silhouette(silhouette)),
                (oracle, draw_body(np.random.default_rng(seed), size=size)),
            ):
                out.append(np.asarray(ndimage.center_of_mass(nominal_heart(body, heart.shape))) * spacing)
    x, y = np.asarray(x), np.asarray(y)
    weights, *_ = np.linalg.lstsq(x[:fit], y[:fit], rcond=None)
    predicted = {"regression": x[fit:] @ weights, "ellipse": np.asarray(ellipse), "oracle": np.asarray(oracle)}
    return {name: float(np.linalg.norm(p - y[fit:], axis=1).mean()) for name, p in predicted.items()}, spacing


def split_lines(size: int) -> list[str]:
    """The ``ellipse`` and ``oracle`` errors on the heart data set's own validation and (shifted) test cases, and
    how many of those bodies the field of view cuts (the silhouette touches the image border)."""
    lines = []
    for split in ("val", "test"):
        cases = load_split("heart", split, size=size, shift=IntensityShift() if split == "test" else None)
        ellipse, oracle, cut = [], [], []
        for i, (image, heart) in enumerate(zip(cases.images, cases.targets, strict=True)):
            silhouette = global_mask(image)
            true = np.asarray(ndimage.center_of_mass(heart))
            drawn = draw_body(np.random.default_rng([2, SPLITS.index(split), i]), size=size)  # load_split's seed
            for out, body in ((ellipse, body_from_silhouette(silhouette)), (oracle, drawn)):
                out.append(np.linalg.norm(ndimage.center_of_mass(nominal_heart(body, heart.shape)) - true))
            cut.append(bool(silhouette[[0, -1]].any() or silhouette[:, [0, -1]].any()))
        spacing = cases.spacing[0]
        ellipse, oracle, cut = np.asarray(ellipse) * spacing, np.asarray(oracle) * spacing, np.asarray(cut)
        lines.append(
            f"| {split} | {size} | {len(cut)} | {ellipse.mean():.2f} | {oracle.mean():.2f} | {int(cut.sum())} | "
            f"{ellipse[cut].mean() if cut.any() else float('nan'):.2f} | {ellipse[~cut].mean():.2f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="96,128")
    parser.add_argument("--fit", type=int, default=500)
    parser.add_argument("--held-out", type=int, default=200)
    args = parser.parse_args()
    lines = [
        "# Heart centre of mass from the silhouette alone: three yardsticks",
        "",
        f"Command: `python experiments/segment_com_floor.py --sizes {args.sizes} --fit {args.fit} "
        f"--held-out {args.held_out}`",
        "",
        f"Mean Euclidean error of the heart's centre of mass on {args.held_out} held-out phantoms. `regression`: least "
        f"squares from silhouette moments, fit on {args.fit} other phantoms. `ellipse`: the silhouette's "
        "moment-matched ellipse and the phantom's placement rule without jitter. `oracle`: the same rule on the true "
        "body ellipse (only the heart's own jitter and pixelation remain).",
        "",
        "| image side | pixel (mm) | regression (mm) | ellipse (mm) | oracle (mm) |",
        "|---|---|---|---|---|",
    ]
    for size in (int(s) for s in args.sizes.split(",")):
        error, spacing = errors_mm(size, args.fit, args.held_out)
        lines.append(
            f"| {size} | {spacing:.2f} | {error['regression']:.2f} | {error['ellipse']:.2f} | {error['oracle']:.2f} |"
        )
        print(lines[-1], flush=True)
    lines += [
        "",
        "The same two predictors on the heart data set's own cases (test cases with the intensity shift; `cut`: "
        "bodies the field of view cuts at the side):",
        "",
        "| split | image side | cases | ellipse (mm) | oracle (mm) | cut | ellipse, cut (mm) | ellipse, not cut (mm) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for size in (int(s) for s in args.sizes.split(",")):
        lines += split_lines(size)
        print("\n".join(lines[-2:]), flush=True)
    Path("experiments/results/segment_com_floor.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
