"""Choose training settings (intensity augmentation, number of steps) on validation cases: each setting trains
through the one Trainer and is scored on the clean validation cases, on the same validation cases under the
test-time intensity shift (a fresh draw of the shift, not the test cases') and, for the record only, on the test
cases; each row also keeps the training-loss curve (10 means over equal spans of steps) to show convergence.

    python experiments/segment_select.py --datasets brain,heart --inputs image,image+mask --train-cases 1,4 \
        --intensity none,nnunet --seeds 1 --out experiments/results/segment_intensity_select

appends one JSON line per run to ``<out>.jsonl`` as it goes. The choice is made on the shifted validation Dice;
test Dice is never looked at for it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from tensorslim.data.segment.sets import IntensityShift, load_split
from tensorslim.tasks.segment import predict
from tensorslim.tasks.segment.metrics import case_metrics
from tensorslim.train.config import TrainConfig
from tensorslim.train.trainer import Trainer


def score(trainer: Trainer, cases: object) -> float:
    split = trainer.task._split(cases)
    predicted = predict(trainer.model.eval(), split.inputs).numpy()
    targets = split.targets.numpy()
    return float(np.mean([case_metrics(p, t, split.spacing)["dice"] for p, t in zip(predicted, targets, strict=True)]))


def one_run(
    dataset: str, inputs: str, n: int, intensity: str, seed: int, steps: int, dropout: float, args: argparse.Namespace
) -> dict:
    options = {"dataset": dataset, "inputs": inputs, "train_cases": n, "intensity": intensity}
    options |= {"mask_dropout": dropout} if dropout else {}  # rows of earlier runs have no such field
    with tempfile.TemporaryDirectory() as folder:
        config = TrainConfig(
            preset=args.preset,
            task="segment",
            method="dense",
            task_options=options,
            steps=steps,
            batch_size=args.batch_size,
            seq_len=96 * 96,
            lr=1e-2,
            warmup_fraction=0.05,
            eval_every=steps,
            checkpoint_every=steps,
            seed=seed,
            out_dir=folder,
            progress=False,
            tensorboard=False,
        )
        start = time.perf_counter()
        trainer = Trainer(config)
        losses: list[float] = []
        trainer.run(on_step=lambda record: losses.append(record["loss"]))
        span = max(1, steps // 10)
        seconds = time.perf_counter() - start
        return {
            **options,
            **({"preset": args.preset} if args.preset != "unet-small" else {}),  # earlier rows have no such field
            "seed": seed,
            "steps": steps,
            "loss_curve": [round(float(np.mean(losses[i : i + span])), 4) for i in range(0, steps, span)],
            "seconds": round(seconds, 1),
            "val_clean": score(trainer, load_split(dataset, "val", size=96)),
            "val_shift": score(trainer, load_split(dataset, "val", size=96, shift=IntensityShift())),
            "test": score(trainer, load_split(dataset, "test", size=96, shift=IntensityShift())),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="brain,heart")
    parser.add_argument("--inputs", default="image,image+mask")
    parser.add_argument("--train-cases", default="1,4")
    parser.add_argument("--intensity", default="none,nnunet")
    parser.add_argument("--mask-dropout", default="0", help="comma-separated mask-channel dropout rates")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--steps", default="100", help="comma-separated step counts")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--preset", default="unet-small", help="U-Net preset (rows record it when not unet-small)")
    parser.add_argument("--out", default="experiments/results/segment_intensity_select")
    args = parser.parse_args()
    torch.set_num_threads(1)  # a shared machine: one thread per run
    out = Path(args.out)
    with out.with_suffix(".jsonl").open("a") as log:
        for dataset in args.datasets.split(","):
            for n in (int(x) for x in args.train_cases.split(",")):
                for intensity in args.intensity.split(","):
                    for steps, dropout in itertools.product(
                        (int(x) for x in args.steps.split(",")), (float(x) for x in args.mask_dropout.split(","))
                    ):
                        for seed in range(args.seeds):
                            for inputs in args.inputs.split(","):
                                row = one_run(dataset, inputs, n, intensity, seed, steps, dropout, args)
                                print(json.dumps(row), file=log, flush=True)
                                print(row, flush=True)


if __name__ == "__main__":
    main()
