"""Where does a mask-only heart U-Net put the heart? Its centre-of-mass error beside the silhouette yardsticks.

Reads runs kept by ``segment_scenarios.py --keep-runs`` (heart, ``--inputs mask``), predicts the validation and/or
test cases again from each run's last checkpoint, and reports per split the U-Net's mean centre-of-mass error, its
mean signed error (row = anterior→posterior, column = right→left of the patient, mm), its error on bodies the field
of view cuts and on the others, and the two yardsticks of ``experiments/segment_com_floor.py`` on the same cases:
``ellipse`` (the silhouette's moment-matched ellipse + the phantom's placement rule) and ``oracle`` (the true body +
the rule). Use it to compare settings on the validation cases before running them on the test cases.

    python experiments/segment_scenarios.py --dataset heart --inputs mask --train-cases 12 --seeds 1 \
        --preset unet-deep --steps 400 \
        --batch-size 8 --keep-runs --out-dir runs/heart_deep400
    python experiments/segment_com_runs.py runs/heart_deep400 --splits val --out experiments/results/segment_com_runs.md
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from scipy import ndimage

from tensorslim.data.segment.phantoms import body_from_silhouette, draw_body, nominal_heart
from tensorslim.data.segment.sets import SPLITS, IntensityShift, global_masks, load_split
from tensorslim.tasks.segment import load_run, predict


def split_row(model: torch.nn.Module, split: str, size: int) -> dict[str, float]:
    cases = load_split("heart", split, size=size, shift=IntensityShift() if split == "test" else None)
    masks = global_masks(cases.images)
    predicted = predict(model, torch.from_numpy(masks[:, None].astype(np.float32))).numpy()
    spacing = cases.spacing[0]
    unet, signed, ellipse, oracle, cut = [], [], [], [], []
    for i, (pred, heart, mask) in enumerate(zip(predicted, cases.targets, masks, strict=True)):
        true = np.asarray(ndimage.center_of_mass(heart))
        error = (np.asarray(ndimage.center_of_mass(pred)) - true) * spacing  # nan when the prediction is empty
        unet.append(np.linalg.norm(error))
        signed.append(error)
        drawn = draw_body(np.random.default_rng([2, SPLITS.index(split), i]), size=size)  # load_split's seed
        for out, body in ((ellipse, body_from_silhouette(mask)), (oracle, drawn)):
            out.append(np.linalg.norm(ndimage.center_of_mass(nominal_heart(body, heart.shape)) - true) * spacing)
        cut.append(bool(mask[[0, -1]].any() or mask[:, [0, -1]].any()))
    unet, signed, cut = np.asarray(unet), np.asarray(signed), np.asarray(cut)
    return {
        "unet": float(np.nanmean(unet)),
        "row": float(np.nanmean(signed[:, 0])),
        "col": float(np.nanmean(signed[:, 1])),
        "cut": float(np.nanmean(unet[cut])) if cut.any() else float("nan"),
        "not_cut": float(np.nanmean(unet[~cut])),
        "n_cut": int(cut.sum()),
        "ellipse": float(np.mean(ellipse)),
        "oracle": float(np.mean(oracle)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dirs", nargs="+", help="--out-dir folders of segment_scenarios.py --keep-runs")
    parser.add_argument("--splits", default="val", help="val, test or val,test")
    parser.add_argument("--out", required=True, help="the markdown file to write")
    args = parser.parse_args()
    lines = [
        "# Mask-only heart U-Nets: centre-of-mass error beside the silhouette yardsticks",
        "",
        f"Command: `python experiments/segment_com_runs.py {' '.join(args.out_dirs)} --splits {args.splits} "
        f"--out {args.out}`",
        "",
        "Errors in mm, means over the split's cases; signed error = U-Net minus truth (row: towards posterior, "
        "column: towards the image's right); `cut`: bodies the field of view cuts.",
        "",
        "| run | split | U-Net CoM | signed (row, col) | U-Net, cut | U-Net, not cut | ellipse | oracle |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for out_dir in args.out_dirs:
        for run in sorted((Path(out_dir) / "runs").iterdir()):
            model, options = load_run(run)
            if options["dataset"] != "heart" or options["inputs"] != "mask":
                raise SystemExit(f"{run} trained {options['dataset']}/{options['inputs']}; allowed: heart/mask")
            for split in args.splits.split(","):
                r = split_row(model, split, options["image_size"])
                lines.append(
                    f"| {out_dir}/{run.name} | {split} | {r['unet']:.2f} | ({r['row']:+.2f}, {r['col']:+.2f}) | "
                    f"{r['cut']:.2f} (n={r['n_cut']}) | {r['not_cut']:.2f} | {r['ellipse']:.2f} | {r['oracle']:.2f} |"
                )
                print(lines[-1], flush=True)
    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
