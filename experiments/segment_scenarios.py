"""The segmentation scenarios of arXiv 2205.09107 (global binary masks) through the one Trainer: the tables and figures
of docs/segmentation.md.

Every run is one ``tensorslim segment`` run (:func:`tensorslim.cli.segment.segment_config`, scored by
:func:`tensorslim.cli.segment.train_and_score`); this script loops over input modes × training-set sizes × seeds,
scores each trained model on the intensity-shifted test cases (Dice, 95 % Hausdorff and centre-of-mass distance in mm)
beside the constant predictor (the training targets' majority mask), and writes a JSON of every run, a Markdown
table, overlays of predictions on test cases and a Dice-vs-cases plot.

Usage:
    python experiments/segment_scenarios.py --dataset heart --inputs mask,image,image+mask --train-cases 1,2,4,8 \
        --seeds 5 --out-dir experiments/results/segment_heart_lowdata
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from tensorslim.cli.segment import METRICS, segment_config, train_and_score


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", default="heart", help="brain (warped MNI152, ventricles) or heart (phantoms)")
    parser.add_argument(
        "--inputs", default="mask,image,image+mask", help="comma-separated input modes (also: prior, image+prior)"
    )
    parser.add_argument("--train-cases", default="1,2,4,8", help="comma-separated training-set sizes")
    parser.add_argument(
        "--train-pool", type=int, default=0, help="training pool size; 0: the paper's (brain 26, heart 12)"
    )
    parser.add_argument("--seeds", type=int, default=1, help="seeds per setting (0, 1, ...)")
    parser.add_argument(
        "--preset", default="unet-small", help="U-Net preset: unet-small (8-64 ch), unet (16-128), unet-deep (8-128)"
    )
    parser.add_argument("--image-size", type=int, default=96, help="image side in pixels")
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps per run")
    parser.add_argument("--batch-size", type=int, default=8, help="images per step")
    parser.add_argument("--lr", type=float, default=1e-2, help="peak learning rate (AdamW, warm-up then cosine)")
    parser.add_argument("--augment", action=argparse.BooleanOptionalAction, default=True, help="random affine moves")
    parser.add_argument(
        "--intensity", default="nnunet", help="image-channel intensity augmentation: none, nnunet (default), strong"
    )
    parser.add_argument(
        "--mask-dropout", type=float, default=0.0, help="probability of blanking the mask channel of a training sample"
    )
    parser.add_argument("--overlay-cases", type=int, default=4, help="test cases shown in the overlay figure")
    parser.add_argument("--out-dir", default=None, help="where results go (default: runs/segment-<dataset>)")
    parser.add_argument("--keep-runs", action="store_true", help="keep each run's folder (checkpoint, metrics)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")


def _list(text: str, kind: type, name: str) -> list[Any]:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{name}={text!r} is invalid; allowed: a comma-separated list of {kind.__name__}") from None
    if not values:
        raise ValueError(f"{name}={text!r} is invalid; allowed: a non-empty comma-separated list")
    return values


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this experiment."""
    flags = [f"--dataset {args.dataset}", f"--inputs {args.inputs}", f"--train-cases {args.train_cases}"]
    flags += [f"--train-pool {args.train_pool}"] if args.train_pool else []
    flags += [f"--seeds {args.seeds}", f"--preset {args.preset}", f"--image-size {args.image_size}"]
    flags += [f"--steps {args.steps}", f"--batch-size {args.batch_size}", f"--lr {args.lr}"]
    flags += [] if args.augment else ["--no-augment"]
    flags += [f"--intensity {args.intensity}"]
    flags += [f"--mask-dropout {args.mask_dropout}"] if args.mask_dropout else []
    return "python experiments/segment_scenarios.py " + " ".join(flags)


