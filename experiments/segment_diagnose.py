"""Why does the mask channel not help at one training case? Image vs image + mask on validation cases, error by
error.

Each run trains through the one Trainer (as ``experiments/segment_select.py`` does) and is scored on ``--val-count``
validation cases (new cases of the validation split, disjoint from training and test; the test cases are never
scored here), clean and under a fresh draw of the test-time intensity shift. Besides Dice it splits the errors:
precision and recall, the share of false-positive pixels that lie more than 3 px from the true structure (stray
blobs rather than a loose boundary), and the centre-of-mass error. The heart phantom's grey levels can be overridden,
so a realism change can be judged on
validation before any test run (``--wall``, ``--blood``; ``--brain-render`` for the brain's images).

    python experiments/segment_diagnose.py --dataset heart --train-cases 1 --seeds 5 \
        --out experiments/results/segment_diagnose
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from scipy import ndimage

from tensorslim.data.segment import brain, phantoms
from tensorslim.data.segment.sets import IntensityShift, load_split
from tensorslim.tasks.segment import predict
from tensorslim.tasks.segment.metrics import case_metrics
from tensorslim.train.config import TrainConfig
from tensorslim.train.trainer import Trainer


def errors(trainer: Trainer, cases: object) -> dict[str, float]:
    """Mean Dice, precision, recall, stray-FP share and CoM error (mm) over ``cases``."""
    split = trainer.task._split(cases)
    predicted = predict(trainer.model.eval(), split.inputs).numpy()
    rows = []
    for p, t in zip(predicted, split.targets.numpy(), strict=True):
        fp = p & ~t
        near = ndimage.binary_dilation(t, iterations=3)
        scores = case_metrics(p, t, split.spacing)
        rows.append(
            {
                "dice": scores["dice"],
                "precision": (p & t).sum() / max(p.sum(), 1),
                "recall": (p & t).sum() / max(t.sum(), 1),
                "stray_fp": (fp & ~near).sum() / max(fp.sum(), 1),
                "com_mm": scores["com_mm"],
            }
        )
    return {key: round(float(np.nanmean([r[key] for r in rows])), 4) for key in rows[0]}


def one_run(dataset: str, inputs: str, seed: int, args: argparse.Namespace) -> dict:
    options = {"dataset": dataset, "inputs": inputs, "train_cases": args.train_cases, "intensity": args.intensity}
    with tempfile.TemporaryDirectory() as folder:
        config = TrainConfig(
            preset=args.preset,
            task="segment",
            method="dense",
            task_options=options,
            steps=args.steps,
            batch_size=args.batch_size,
            seq_len=96 * 96,
            lr=1e-2,
            warmup_fraction=0.05,
            eval_every=args.steps,
            checkpoint_every=args.steps,
            seed=seed,
            out_dir=folder,
            progress=False,
            tensorboard=False,
        )
        start = time.perf_counter()
        trainer = Trainer(config)
        trainer.run()
        seconds = time.perf_counter() - start
        clean = load_split(dataset, "val", size=96, count=args.val_count)
        shifted = load_split(dataset, "val", size=96, count=args.val_count, shift=IntensityShift())
        return {
            "command": "python experiments/segment_diagnose.py " + " ".join(sys.argv[1:]),
            **options,
            **({"wall": phantoms.MYOCARDIUM_CONTRAST, "blood": phantoms.BLOOD_CONTRAST} if dataset == "heart" else {}),
            **({"render": brain.RENDERING} if dataset == "brain" else {}),
            "preset": args.preset,
            "steps": args.steps,
            "seed": seed,
            "seconds": round(seconds, 1),
            "val_clean": errors(trainer, clean),
            "val_shift": errors(trainer, shifted),
        }


VARIANT_KEYS = ("dataset", "train_cases", "intensity", "steps", "wall", "blood", "render", "inputs")


def summary(rows: list[dict]) -> list[str]:
    """Markdown table: per variant and input mode, mean ± std over seeds of each score."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(str(row.get(key, "")) for key in VARIANT_KEYS), []).append(row)
    header = "seeds | Dice clean | Dice shifted | precision | recall | stray FP | CoM (mm)"
    lines = [
        "| " + " | ".join(VARIANT_KEYS) + f" | {header} |",
        "|" + "---|" * (len(VARIANT_KEYS) + 7),
    ]
    for key, group in groups.items():
        cells = [("val_clean", "dice")] + [("val_shift", name) for name in ("dice", "precision", "recall")]
        cells += [("val_shift", "stray_fp"), ("val_shift", "com_mm")]
        values = [[row[split][name] for row in group] for split, name in cells]
        scores = [f"{np.mean(v):.3f} ± {np.std(v):.3f}" for v in values]
        lines.append("| " + " | ".join(key) + f" | {len(group)} | " + " | ".join(scores) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="heart")
    parser.add_argument("--inputs", default="image,image+mask")
    parser.add_argument("--train-cases", type=int, default=1)
    parser.add_argument("--intensity", default="nnunet")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--preset", default="unet-small")
    parser.add_argument("--val-count", type=int, default=40, help="validation cases drawn (new ones past 5 / 10)")
    parser.add_argument("--wall", default=None, help="heart phantom: myocardial contrast range 'low,high' (0..1)")
    parser.add_argument("--blood", default=None, help="heart phantom: largest blood-pool brightening (0..1)")
    parser.add_argument("--brain-render", default=None, help="brain images: t1 or ct (brain.RENDERING)")
    parser.add_argument("--out", default="experiments/results/segment_diagnose")
    parser.add_argument("--summarize", action="store_true", help="only rewrite the .md from the .jsonl")
    args = parser.parse_args()
    if args.wall:  # a phantom variant judged on validation; the split caches are per process
        phantoms.MYOCARDIUM_CONTRAST = tuple(float(x) for x in args.wall.split(","))
    if args.blood:
        phantoms.BLOOD_CONTRAST = float(args.blood)
    if args.brain_render:
        brain.RENDERING = args.brain_render
    torch.set_num_threads(1)  # a shared machine: one thread per run
    with Path(args.out).with_suffix(".jsonl").open("a") as log:
        for seed in range(0 if args.summarize else args.seeds):
            for inputs in args.inputs.split(","):
                row = one_run(args.dataset, inputs, seed, args)
                print(json.dumps(row), file=log, flush=True)
                print(row, flush=True)
    rows = [json.loads(line) for line in Path(args.out).with_suffix(".jsonl").read_text().splitlines()]
    table = "\n".join(summary(rows))
    commands = "\n".join(dict.fromkeys(row["command"] for row in rows))
    Path(args.out).with_suffix(".md").write_text(
        "# Image vs image + mask on validation cases, error by error\n\n"
        "Validation cases only (the first `--val-count` of the validation split), clean and under a fresh draw of "
        "the test-time intensity shift; precision, recall, stray FP (share of false-positive pixels more than 3 px "
        "from the structure) and CoM are on the shifted cases. Every row is in the JSONL beside this file. "
        f"Commands:\n\n```\n{commands}\n```\n\n{table}\n"
    )
    print(table)


if __name__ == "__main__":
    main()
