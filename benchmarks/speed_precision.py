"""Does ``--dtype auto`` train like fp32? The same short run twice through the Trainer, fp32 and auto, with their
loss curves, the precision ``auto`` chose (and why), and the steady tokens/s of each.

The runs share seed, data order and initialization, so the only difference is the precision; the loss gap is
compared with the step-to-step noise of the fp32 curve itself (the standard deviation of its differences over the
last half), which is what "within noise" means here.

Usage:
    python benchmarks/speed_precision.py --preset tiny --method cola --steps 60 --out benchmarks/results/speed_precision
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from _results import table, write

from tensorslim.train.config import TrainConfig
from tensorslim.train.trainer import train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--method", default="cola")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    runs = {}
    with tempfile.TemporaryDirectory() as folder:
        for dtype in ("fp32", "auto"):
            config = TrainConfig(
                preset=args.preset,
                method=args.method,
                steps=args.steps,
                batch_size=args.batch_size,
                seq_len=args.seq_len,
                dtype=dtype,
                eval_every=args.steps,
                checkpoint_every=args.steps,
                out_dir=f"{folder}/{dtype}",
                progress=False,
                tensorboard=False,
            )
            result = train(config)
            runs[dtype] = {
                "losses": result.losses,
                "val_loss": result.val_loss,
                "tokens_per_s": result.tokens_per_s,
                "precision": result.precision,
            }
    fp32, auto = runs["fp32"]["losses"], runs["auto"]["losses"]
    half = len(fp32) // 2
    noise = statistics.stdev(b - a for a, b in zip(fp32[half:], fp32[half + 1 :], strict=False))
    gap = [b - a for a, b in zip(fp32, auto, strict=True)]
    summary = {
        "auto_chose": runs["auto"]["precision"]["used"],
        "probe": runs["auto"]["precision"]["probe"],
        "fp32_step_noise": noise,
        "mean_abs_gap_last_half": statistics.mean(abs(g) for g in gap[half:]),
        "val_loss": {k: v["val_loss"] for k, v in runs.items()},
        "tokens_per_s": {k: v["tokens_per_s"] for k, v in runs.items()},
        "runs": runs,
    }
    rows = [
        ["final validation loss", f"{runs['fp32']['val_loss']:.4f}", f"{runs['auto']['val_loss']:.4f}"],
        ["mean train loss, last 10 steps", f"{statistics.mean(fp32[-10:]):.4f}", f"{statistics.mean(auto[-10:]):.4f}"],
        ["steady tokens/s (median)", f"{runs['fp32']['tokens_per_s']:,.0f}", f"{runs['auto']['tokens_per_s']:,.0f}"],
    ]
    lines = [
        *table(["", "fp32", "auto"], rows),
        f"Mean |loss gap| over the last half: {summary['mean_abs_gap_last_half']:.4f}; the fp32 curve's own "
        f"step-to-step noise (std of successive differences): {noise:.4f}.",
    ]
    print("\n".join(lines))
    if args.out:
        title = f"`--dtype auto` against fp32: {args.preset} {args.method}, {args.steps} steps"
        notes = [f"auto chose **{summary['auto_chose']}** ({summary['probe']['reason']}); tokens/s are wall clock"]
        write(Path(args.out), title, lines, data=summary, notes=notes)


if __name__ == "__main__":
    main()
