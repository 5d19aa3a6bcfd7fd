"""Choose the mask-only heart U-Net's training settings by its centre-of-mass error on validation phantoms.

Each setting (training-pool size, steps, batch size, image side, preset, learning rate) trains one ``segment`` run
(heart, ``--inputs mask``) through the one Trainer and is scored on the first ``--val-cases`` phantoms of the
validation split: the task's own 5 plus more drawn the same way (case ``i`` of a split has its own seed, so they are
new phantoms, disjoint from the training and test cases). Five validation cases are too few to tell settings apart
by a centre-of-mass error of a few mm; the test cases are never scored here.

    python experiments/segment_com_select.py --settings pool=12,pool=48,pool=192 --steps 400 --batch-size 8 \
        --out experiments/results/segment_com_select

appends one JSON line per run to ``<out>.jsonl`` and rewrites ``<out>.md`` from all the lines of that file.
A setting is ``key=value`` pairs joined by ``/`` (keys: pool, steps, batch, size, preset, lr); what it leaves out
comes from the flags. Errors in mm; ``cut``: bodies that the field of view cuts (their silhouette touches the edge).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from tensorslim.data.segment.sets import global_masks, load_split
from tensorslim.tasks.segment import predict
from tensorslim.tasks.segment.metrics import com_distance, dice
from tensorslim.train.config import TrainConfig
from tensorslim.train.trainer import Trainer

KEYS = {"pool": int, "steps": int, "batch": int, "size": int, "preset": str, "lr": float}


def parse_setting(text: str, args: argparse.Namespace) -> dict:
    setting = {"pool": 12, "steps": args.steps, "batch": args.batch_size, "size": 96, "preset": args.preset}
    setting["lr"] = args.lr
    for part in text.split("/"):
        key, _, value = part.partition("=")
        if key not in KEYS:
            raise SystemExit(f"setting {text!r}: key {key!r} is unknown; allowed: {list(KEYS)}")
        setting[key] = KEYS[key](value)
    return setting


def score(model: torch.nn.Module, size: int, count: int) -> dict:
    cases = load_split("heart", "val", size=size, count=count)
    masks = global_masks(cases.images)
    predicted = predict(model, torch.from_numpy(masks[:, None].astype(np.float32))).numpy()
    spacing = cases.spacing
    coms = np.array([com_distance(p, t, spacing) for p, t in zip(predicted, cases.targets, strict=True)])
    cut = np.array([bool(m[[0, -1]].any() or m[:, [0, -1]].any()) for m in masks])
    return {
        "val_dice": float(np.mean([dice(p, t) for p, t in zip(predicted, cases.targets, strict=True)])),
        "val_com_mm": float(np.nanmean(coms)),
        "val_com_cut_mm": float(np.nanmean(coms[cut])) if cut.any() else float("nan"),
        "val_com_not_cut_mm": float(np.nanmean(coms[~cut])),
        "val_cut": int(cut.sum()),
        "val_empty": int(np.isnan(coms).sum()),
    }


def one_run(setting: dict, seed: int, val_cases: int) -> dict:
    options = {"dataset": "heart", "inputs": "mask", "train_cases": setting["pool"], "train_pool": setting["pool"]}
    options["image_size"] = setting["size"]
    with tempfile.TemporaryDirectory() as folder:
        config = TrainConfig(
            preset=setting["preset"],
            task="segment",
            method="dense",
            task_options=options,
            steps=setting["steps"],
            batch_size=setting["batch"],
            seq_len=setting["size"] ** 2,
            lr=setting["lr"],
            warmup_fraction=0.05,
            eval_every=setting["steps"],
            checkpoint_every=setting["steps"],
            seed=seed,
            out_dir=folder,
            progress=False,
            tensorboard=False,
        )
        start = time.perf_counter()
        trainer = Trainer(config)
        result = trainer.run()
        seconds = time.perf_counter() - start
        return {
            **setting,
            "seed": seed,
            "seconds": round(seconds, 1),
            "final_loss": round(float(np.mean(result.losses[-20:])), 4),
            **score(trainer.model.eval(), setting["size"], val_cases),
        }


def table(rows: list[dict]) -> str:
    lines = [
        "| pool | steps | batch | size | preset | lr | seeds | val Dice | val CoM | CoM, cut | CoM, not cut | s/run |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in KEYS), []).append(row)
    for key, group in groups.items():
        cells = [f"{np.mean([r[m] for r in group]):.3f}" for m in ("val_dice",)]
        cells += [
            f"{np.mean([r[m] for r in group]):.2f}" for m in ("val_com_mm", "val_com_cut_mm", "val_com_not_cut_mm")
        ]
        seconds = np.mean([r["seconds"] for r in group])
        lines.append(
            "| " + " | ".join(map(str, key)) + f" | {len(group)} | " + " | ".join(cells) + f" | {seconds:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", required=True, help="comma-separated settings, e.g. pool=12,pool=48/steps=800")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--preset", default="unet-deep")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--val-cases", type=int, default=100)
    parser.add_argument("--out", default="experiments/results/segment_com_select")
    args = parser.parse_args()
    torch.set_num_threads(1)  # a shared machine: one thread per run
    out = Path(args.out)
    settings = [parse_setting(text, args) for text in args.settings.split(",")]
    command = "python experiments/segment_com_select.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
    )
    with out.with_suffix(".jsonl").open("a") as log:
        for setting in settings:
            for seed in range(args.seeds):
                row = one_run(setting, seed, args.val_cases) | {"command": command}
                print(json.dumps(row), file=log, flush=True)
                print(row, flush=True)
    rows = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    commands = "\n".join(f"    {c}" for c in dict.fromkeys(r["command"] for r in rows))
    text = [
        "# Mask-only heart U-Net: settings chosen by the validation centre-of-mass error",
        "",
        f"Commands (each appended its rows to `{out.with_suffix('.jsonl').name}`):",
        "",
        commands,
        "",
        f"Validation: the first {args.val_cases} phantoms of the validation split (clean; the mask hardly feels the "
        "shift). Means over seeds; errors in mm; `cut`: bodies the field of view cuts. Seconds per run on a shared "
        "2-core CPU machine at one thread, not a speed comparison. Test cases are not scored here.",
        "",
        table(rows),
    ]
    out.with_suffix(".md").write_text("\n".join(text) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
