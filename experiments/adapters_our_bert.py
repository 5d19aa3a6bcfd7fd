"""Adapters on our own BERT: pre-train ``bert-small`` with MLM, then adapt it to BBC News titles (the one Trainer).

1. A dense MLM run of ``--preset`` on the BBC articles (``--mlm-steps``), unless ``--base`` names one already made.
2. Per method and seed, a ``classify`` run on ``bbcnews-titles`` (all 1,700 training titles, the fixed test split)
   started from that run's encoder with ``--init-base``; ``dense`` is full fine-tuning of it, ``scratch`` the same
   classifier trained from a random init. Each method at its registered default learning rate (no grid). Accuracy
   only: the adapters' step and inference costs are measured side by side in ``benchmarks/adapters_costs.py``.

Writes ``<out>.jsonl`` (one line per run, appended, finished runs skipped on a rerun) and ``<out>.md``.

Usage:
    python experiments/adapters_our_bert.py --out experiments/results/adapters_our_bert
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

METHODS = ("scratch", "dense", "lora", "prefix", "adapter", "prompt", "unipelt", "unipelt-prompt")


def pretrain(preset: str, steps: int, folder: Path) -> Path:
    from tensorslim.train.config import TrainConfig
    from tensorslim.train.trainer import train

    if not (folder / "checkpoints" / "latest").exists():
        config = TrainConfig(
            preset=preset,
            task="mlm",
            method="dense",
            data="bbcnews",
            steps=steps,
            eval_every=steps,
            checkpoint_every=steps,
            out_dir=str(folder),
            progress=False,
            tensorboard=False,
        )
        result = train(config)
        print(json.dumps({"mlm_steps": steps, "mlm_val_loss": result.val_loss}), flush=True)
    return folder


def finetune(preset: str, method: str, seed: int, base: Path, args: argparse.Namespace, folder: Path) -> dict:
    from tensorslim.train.config import TrainConfig
    from tensorslim.train.trainer import Trainer

    config = TrainConfig(
        preset=preset,
        task="classify",
        method="dense" if method == "scratch" else method,
        data="bbcnews-titles",
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        seed=seed,
        eval_every=args.steps,
        checkpoint_every=10**9,
        init_base=None if method == "scratch" else str(base),
        out_dir=str(folder),
        progress=False,
        tensorboard=False,
    )
    trainer = Trainer(config)
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    result = trainer.run()
    return {
        "method": method,
        "seed": seed,
        "lr": config.peak_lr(),
        "test_accuracy": result.val_metrics["val_accuracy"],
        "trainable": trainable,
    }


def table(rows: list[dict]) -> list[str]:
    lines = ["| method | test accuracy (%) | seeds | trainable | lr |", "|---|---|---|---|---|"]
    for method in METHODS:
        mine = [r for r in rows if r["method"] == method]
        if not mine:
            continue
        accuracy = [100 * r["test_accuracy"] for r in mine]
        spread = statistics.stdev(accuracy) if len(accuracy) > 1 else 0.0
        lines.append(
            f"| {method} | {statistics.mean(accuracy):.1f} ± {spread:.1f} | {len(mine)} | {mine[0]['trainable']:,} | "
            f"{mine[0]['lr']:g} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="bert-small")
    parser.add_argument("--mlm-steps", type=int, default=2000)
    parser.add_argument("--base", help="a dense MLM run folder to start from (default: made under --work)")
    parser.add_argument("--work", default="runs/adapters_our_bert", help="folder of the runs")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=32, help="tokens per title (with the prompt: fits 128)")
    parser.add_argument("--out", required=True, help="output stem: .jsonl, .md")
    args = parser.parse_args()
    work = Path(args.work)
    base = Path(args.base) if args.base else pretrain(args.preset, args.mlm_steps, work / "mlm")
    out = Path(args.out)
    path = out.with_suffix(".jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    done = {(r["method"], r["seed"]) for r in rows}
    for seed in range(args.seeds):
        for method in args.methods.split(","):
            if (method, seed) in done:
                continue
            row = finetune(args.preset, method, seed, base, args, work / f"{method}-{seed}")
            rows.append(row)
            with path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    out.with_suffix(".md").write_text("\n".join(table(rows)) + "\n")
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
