"""``tensorslim segment``: train and evaluate one global-binary-mask segmentation setting (arXiv 2205.09107) through
the one Trainer.

One ``segment`` task run (:mod:`tensorslim.tasks.segment`) of a U-Net preset on one input mode (the image, the global
binary mask, or both) and one training-set size, scored on the intensity-shifted test cases: Dice, 95 % Hausdorff and
centre-of-mass distance in mm. The run folder keeps the model (``tensorslim.tasks.segment.load_run`` reads it back).
The paper's scenarios (every mode × size × seed, with tables and figures) are ``experiments/segment_scenarios.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch loads only when a command runs (after the OpenMP setting)
    from tensorslim.tasks.segment import SegmentOptions
    from tensorslim.train.config import TrainConfig

NAME = "segment"
HELP = "train and evaluate one U-Net segmentation setting: image, global binary mask or both (arXiv 2205.09107)"
METRICS = ("dice", "hd95_mm", "com_mm")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", default="heart", help="brain (warped MNI152, ventricles) or heart (phantoms)")
    parser.add_argument("--inputs", default="image+mask", help="mask, image, image+mask, prior or image+prior")
    parser.add_argument("--train-cases", type=int, default=4, help="training cases drawn from the pool (default: 4)")
    parser.add_argument(
        "--train-pool", type=int, default=0, help="training pool size; 0: the paper's (brain 26, heart 12)"
    )
    parser.add_argument(
        "--preset", default="unet-small", help="U-Net preset: unet-small (8-64 ch), unet (16-128), unet-deep (8-128)"
    )
    parser.add_argument("--image-size", type=int, default=96, help="image side in pixels")
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, default=8, help="images per step")
    parser.add_argument("--lr", type=float, default=1e-2, help="peak learning rate (AdamW, warm-up then cosine)")
    parser.add_argument("--augment", action=argparse.BooleanOptionalAction, default=True, help="random affine moves")
    parser.add_argument(
        "--intensity", default="nnunet", help="image-channel intensity augmentation: none, nnunet (default), strong"
    )
    parser.add_argument(
        "--mask-dropout", type=float, default=0.0, help="probability of blanking the mask channel of a training sample"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the training cases, the init and the data order")
    parser.add_argument("--out-dir", default=None, help="run folder (default: runs/segment-<dataset>-<inputs>)")
    parser.add_argument("--overwrite", action="store_true", help="replace the run's own outputs in a used folder")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")


def segment_config(
    options: SegmentOptions,
    *,
    preset: str,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    device: str,
    out_dir: str,
    overwrite: bool = False,
) -> TrainConfig:
    """The Trainer configuration of one segmentation run: the dense U-Net on the ``segment`` task, a short warm-up,
    one evaluation and one checkpoint at the end."""
    from tensorslim.train.config import TrainConfig

    return TrainConfig(
        preset=preset,
        task="segment",
        method="dense",
        task_options=options,
        steps=steps,
        batch_size=batch_size,
        seq_len=options.image_size**2,  # a sequence is an image; its tokens are pixels
        lr=lr,
        warmup_fraction=0.05,
        eval_every=steps,
        checkpoint_every=steps,
        seed=seed,
        device=device,
        out_dir=out_dir,
        overwrite=overwrite,
        progress=False,
        tensorboard=False,
    )


def train_and_score(config: TrainConfig) -> tuple[dict[str, Any], Any, Any]:
    """Train one configuration through the Trainer and score it on the intensity-shifted test cases: the row of
    test means (:data:`METRICS`, empty predictions, validation Dice and CoM, seconds), the trainer, the predictions."""
    import numpy as np

    from tensorslim.tasks.segment import predict
    from tensorslim.tasks.segment.metrics import case_metrics
    from tensorslim.train.trainer import Trainer

    start = time.perf_counter()
    trainer = Trainer(config)
    result = trainer.run()
    seconds = time.perf_counter() - start
    test = trainer.task.held_out("test")
    predicted = predict(trainer.model.eval(), test.inputs).numpy()
    scores = [case_metrics(p, t, test.spacing) for p, t in zip(predicted, test.targets.numpy(), strict=True)]
    options = config.task_options
    row = {
        "dataset": options.dataset,
        "inputs": options.inputs,
        "train_cases": options.train_cases,
        "seed": config.seed,
        **{name: float(np.nanmean([s[name] for s in scores])) for name in METRICS},
        "empty_predictions": int(sum(not p.any() for p in predicted)),
        "val_dice": result.val_metrics["val_dice"],
        "val_com_mm": result.val_metrics["val_com_mm"],
        "seconds": round(seconds, 1),
    }
    return row, trainer, predicted


def run(args: argparse.Namespace) -> int:
    from tensorslim._checks import require_output
    from tensorslim.tasks.segment import SegmentOptions

    options = SegmentOptions(**{field.name: getattr(args, field.name) for field in dataclasses.fields(SegmentOptions)})
    run_flags = ("preset", "steps", "batch_size", "lr", "seed", "device", "overwrite")
    out_dir = args.out_dir or f"runs/segment-{args.dataset}-{args.inputs}"
    config = segment_config(options, out_dir=out_dir, **{name: getattr(args, name) for name in run_flags})
    require_output("out_dir", config.run_dir, folder=True)
    row, _, _ = train_and_score(config)
    print(
        f"tensorslim segment: {row['dataset']} from {row['inputs']}, {row['train_cases']} training cases: test Dice "
        f"{row['dice']:.3f}, HD95 {row['hd95_mm']:.2f} mm, CoM {row['com_mm']:.2f} mm "
        f"({row['empty_predictions']} empty predictions, {row['seconds']:.0f} s); run folder {config.run_dir}"
    )
    return 0
