"""LaX-TT against plain TT on the tiny LLaMA, with the G = 0 ablation, on the public API only.

LaX (Zhang et al., 2025, arXiv 2505.21732, §3 "Variants of LaX") adds latent crossing to CoMERA's tensor-train
layers: the latent at the middle TT bond of each layer receives ``G(h_prev)`` from the same layer type in the block
before, through an r-dimensional LayerNorm, and the attention projections get intra-layer residuals. Three arms,
each one ``TrainConfig`` + ``train`` run on the built-in corpus, same seeds and data order:

* ``tt``: CoMERA's TT layers (max rank 30, random init), no rank gates, AdamW (``--method tt``).
* ``lax-tt``: the same TT layers with Kronecker crossings and intra residuals (``--method lax-tt``).
* ``lax-tt G=0``: LaX-TT with every crossing zero and frozen (``--lax-crossing zero``): the LayerNorm on the
  latents and the intra residuals stay, the crossing between blocks is gone.

LaX adds a² + b² crossing plus 2r LayerNorm parameters per crossing layer (0.1 % of the tiny model); the table lists
every arm's parameter count. Writes ``<out>/results.md`` and ``<out>/results.json``.

Usage::

    python experiments/lax_tt.py --steps 150 --batch-size 8 --seq-len 128 --seeds 0,1

Not imported by ``tensorslim``; it uses nothing but the package's public API.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from datetime import date
from pathlib import Path

import torch

from tensorslim.methods import build_for_method
from tensorslim.train.config import TrainConfig
from tensorslim.train.trainer import train

ARMS: dict[str, tuple[str, dict | None]] = {
    "tt": ("tt", None),
    "lax-tt": ("lax-tt", None),
    "lax-tt G=0": ("lax-tt", {"crossing": "zero"}),
}


def _run(args: argparse.Namespace, arm: str, seed: int) -> dict:
    """One trainer run of ``arm``; its validation loss and parameter counts."""
    method, options = ARMS[arm]
    options = {**(options or {}), **({"rank": args.rank} if args.rank else {})} or None
    config = TrainConfig(
        preset=args.preset,
        method=method,
        options=options,
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        lr=args.lr,
        eval_every=args.steps,
        checkpoint_every=args.steps,
        out_dir=str(args.out / f"{arm.replace(' ', '_').replace('=', '')}-seed{seed}"),
        seed=seed,
        progress=False,
        tensorboard=False,
    )
    result = train(config)
    model, _, _ = build_for_method(args.preset, method, options=options, device="meta")
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {
        "arm": arm,
        "seed": seed,
        "val_loss": result.val_loss,
        "params": result.params_total,
        "trainable": trainable,
    }


def render(rows: list[dict], args: argparse.Namespace, argv: list[str]) -> str:
    """A Markdown table: validation loss per arm and seed, the mean, and the parameter counts."""
    seeds = sorted({row["seed"] for row in rows})
    head = [
        "arm",
        *[f"val loss seed {s}" for s in seeds],
        "mean",
        "params",
        "trainable",
        f"params vs {'tt' if any(r['arm'] == 'tt' for r in rows) else rows[0]['arm']}",
    ]
    base = next((row["params"] for row in rows if row["arm"] == "tt"), rows[0]["params"])
    lines = [
        "# LaX-TT vs plain TT on the tiny LLaMA",
        "",
        f"- command: `python experiments/lax_tt.py {' '.join(argv)}`",
        f"- machine: {platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}",
        f"- date: {date.today().isoformat()}",
        f"- preset {args.preset}, {args.steps} steps, batch {args.batch_size}, seq {args.seq_len}, peak lr "
        f"{TrainConfig(preset=args.preset, method='tt', lr=args.lr).peak_lr()}",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for arm in ARMS:
        arm_rows = {row["seed"]: row for row in rows if row["arm"] == arm}
        if not arm_rows:
            continue
        losses = [arm_rows[s]["val_loss"] for s in seeds if s in arm_rows]
        first = next(iter(arm_rows.values()))
        cells = [arm, *[f"{arm_rows[s]['val_loss']:.4f}" if s in arm_rows else "–" for s in seeds]]
        cells += [f"{statistics.mean(losses):.4f}", f"{first['params']:,}", f"{first['trainable']:,}"]
        cells.append(f"{100 * (first['params'] / base - 1):+.2f} %")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, from: {', '.join(ARMS)}")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds")
    parser.add_argument("--rank", type=int, default=None, help="TT max rank (default: CoMERA's 30)")
    parser.add_argument("--lr", type=float, default=None, help="peak lr (default: the recipe's)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: a temporary one)")
    args = parser.parse_args(argv)
    args.out = args.out or Path(tempfile.mkdtemp(prefix="lax_tt_"))
    arms = args.arms.split(",")
    unknown = [arm for arm in arms if arm not in ARMS]
    if unknown:
        parser.error(f"--arms {unknown} unknown; allowed: {list(ARMS)}")
    rows = [_run(args, arm, int(seed)) for seed in args.seeds.split(",") for arm in arms]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=2))
    table = render(rows, args, argv)
    (args.out / "results.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