def run(args: argparse.Namespace) -> int:
    from tensorslim._checks import require_output
    from tensorslim.tasks.segment import SegmentOptions

    modes = _list(args.inputs, str, "inputs")
    sizes = _list(args.train_cases, int, "train_cases")
    if args.seeds < 1:
        raise ValueError(f"seeds={args.seeds} is invalid; allowed: an integer >= 1")
    if args.overlay_cases < 0:
        raise ValueError(f"overlay_cases={args.overlay_cases} is invalid; allowed: an integer >= 0")
    settings = [
        SegmentOptions(
            dataset=args.dataset,
            inputs=mode,
            train_cases=n,
            train_pool=args.train_pool,
            image_size=args.image_size,
            augment=args.augment,
            intensity=args.intensity,
            mask_dropout=args.mask_dropout,  # used by the two-channel modes only
        )
        for n in sizes
        for mode in modes
    ]  # every setting is checked before the first run starts
    out_dir = Path(args.out_dir or f"runs/segment-{args.dataset}")
    require_output("out_dir", out_dir, folder=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs_dir = out_dir / "runs" if args.keep_runs else Path(tempfile.mkdtemp(prefix="tensorslim-segment-"))

    def config_of(options: SegmentOptions, seed: int) -> Any:
        name = f"{options.dataset}-{options.inputs}-n{options.train_cases}-s{seed}"
        return segment_config(
            options,
            preset=args.preset,
            steps=args.steps,
            batch_size=args.batch_size,
            lr=args.lr,
            seed=seed,
            device=args.device,
            out_dir=str(runs_dir / name),
            overwrite=True,  # a run of an earlier sweep into the same folder: the sweep keeps its own results
        )

    from tensorslim.train.trainer import Interrupted

    rows: list[dict[str, Any]] = []
    shown: dict[str, Any] = {}
    try:
        for seed in range(args.seeds):
            for options in settings:
                row, trainer, predicted = train_and_score(config_of(options, seed))
                rows.append(row)
                if options.inputs == modes[0]:
                    rows.append(_constant_row(trainer, options, seed))
                if seed == 0 and options.train_cases == max(sizes):
                    shown[options.inputs] = predicted[: args.overlay_cases]
                    shown.setdefault("test", trainer.task.held_out("test"))
                    shown["constant"] = [trainer.task.prior] * args.overlay_cases
                print(_progress_line(row), flush=True)
    except Interrupted as stop:
        print(f"segment_scenarios.py: interrupted after {len(rows)} rows; nothing written", flush=True)
        return 128 + stop.signal_number
    finally:
        if not args.keep_runs:
            shutil.rmtree(runs_dir, ignore_errors=True)
    _write_results(args, rows, shown, out_dir)
    return 0


def _constant_row(trainer: Any, options: Any, seed: int) -> dict[str, Any]:
    """The floor: the training targets' majority mask predicted for every test case."""
    import numpy as np

    from tensorslim.tasks.segment.metrics import case_metrics

    test = trainer.task.held_out("test")
    scores = [case_metrics(trainer.task.prior, t, test.spacing) for t in test.targets.numpy()]
    return {
        "dataset": options.dataset,
        "inputs": "constant",
        "train_cases": options.train_cases,
        "seed": seed,
        **{name: float(np.nanmean([s[name] for s in scores])) for name in METRICS},
    }


def _progress_line(row: dict[str, Any]) -> str:
    return (
        f"{row['inputs']:<12} n={row['train_cases']:<3} seed={row['seed']} dice={row['dice']:.3f} "
        f"hd95={row['hd95_mm']:.2f} mm com={row['com_mm']:.2f} mm ({row['seconds']:.0f} s)"
    )


def summary_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per input mode and training-set size, mean ± std over seeds of Dice, HD95 and CoM distance."""
    import numpy as np

    modes = list(dict.fromkeys(row["inputs"] for row in rows))
    sizes = sorted({row["train_cases"] for row in rows})
    lines = ["| inputs | cases | seeds | Dice | HD95 (mm) | CoM (mm) |", "|---|---|---|---|---|---|"]
    for mode in modes:
        for n in sizes:
            group = [row for row in rows if row["inputs"] == mode and row["train_cases"] == n]
            if not group:
                continue
            cells = [f"{np.mean([r[m] for r in group]):.3f} ± {np.std([r[m] for r in group]):.3f}" for m in METRICS]
            lines.append(f"| {mode} | {n} | {len(group)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def gain_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: relative Dice gain of image+mask over image per training-set size (the paper's scenario 2)."""
    import numpy as np

    sizes = sorted({row["train_cases"] for row in rows})
    lines = ["| cases | image Dice | image+mask Dice | relative gain |", "|---|---|---|---|"]
    for n in sizes:
        image = [r["dice"] for r in rows if r["inputs"] == "image" and r["train_cases"] == n]
        both = [r["dice"] for r in rows if r["inputs"] == "image+mask" and r["train_cases"] == n]
        if image and both:
            gain = (np.mean(both) - np.mean(image)) / max(np.mean(image), 1e-9)
            lines.append(f"| {n} | {np.mean(image):.3f} | {np.mean(both):.3f} | {100 * gain:+.1f} % |")
    return "\n".join(lines) if len(lines) > 2 else ""


def _write_results(args: argparse.Namespace, rows: list[dict[str, Any]], shown: dict[str, Any], out: Path) -> None:
    from tensorslim.tasks.segment.plots import plot_dice_curves, plot_overlays

    stem = f"segment_{args.dataset}"
    command = command_line(args)
    (out / f"{stem}.json").write_text(json.dumps({"command": command, "runs": rows}, indent=2) + "\n")
    gains = gain_table(rows)
    text = [
        f"# Segmentation with global binary masks: {args.dataset}",
        "",
        f"Command: `{command}`",
        "",
        "Test cases carry the intensity shift (gamma, bias field, noise); `constant` is the training targets' "
        "majority mask predicted for every case. Mean ± std over seeds of the per-run test means; HD95 and CoM "
        "skip empty predictions (counted in the JSON). Run times are on a shared, loaded CPU machine.",
        "",
        summary_table(rows),
        "",
    ]
    if gains:
        text += ["Image + mask vs image only:", "", gains, ""]
    (out / f"{stem}.md").write_text("\n".join(text))
    curves = [r for r in rows if r["inputs"] != "constant"]
    plot_dice_curves(curves, out / f"{stem}_dice.png", title=f"{args.dataset}: test Dice vs training cases")
    test = shown.pop("test", None)
    if test is not None and args.overlay_cases > 0:
        k = args.overlay_cases
        predictions = {name: list(value) for name, value in shown.items()}
        plot_overlays(
            test.images[:k], test.targets.numpy()[:k], predictions, out / f"{stem}_overlays.png", title=command
        )
    print(summary_table(rows))
    print(f"results: {out / stem}.md, .json, _dice.png, _overlays.png")


def main(argv: list[str] | None = None) -> int:
    """Run the scenarios; a bad flag is one line on stderr and exit code 2, before any run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ValueError as error:
        print(f"segment_scenarios.py: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
