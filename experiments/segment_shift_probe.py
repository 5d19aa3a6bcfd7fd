"""Which channel carries the test-time intensity shift's damage? Kept runs scored on the test cases three ways.

``segment_scenarios.py`` scores every run on test cases whose image carries the intensity shift and whose global mask
is built from that shifted image. This script takes runs kept with ``--keep-runs`` and scores them on the same test
cases (the same anatomy) three ways: ``clean`` (no shift at all), ``image shifted`` (the shifted image, the mask
built from the clean image) and ``both shifted`` (the usual test). For an image + mask network, ``clean`` against
``image shifted`` is the damage done through the image channel, and ``image shifted`` against ``both shifted`` what
the mask builder's few noise-flipped pixels add. Three more columns apply one part of the shift at a time (gamma,
bias field, noise; same draws per case, mask from the clean image) to say which part does the damage.

    python experiments/segment_scenarios.py --dataset brain --inputs image,image+mask --train-cases 2 --seeds 5 \
        --steps 200 \
        --batch-size 4 --keep-runs --out-dir runs/brain_n2
    python experiments/segment_shift_probe.py runs/brain_n2 --out experiments/results/segment_shift_probe_brain.md
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from tensorslim.data.segment.sets import IntensityShift, global_masks, load_split
from tensorslim.tasks.segment import load_run, predict
from tensorslim.tasks.segment.metrics import dice

# The test shift's parts one at a time. Each keeps the full shift's random draws (two gamma ranges, so the range is
# drawn as in the full shift), so a case gets the same gamma, bias field or noise as in the full shift.
NEUTRAL_GAMMA = ((1.0, 1.0), (1.0, 1.0))
PARTS = {
    "gamma only": IntensityShift(bias=0.0, noise=0.0),
    "bias only": IntensityShift(gamma=NEUTRAL_GAMMA, noise=0.0),
    "noise only": IntensityShift(gamma=NEUTRAL_GAMMA, bias=0.0),
}


def mean_dice(model: torch.nn.Module, images: np.ndarray, masks: np.ndarray | None, targets: np.ndarray) -> float:
    channels = [images] if masks is None else [images, masks]
    inputs = torch.from_numpy(np.stack(channels, axis=1).astype(np.float32))
    return float(np.mean([dice(p, t) for p, t in zip(predict(model, inputs).numpy(), targets, strict=True)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="the --out-dir of segment_scenarios.py --keep-runs")
    parser.add_argument("--out", required=True, help="the markdown file to write")
    args = parser.parse_args()
    rows: dict[tuple[str, int], list[tuple[float, ...]]] = {}
    for run in sorted((Path(args.out_dir) / "runs").iterdir()):
        model, options = load_run(run)
        if options["inputs"] not in ("image", "image+mask"):
            continue
        size, dataset = options["image_size"], options["dataset"]
        clean = load_split(dataset, "test", size=size)
        shifted = load_split(dataset, "test", size=size, shift=IntensityShift())
        with_mask = options["inputs"] == "image+mask"
        clean_masks = global_masks(clean.images) if with_mask else None
        scores = (
            mean_dice(model, clean.images, clean_masks, clean.targets),
            mean_dice(model, shifted.images, clean_masks, clean.targets),
            mean_dice(model, shifted.images, global_masks(shifted.images) if with_mask else None, clean.targets),
            *(
                mean_dice(model, load_split(dataset, "test", size=size, shift=part).images, clean_masks, clean.targets)
                for part in PARTS.values()
            ),
        )
        rows.setdefault((options["inputs"], options["train_cases"]), []).append(scores)
        print(run.name, " ".join(f"{s:.3f}" for s in scores), flush=True)
    lines = [
        f"# Test-time intensity shift, channel by channel: {dataset}",
        "",
        f"Command: `python experiments/segment_shift_probe.py {args.out_dir} --out {args.out}`",
        "",
        "Mean test Dice over the runs (± std over runs); `image shifted`: shifted image, mask built from the clean "
        "image; `both shifted`: the usual test (mask built from the shifted image).",
        "",
        "| inputs | cases | runs | clean | image shifted | both shifted | " + " | ".join(PARTS) + " |",
        "|---|---|---|" + "---|" * (3 + len(PARTS)),
    ]
    for (inputs, cases), scores in sorted(rows.items(), key=lambda item: (item[0][1], item[0][0])):
        table = np.asarray(scores)
        cells = " | ".join(f"{m:.3f} ± {s:.3f}" for m, s in zip(table.mean(0), table.std(0), strict=True))
        lines.append(f"| {inputs} | {cases} | {len(table)} | {cells} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
