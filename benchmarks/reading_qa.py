"""Random-access reading (arXiv 2405.13216) on synthetic long-document QA: accuracy vs fraction of tokens read.

One small QA model (gpt2-tiny, trained by the ``longqa`` task through the Trainer, cached) reads the validation
documents of :mod:`tensorslim.data.longqa` with three readers, the question in front of every window:

- ``sequential``: every window (the full-reading reference);
- ``random-access`` at several ``α`` (and both poolings): skip ``K·min(⌊(|X|−S−L)/K⌋, ⌊α/C⌋)`` after each window;
- ``random-skip``: for each random-access run, skips drawn at random from that run's own skip lengths (same
  distribution, same rounding and end stop), over several seeds.

Every reader answers from its windows with one model call per window; the model rows counted by a forward hook are
checked against the windows read (no extra call decides a skip).

    .venv/bin/python benchmarks/reading_qa.py

Writes ``reading_qa.{md,json,png}`` under ``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from tensorslim.data.cache import cache_dir
from tensorslim.reading import ReaderConfig
from tensorslim.tasks.reading import read_and_answer
from tensorslim.train.config import TrainConfig
from tensorslim.train.trainer import Trainer

COMMAND = "python " + " ".join(sys.argv)


def train_config(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(
        preset="gpt2-tiny",
        task="longqa",
        method="dense",
        steps=args.steps,
        batch_size=32,
        seq_len=args.window,
        lr=3e-3,
        eval_every=args.steps,
        eval_blocks=args.docs,
        checkpoint_every=args.steps,
        progress=False,
        tensorboard=False,
        out_dir=str(cache_dir("runs", "reading_qa")),
        task_options={
            "reader": args.train_reader,
            "skip_k": args.k,
            "skip_alpha": args.train_alpha,
            "distractors": args.distractors,
            "doc_tokens": args.doc_tokens,
            "passage_tokens": args.passage_tokens,
            "fact_lead": args.fact_lead,
            "answer_weight": 5.0,
        },
    )


def trained(config: TrainConfig) -> tuple[Trainer, dict]:
    """The trained run: from the cache when this exact config was trained before, else trained now."""
    key = hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:16]
    weights = cache_dir("models") / f"reading_qa-{key}.pt"
    trainer = Trainer(replace(config, out_dir=str(cache_dir("runs", f"reading_qa-{key}"))))
    if weights.exists():
        saved = torch.load(weights)
        trainer.model.load_state_dict(saved["model"])
        return trainer, saved["train"]
    start = time.perf_counter()
    result = trainer.run()
    info = {"train_s": time.perf_counter() - start, "val_metrics": result.val_metrics, "final_loss": result.losses[-1]}
    torch.save({"model": trainer.model.state_dict(), "train": info}, weights)
    return trainer, info


def evaluate(trainer: Trainer, config: ReaderConfig, *, window: int, seed: int = 0) -> tuple[dict, list[int]]:
    qa = trainer.data.validation
    trainer.model.eval()
    found = read_and_answer(trainer.model, qa, qa.validation, config, window=window, lanes=32, seed=seed)
    assert found.model_rows == found.windows, (found.model_rows, found.windows)  # no extra model call
    summary = found.log.summary()
    row = {
        "reader": config.reader,
        "alpha": config.skip_alpha,
        "pooling": config.pooling,
        "seed": seed,
        "accuracy": found.accuracy,
        "read_fraction": summary["read_fraction"],
        "mean_skip": summary["mean_skip"],
        "windows": found.windows,
        "model_rows": found.model_rows,
        "extra_model_rows": found.model_rows - found.windows,
        "facts_read": sum(
            any(s <= d.fact[0] and d.fact[1] <= s + window for s in r.starts)
            for r in found.log.records
            for d in [qa.validation[r.doc]]
        )
        / len(qa.validation),
    }
    return row, found.log.skip_lengths()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--docs", type=int, default=100, help="validation documents")
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--distractors", type=int, default=0)
    parser.add_argument("--doc-tokens", type=int, default=512)
    parser.add_argument("--passage-tokens", type=int, default=128)
    parser.add_argument("--fact-lead", type=int, default=48)
    parser.add_argument("--train-reader", default="sequential")
    parser.add_argument("--train-alpha", type=float, default=4.0)
    parser.add_argument("--alphas", default="2,4,8")
    parser.add_argument("--poolings", default="mean,last", help="comma-separated: mean, last")
    parser.add_argument("--seeds", type=int, default=2, help="random-skip seeds per random-access run")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    torch.manual_seed(0)
    config = train_config(args)
    trainer, info = trained(config)
    rows = [evaluate(trainer, ReaderConfig(reader="sequential", skip_k=args.k), window=args.window)[0]]
    for pooling in args.poolings.split(","):
        for alpha in [float(a) for a in args.alphas.split(",")]:
            access = ReaderConfig(reader="random-access", skip_k=args.k, skip_alpha=alpha, pooling=pooling)
            row, lengths = evaluate(trainer, access, window=args.window)
            rows.append(row)
            drawn = ReaderConfig(reader="random-skip", skip_k=args.k, skip_lengths=",".join(map(str, lengths)))
            for seed in range(args.seeds):
                rows.append(
                    {**evaluate(trainer, drawn, window=args.window, seed=seed)[0], "alpha": alpha, "pooling": pooling}
                )
            print(rows[-args.seeds - 1], flush=True)
    write(Path(args.out), rows, info, args, config)


def _mean_std(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{values[0]:.3f}"


def write(out: Path, rows: list[dict], info: dict, args: argparse.Namespace, config: TrainConfig) -> None:
    out.mkdir(parents=True, exist_ok=True)
    full = rows[0]["accuracy"]
    lines = [
        "# Random-access reading on synthetic long-document QA (gpt2-tiny, CPU)",
        "",
        f"Command: `{COMMAND}` (machine: {platform.processor() or platform.machine()}, shared, 2 cores; accuracies "
        "are deterministic; the one time, training, is of that shared, loaded machine).",
        "",
        f"Model: gpt2-tiny trained {args.steps} steps by `tensorslim train --task longqa` (reader during training: "
        f"{args.train_reader}; {info['train_s']:.0f} s the first time, then cached). Validation: {args.docs} "
        f"documents of {config.task_options.doc_tokens} tokens, window L = {args.window}, K = {args.k}, "
        f"{args.distractors} distractor facts; 8 answers (chance 0.125).",
        "",
        f"Full sequential reading: accuracy **{full:.3f}** (reads every token; {rows[0]['windows']} windows).",
        "",
        "| pooling | α | random access: accuracy | read | mean skip | fact read | accuracy / full "
        "| random skip (same skip lengths): accuracy | read | fact read | gap (points) | extra model rows |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    summary = []
    for i, row in enumerate(rows):
        if row["reader"] != "random-access":
            continue
        skips = [r for r in rows[i + 1 : i + 1 + args.seeds] if r["reader"] == "random-skip"]
        rs_acc = [r["accuracy"] for r in skips]
        gap = 100 * (row["accuracy"] - statistics.mean(rs_acc))
        summary.append({**row, "random_skip_accuracy": statistics.mean(rs_acc), "gap_points": gap})
        lines.append(
            f"| {row['pooling']} | {row['alpha']:g} | {row['accuracy']:.3f} | {row['read_fraction']:.3f} | "
            f"{row['mean_skip']:.1f} | {row['facts_read']:.3f} | {row['accuracy'] / full:.3f} | {_mean_std(rs_acc)} | "
            f"{_mean_std([r['read_fraction'] for r in skips])} | {_mean_std([r['facts_read'] for r in skips])} | "
            f"{gap:+.1f} | {row['extra_model_rows']} |"
        )
    lines += [
        "",
        '"read": fraction of the documents\' tokens inside a window read; "fact read": share of documents whose '
        'answering fact was inside a window read; "extra model rows": rows the model processed beyond one per '
        f"window read (counted by a forward hook). Random skip: mean ± std over {args.seeds} seeds.",
    ]
    (out / "reading_qa.md").write_text("\n".join(lines) + "\n")
    (out / "reading_qa.json").write_text(
        json.dumps({"command": COMMAND, "train": info, "config": config.to_dict(), "rows": rows}, indent=1, default=str)
        + "\n"
    )
    plot(out / "reading_qa.png", rows, full)


def plot(path: Path, rows: list[dict], full: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for reader, marker, pooling in (
        ("random-access", "o", "mean"),
        ("random-access", "s", "last"),
        ("random-skip", "x", "mean"),
        ("random-skip", "+", "last"),
    ):
        chosen = [r for r in rows if r["reader"] == reader and r["pooling"] == pooling]
        ax.scatter(
            [r["read_fraction"] for r in chosen],
            [r["accuracy"] for r in chosen],
            marker=marker,
            label=f"{reader} ({pooling})",
        )
    ax.scatter([1.0], [full], marker="*", s=120, color="k", label="sequential (full)")
    ax.axhline(0.9 * full, color="grey", linestyle="--", linewidth=0.8, label="90% of full")
    ax.axvline(0.5, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("fraction of tokens read")
    ax.set_ylabel("QA accuracy")
    ax.set_title("Random-access reading vs random skip (gpt2-tiny, synthetic long-doc QA)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
