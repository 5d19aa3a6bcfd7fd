"""Our U-Nets vs MONAI's on the same split, all trained by the one Trainer with the same loss and learning-rate
grid (each model's learning rate chosen on the validation cases).

MONAI (``pip install monai``; the optional extra ``tensorslim[monai]``) is the reference implementation users would
reach for; segmentation_models_pytorch and nnU-Net import torchvision, which does not import beside our torch.
MONAI's models join the model registry for this script only:

* ``monai-unet``: ``monai.networks.nets.UNet`` with channels 8-64, strides 2 and two residual units per level, the
  setting of MONAI's tutorials (100,688 parameters; our ``unet-small``, 8-64 channels: 121,033);
* ``monai-unet-deep``: the same with five levels of 8-128 channels (our ``unet-deep``'s widths);
* ``monai-basicunet``: ``monai.networks.nets.BasicUNet``, the classic U-Net (two 3 × 3 convolutions per level, the
  first pair at full resolution, max-pooling, transposed convolutions, concatenated skips), with MONAI's default
  instance norm and LeakyReLU and features 8-16-32-64-128 (+ 8 at the last decoder level): 488,241 parameters
  against our ``unet-deep``'s 486,409, the like-for-like pair;
* and our ``unet-deep-in``: ``unet-deep`` with instance norm, BasicUNet's normalization (BasicUNet also differs by
  LeakyReLU and convolution biases).

Everything else is the same code for all: data, training cases, affine and intensity augmentation, loss (soft Dice
+ binary cross-entropy), AdamW warm-up/cosine schedule, steps, batch size and scoring on the intensity-shifted test
cases.

    python experiments/segment_monai.py --dataset heart --inputs mask --train-cases 8 --seeds 3 --steps 200 \
        --lrs 0.003,0.01,0.03 --models unet-small,monai-unet,unet-deep,monai-basicunet

writes ``experiments/results/segment_monai_<dataset>.md`` and ``.json``. For each model the learning rate with the
best mean validation Dice over the seeds is kept; the table reports its test scores, mean ± std over the seeds.
Run times are from a shared CPU machine whose load changes from run to run: they are not a speed comparison.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from tensorslim.data.segment.masks import largest_component
from tensorslim.models.registry import ModelFamily, ModelPreset, register_model
from tensorslim.models.unet import UNetConfig
from tensorslim.tasks.segment import predict
from tensorslim.tasks.segment.metrics import case_metrics
from tensorslim.train.config import TrainConfig
from tensorslim.train.trainer import Trainer

METRICS = ("dice", "hd95_mm", "com_mm")
MODELS = ("unet-small", "monai-unet", "unet-deep", "unet-deep-in", "monai-unet-deep", "monai-basicunet")


class MonaiUNet(nn.Module):
    """MONAI's 2-D UNet (strided convolutions, two residual units per level) behind our books' ``example_input``."""

    def __init__(self, config: UNetConfig) -> None:
        from monai.networks.nets import UNet

        super().__init__()
        self.config = config
        strides = (2,) * (len(config.channels) - 1)
        self.net = UNet(
            spatial_dims=2,
            in_channels=config.in_channels,
            out_channels=1,
            channels=config.channels,
            strides=strides,
            num_res_units=2,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def example_input(self, *, batch: int, seq_len: int) -> torch.Tensor:
        side = self.config.image_size
        return torch.zeros(batch, self.config.in_channels, side, side, device=next(self.parameters()).device)


class MonaiBasicUNet(MonaiUNet):
    """MONAI's 2-D BasicUNet (two convolutions per level from full resolution down; MONAI's default instance norm
    and LeakyReLU); ``config.channels`` gives its five levels, the last decoder level takes the first width."""

    def __init__(self, config: UNetConfig) -> None:
        from monai.networks.nets import BasicUNet

        nn.Module.__init__(self)
        if len(config.channels) != 5:
            raise ValueError(f"channels={config.channels!r} is invalid; allowed: five widths (BasicUNet's levels)")
        self.config = config
        features = (*config.channels, config.channels[0])
        self.net = BasicUNet(spatial_dims=2, in_channels=config.in_channels, out_channels=1, features=features)


def register() -> None:
    unet = ModelFamily(name="monai-unet", tasks=("segment",), build=lambda config, *, task: MonaiUNet(config))
    basic = ModelFamily(
        name="monai-basicunet", tasks=("segment",), build=lambda config, *, task: MonaiBasicUNet(config)
    )
    for name, family, channels in (
        ("monai-unet", unet, (8, 16, 32, 64)),
        ("monai-unet-deep", unet, (8, 16, 32, 64, 128)),
        ("monai-basicunet", basic, (8, 16, 32, 64, 128)),
    ):
        register_model(ModelPreset(name=name, family=family, config=UNetConfig(channels=channels), help="MONAI"))


def one_run(preset: str, lr: float, args: argparse.Namespace, seed: int, folder: Path) -> dict:
    options = {"dataset": args.dataset, "inputs": args.inputs, "train_cases": args.train_cases}
    config = TrainConfig(
        preset=preset,
        task="segment",
        method="dense",
        task_options=options,
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=96 * 96,
        lr=lr,
        warmup_fraction=0.05,
        eval_every=args.steps,
        checkpoint_every=args.steps,
        seed=seed,
        out_dir=str(folder / f"{preset}-{lr}-{seed}"),
        progress=False,
        tensorboard=False,
    )
    start = time.perf_counter()
    trainer = Trainer(config)
    result = trainer.run()
    seconds = time.perf_counter() - start
    row = {
        "model": preset,
        "lr": lr,
        "seed": seed,
        "params": sum(p.numel() for p in trainer.model.parameters()),
        "seconds": round(seconds, 1),
        "val_dice": result.val_metrics["val_dice"],
    }
    for split in ("val", "test"):
        cases = trainer.task.held_out(split)
        predicted = predict(trainer.model.eval(), cases.inputs).numpy()
        for post, masks in (("", predicted), ("lcc_", [largest_component(p) for p in predicted])):
            scores = [case_metrics(p, t, cases.spacing) for p, t in zip(masks, cases.targets.numpy(), strict=True)]
            prefix = "" if split == "test" else "val_"
            for k in METRICS if split == "test" else ("dice", "com_mm"):
                row[f"{post}{prefix}{k}"] = float(np.nanmean([s[k] for s in scores]))
    row["val_dice"] = result.val_metrics["val_dice"]
    return row


def best_lr(rows: list[dict], model: str) -> float:
    """The learning rate with the best mean validation Dice over seeds (never the test scores)."""
    lrs = sorted({r["lr"] for r in rows if r["model"] == model})
    return max(lrs, key=lambda lr: np.mean([r["val_dice"] for r in rows if r["model"] == model and r["lr"] == lr]))


def mean_std(values: list[float]) -> str:
    return f"{np.mean(values):.3f} ± {np.std(values):.3f}"


def report(args: argparse.Namespace, rows: list[dict], command: str) -> str:
    lines = [
        f"# Our U-Nets vs MONAI's ({args.dataset}, inputs {args.inputs}, {args.train_cases} cases)",
        "",
        f"Command: `{command}`",
        "",
        f"Same split, augmentation, loss, AdamW schedule, {args.steps} steps of batch {args.batch_size}, and scoring "
        "(intensity-shifted test cases). Each model's learning rate is the one of the grid with the best mean "
        f"validation Dice over {args.seeds} seeds; test scores are mean ± std over those seeds. Seconds: wall time "
        "per run on a shared 2-core CPU machine whose load (other users' jobs) changed between the runs, so they "
        "are not a speed comparison.",
        "",
        "| model | params | lr (chosen) | val Dice | test Dice | HD95 (mm) | CoM (mm) | seconds/run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    models = [m for m in MODELS if any(r["model"] == m for r in rows)]
    for model in models:
        lr = best_lr(rows, model)
        group = [r for r in rows if r["model"] == model and r["lr"] == lr]
        cells = [mean_std([r[k] for r in group]) for k in ("val_dice", *METRICS)]
        seconds = np.mean([r["seconds"] for r in group])
        lines.append(f"| {model} | {group[0]['params']:,} | {lr:g} | " + " | ".join(cells) + f" | {seconds:.0f} |")
    lines += [
        "",
        "Validation Dice per learning rate (mean over seeds):",
        "",
        "| model | " + " | ".join(f"lr {lr:g}" for lr in sorted({r["lr"] for r in rows})) + " |",
        "|---|" + "---|" * len({r["lr"] for r in rows}),
    ]
    for model in models:
        cells = [
            f"{np.mean([r['val_dice'] for r in rows if r['model'] == model and r['lr'] == lr]):.3f}"
            for lr in sorted({r["lr"] for r in rows})
        ]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="heart")
    parser.add_argument("--inputs", default="mask")
    parser.add_argument("--train-cases", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lrs", default="0.003,0.01,0.03", help="comma-separated learning-rate grid (both models)")
    parser.add_argument("--models", default="unet-small,monai-unet", help=f"comma-separated, from {list(MODELS)}")
    parser.add_argument("--reuse", action="store_true", help="keep the runs of the results file with the same settings")
    args = parser.parse_args()
    torch.set_num_threads(1)  # a shared machine: one thread per run
    register()
    lrs = [float(x) for x in args.lrs.split(",")]
    models = args.models.split(",")
    if unknown := sorted(set(models) - set(MODELS)):
        parser.error(f"--models {unknown} are unknown; allowed: {list(MODELS)}")
    settings = (
        f"--dataset {args.dataset} --inputs {args.inputs} --train-cases {args.train_cases} --steps {args.steps} "
        f"--batch-size {args.batch_size}"
    )
    command = (
        f"python experiments/segment_monai.py {settings} --seeds {args.seeds} --lrs {args.lrs} --models {args.models}"
    )
    out = Path("experiments/results") / f"segment_monai_{args.dataset}"
    done = {}
    if args.reuse and out.with_suffix(".json").exists():  # runs are deterministic: keep those already measured
        old = json.loads(out.with_suffix(".json").read_text())
        if old.get("settings") == settings:
            done = {(r["model"], r["lr"], r["seed"]): r for r in old["runs"]}
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for seed in range(args.seeds):
            for lr in lrs:
                for preset in models:
                    row = done.get((preset, lr, seed)) or one_run(preset, lr, args, seed, Path(folder))
                    rows.append(row)
                    print(row, flush=True)
    record = {"command": command, "settings": settings, "runs": rows}
    out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    text = report(args, rows, command)
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
