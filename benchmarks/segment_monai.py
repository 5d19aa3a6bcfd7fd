"""Our U-Net + Dice/BCE vs MONAI's UNet + DiceLoss on the same split, both trained by the one Trainer.

MONAI (``pip install monai``; the optional extra ``tensorslim[monai]``) is the reference implementation users would
reach for; segmentation_models_pytorch and nnU-Net import torchvision, which does not import beside our torch.
MONAI's model joins the model registry for this script only (preset ``monai-unet``: ``monai.networks.nets.UNet``
with MONAI's defaults, i.e. strided convolutions and no residual units, at the same channels 8-64) and its loss
through a task subclass (``segment-monai``: MONAI's ``DiceLoss(sigmoid=True)`` + BCE), so data, augmentation,
optimizer, schedule and scoring are the same code.

    python benchmarks/segment_monai.py --dataset heart --inputs mask --train-cases 8 --seeds 1 --steps 200

writes ``benchmarks/results/segment_monai_<dataset>.md`` and ``.json``. Run times are from a shared, loaded CPU
machine whose load changes from run to run: they are not a speed comparison.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.models.registry import ModelFamily, ModelPreset, register_model
from tensorslim.models.unet import UNetConfig
from tensorslim.segment.metrics import case_metrics
from tensorslim.tasks.base import register_task
from tensorslim.tasks.segment import Segmentation, predict
from tensorslim.train.config import TrainConfig
from tensorslim.train.trainer import Trainer


class MonaiUNet(nn.Module):
    """MONAI's 2-D UNet (its defaults: strided convolutions, no residual units) behind our books' ``example_input``."""

    def __init__(self, config: UNetConfig) -> None:
        from monai.networks.nets import UNet

        super().__init__()
        self.config = config
        strides = (2,) * (len(config.channels) - 1)
        self.net = UNet(
            spatial_dims=2, in_channels=config.in_channels, out_channels=1, channels=config.channels, strides=strides
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def example_input(self, *, batch: int, seq_len: int) -> torch.Tensor:
        side = self.config.image_size
        return torch.zeros(batch, self.config.in_channels, side, side, device=next(self.parameters()).device)


class MonaiSegmentation(Segmentation):
    """The segment task with MONAI's DiceLoss (sigmoid) + binary cross-entropy."""

    name = "segment-monai"
    help = "segment, with MONAI's DiceLoss"
    model_task = "segment"

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        from monai.losses import DiceLoss

        inputs, targets = batch
        logits = model(inputs).float()
        return DiceLoss(sigmoid=True)(logits, targets) + F.binary_cross_entropy_with_logits(logits, targets)


def register() -> None:
    family = ModelFamily(name="monai-unet", tasks=("segment",), build=lambda config, *, task: MonaiUNet(config))
    preset = ModelPreset(name="monai-unet", family=family, config=UNetConfig(channels=(8, 16, 32, 64)), help="MONAI")
    register_model(preset)
    register_task(MonaiSegmentation)


def one_run(preset: str, task: str, args: argparse.Namespace, seed: int, folder: Path) -> dict:
    options = {"dataset": args.dataset, "inputs": args.inputs, "train_cases": args.train_cases}
    config = TrainConfig(
        preset=preset,
        task=task,
        method="dense",
        task_options=options,
        steps=args.steps,
        batch_size=8,
        seq_len=96 * 96,
        lr=1e-2,
        warmup_fraction=0.05,
        eval_every=args.steps,
        checkpoint_every=args.steps,
        seed=seed,
        out_dir=str(folder / f"{preset}-{seed}"),
        progress=False,
        tensorboard=False,
    )
    start = time.perf_counter()
    trainer = Trainer(config)
    trainer.run()
    seconds = time.perf_counter() - start
    test = trainer.task.held_out("test")
    predicted = predict(trainer.model.eval(), test.inputs).numpy()
    scores = [case_metrics(p, t, test.spacing) for p, t in zip(predicted, test.targets.numpy(), strict=True)]
    params = sum(p.numel() for p in trainer.model.parameters())
    return {
        "model": preset,
        "seed": seed,
        "params": params,
        "seconds": round(seconds, 1),
        **{k: float(np.nanmean([s[k] for s in scores])) for k in ("dice", "hd95_mm", "com_mm")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="heart")
    parser.add_argument("--inputs", default="mask")
    parser.add_argument("--train-cases", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    register()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for seed in range(args.seeds):
            for preset, task in (("unet-small", "segment"), ("monai-unet", "segment-monai")):
                rows.append(one_run(preset, task, args, seed, Path(folder)))
                print(rows[-1], flush=True)
    command = (
        f"python benchmarks/segment_monai.py --dataset {args.dataset} --inputs {args.inputs} "
        f"--train-cases {args.train_cases} --seeds {args.seeds} --steps {args.steps}"
    )
    out = Path("benchmarks/results") / f"segment_monai_{args.dataset}"
    out.with_suffix(".json").write_text(json.dumps({"command": command, "runs": rows}, indent=2) + "\n")
    lines = [
        f"# Our U-Net vs MONAI UNet + DiceLoss ({args.dataset}, inputs {args.inputs}, {args.train_cases} cases)",
        "",
        f"Command: `{command}`",
        "",
        "Same split, augmentation, AdamW schedule and scoring (intensity-shifted test cases); mean over seeds. "
        "Seconds: wall time per run on a shared 2-core CPU machine whose load (other users' jobs) changed between "
        "the runs, so they are not a speed comparison.",
        "",
        "| model | params | Dice | HD95 (mm) | CoM (mm) | seconds/run |",
        "|---|---|---|---|---|---|",
    ]
    for preset in ("unet-small", "monai-unet"):
        group = [r for r in rows if r["model"] == preset]
        cells = [f"{np.mean([r[k] for r in group]):.3f}" for k in ("dice", "hd95_mm", "com_mm")]
        lines.append(
            f"| {preset} | {group[0]['params']:,} | "
            + " | ".join(cells)
            + f" | {np.mean([r['seconds'] for r in group]):.0f} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
