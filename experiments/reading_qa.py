"""Random-access reading (arXiv 2405.13216) on synthetic long-document QA: accuracy vs fraction of tokens read.

One small QA model (gpt2-tiny, trained by the ``longqa`` task through the Trainer with the random-access reader as
its data source, cached) reads held-out documents of :mod:`tensorslim.data.longctx.qa`, the question in front of every
window, with four readers:

- ``sequential``: every window (the full-reading reference);
- ``random-access`` at several ``α`` and both poolings: skip ``K·min(⌊(|X|−S−L)/K⌋, ⌊α/C⌋)`` after each window;
- ``random-skip``: for each random-access run, skips drawn at random from that run's own skip lengths (same
  distribution, same rounding and end stop), over several seeds;
- ``sequential-truncated``: every window of the document's first tokens, as many tokens as the random-access run
  read (rounded to whole ``K`` blocks).

``α`` is chosen on the development documents (the most accurate that reads at most ``--budget`` of the tokens, per
pooling) and only then are the validation documents read. Every reader answers from its windows with one model
call per window; the model rows counted by a forward hook are checked against the windows read (no extra call
decides a skip). A diagnostic pass (not a reader) reports the pooled loss of sequential windows by what they hold.

    .venv/bin/python experiments/reading_qa.py

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
import torch.nn.functional as F

from tensorslim.data.cache import cache_dir
from tensorslim.data.longctx import ReaderConfig, Span, pool_losses
from tensorslim.tasks.base import logits_of
from tensorslim.tasks.longctx.reading import QAFormat, build_qa_set, read_and_answer
from tensorslim.train.config import TrainConfig
from tensorslim.train.trainer import Trainer

COMMAND = "python " + " ".join(sys.argv)
SET_VALIDATION, SET_DEV = 100, 50  # documents the QA set holds; a run reads the first --docs / --dev-docs of them


def train_config(args: argparse.Namespace, *, stage: int) -> TrainConfig:
    """Stage 1 (``--init-steps``): QA on short documents (512 tokens, two 128-token passages, fact >= 48 tokens in),
    read sequentially, where answer windows are frequent enough for a 2-layer model to learn to copy the answer.
    Stage 2 (``--steps``): the benchmark's long documents, read by ``--train-reader`` (the data server)."""
    first = stage == 1
    return TrainConfig(
        preset="gpt2-tiny",
        task="longqa",
        method="dense",
        steps=args.init_steps if first else args.steps,
        batch_size=32,
        seq_len=args.window,
        lr=3e-3,
        eval_every=args.init_steps if first else args.steps,
        eval_blocks=SET_VALIDATION,
        checkpoint_every=args.init_steps if first else args.steps,
        progress=False,
        tensorboard=False,
        out_dir=str(cache_dir("runs", "reading_qa")),
        task_options={
            "reader": "sequential" if first else args.train_reader,
            "skip_k": args.k,
            "skip_alpha": 4.0 if first else args.train_alpha,
            "pooling": "mean",
            "dev_docs": 0 if first else SET_DEV,
            "distractors": args.distractors,
            "doc_tokens": 512 if first else args.doc_tokens,
            "passage_tokens": 128 if first else args.passage_tokens,
            "fact_lead": 48 if first else args.fact_lead,
            "answer_weight": 5.0,
        },
    )


def trained(config: TrainConfig, *, init: tuple[str, dict] | None = None) -> tuple[Trainer, dict, str]:
    """The trained run (from the cache when this exact config, from this exact start, was trained before, else
    trained now by the Trainer) and its cache key. ``init``: the key and weights of the run it starts from."""
    described = json.dumps({**config.to_dict(), **({"init": init[0]} if init else {})}, sort_keys=True, default=str)
    key = hashlib.sha256(described.encode()).hexdigest()[:16]
    weights = cache_dir("models") / f"reading_qa-{key}.pt"
    trainer = Trainer(replace(config, out_dir=str(cache_dir("runs", f"reading_qa-{key}"))))
    if weights.exists():
        saved = torch.load(weights)
        trainer.model.load_state_dict(saved["model"])
        return trainer, saved["train"], key
    if init is not None:
        trainer.model.load_state_dict(init[1])  # in place: the Trainer's optimizer holds these same parameters
    start = time.perf_counter()
    result = trainer.run()
    info = {"train_s": time.perf_counter() - start, "val_metrics": result.val_metrics, "final_loss": result.losses[-1]}
    torch.save({"model": trainer.model.state_dict(), "train": info}, weights)
    return trainer, info, key


def evaluate(trainer: Trainer, docs: list, config: ReaderConfig, *, window: int, seed: int = 0) -> tuple[dict, list]:
    """Read ``docs`` with ``config``; the row of results and the skip lengths the reader took."""
    qa = trainer.data.validation
    trainer.model.eval()
    found = read_and_answer(trainer.model, qa, docs, config, window=window, lanes=32, seed=seed)
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
            any(s <= docs[r.doc].fact[0] and docs[r.doc].fact[1] <= s + window for s in r.starts)
            for r in found.log.records
        )
        / len(docs),
    }
    return row, found.log.skip_lengths()


def truncated(trainer: Trainer, docs: list, fraction: float, *, window: int, k: int) -> dict:
    """Sequential reading of each document's first ``fraction`` of tokens (whole ``K`` blocks)."""
    heads = [replace(d, tokens=d.tokens[: max(k, k * round(fraction * len(d.tokens) / k))]) for d in docs]
    row, _ = evaluate(trainer, heads, ReaderConfig(reader="sequential", skip_k=k), window=window)
    row["reader"] = "sequential-truncated"
    row["read_fraction"] = sum(len(h.tokens) for h in heads) / sum(len(d.tokens) for d in docs)
    return row


def window_losses(trainer: Trainer, docs: list, *, window: int) -> dict[str, dict[str, float]]:
    """Diagnostic: the pooled loss ``C`` (mean and last) of sequential windows, by what the window holds."""
    qa = trainer.data.validation
    fmt = QAFormat(qa, window)
    kinds: dict[str, list[tuple[float, float]]] = {"filler": [], "passage": [], "filler+passage": [], "fact": []}
    for index, doc in enumerate(docs):
        spans = [Span(0, index, s, min(s + window, len(doc.tokens))) for s in range(0, len(doc.tokens), window)]
        ids, mask = fmt.batch(docs, spans)
        with torch.no_grad():
            logits = logits_of(trainer.model(ids[:, :-1])).float()
        losses = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")  # (windows, T-1)
        mean = pool_losses(losses, mask, pooling="mean").tolist()
        last = pool_losses(losses, mask, pooling="last").tolist()
        for span, m, la in zip(spans, mean, last, strict=True):
            inside = sum(max(0, min(e, span.end) - max(b, span.start)) for b, e in doc.passages)
            if span.start <= doc.fact[0] and doc.fact[1] <= span.end:
                kind = "fact"
            else:
                kind = "filler" if inside == 0 else "passage" if inside == span.end - span.start else "filler+passage"
            kinds[kind].append((m, la))
    return {
        kind: {
            "windows": len(values),
            "mean": statistics.mean(v[0] for v in values),
            "mean_std": statistics.pstdev(v[0] for v in values),
            "last": statistics.mean(v[1] for v in values),
            "last_std": statistics.pstdev(v[1] for v in values),
        }
        for kind, values in kinds.items()
        if values
    }


def choose(rows: list[dict], budget: float) -> dict:
    """The most accurate row that reads at most ``budget`` of the tokens (ties: the one that reads less)."""
    within = [r for r in rows if r["read_fraction"] <= budget] or [min(rows, key=lambda r: r["read_fraction"])]
    return max(within, key=lambda r: (r["accuracy"], -r["read_fraction"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--init-steps", type=int, default=300, help="stage 1: QA steps on short documents (0: none)")
    parser.add_argument("--steps", type=int, default=150, help="stage 2: QA steps on the long documents")
    parser.add_argument("--docs", type=int, default=60, help=f"validation documents read (<= {SET_VALIDATION})")
    parser.add_argument("--dev-docs", type=int, default=40, help=f"development documents, alpha chosen (<= {SET_DEV})")
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--distractors", type=int, default=0)
    parser.add_argument("--doc-tokens", type=int, default=2048)
    parser.add_argument("--passage-tokens", type=int, default=256)
    parser.add_argument("--fact-lead", type=int, default=128)
    parser.add_argument("--train-reader", default="random-access")
    parser.add_argument("--train-alpha", type=float, default=3.0)
    parser.add_argument("--alphas", default="2,2.5,3,3.5,4,6", help="the alpha grid tried on the development documents")
    parser.add_argument("--test-alphas", default="2,4,6", help="more alphas read on validation (best pooling)")
    parser.add_argument("--poolings", default="mean,last", help="comma-separated: mean, last")
    parser.add_argument("--budget", type=float, default=0.5, help="alpha is chosen among dev runs reading <= this")
    parser.add_argument("--lead-check", type=int, default=48, help="also read documents of this fact lead (0: no)")
    parser.add_argument("--seeds", type=int, default=2, help="random-skip seeds per random-access run")
    parser.add_argument("--out", default="experiments/results")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    init = None
    if args.init_steps:
        first, first_info, first_key = trained(train_config(args, stage=1))
        init = (first_key, first.model.state_dict())
        del first
    config = train_config(args, stage=2)
    trainer, info, _ = trained(config, init=init)
    info = {**info, "stage1": first_info if init else None}
    qa, window, k = trainer.data.validation, args.window, args.k
    dev_docs, test_docs = qa.dev[: args.dev_docs], qa.validation[: args.docs]
    sequential = ReaderConfig(reader="sequential", skip_k=k)
    losses = window_losses(trainer, dev_docs[:10], window=window)
    print(json.dumps(losses), flush=True)
    dev = [{**evaluate(trainer, dev_docs, sequential, window=window)[0], "split": "dev"}]
    chosen = {}
    for pooling in args.poolings.split(","):
        runs = []
        for alpha in [float(a) for a in args.alphas.split(",")]:
            access = ReaderConfig(reader="random-access", skip_k=k, skip_alpha=alpha, pooling=pooling)
            runs.append({**evaluate(trainer, dev_docs, access, window=window)[0], "split": "dev"})
            print(runs[-1], flush=True)
        dev += runs
        chosen[pooling] = choose(runs, args.budget)
    # Validation: each pooling's chosen alpha, and more alphas of the pooling that did best on dev (the curve).
    best = max(chosen.values(), key=lambda r: (r["accuracy"], -r["read_fraction"]))["pooling"]
    points = [(pooling, row["alpha"]) for pooling, row in chosen.items()]
    points += [(best, float(a)) for a in args.test_alphas.split(",") if (best, float(a)) not in points]
    rows = [{**evaluate(trainer, test_docs, sequential, window=window)[0], "split": "validation"}]
    for pooling, alpha in points:
        access = ReaderConfig(reader="random-access", skip_k=k, skip_alpha=alpha, pooling=pooling)
        row, lengths = evaluate(trainer, test_docs, access, window=window)
        rows.append({**row, "split": "validation", "chosen_on_dev": alpha == chosen[pooling]["alpha"]})
        drawn = ReaderConfig(reader="random-skip", skip_k=k, skip_lengths=",".join(map(str, lengths)))
        for seed in range(args.seeds):
            skip = evaluate(trainer, test_docs, drawn, window=window, seed=seed)[0]
            rows.append({**skip, "alpha": alpha, "pooling": pooling, "split": "validation"})
        head = truncated(trainer, test_docs, row["read_fraction"], window=window, k=k)
        rows.append({**head, "alpha": alpha, "pooling": pooling, "split": "validation"})
        print(rows[-args.seeds - 2 :], flush=True)
    # The same model and chosen alpha on documents whose facts may sit closer to their passage's start.
    near = []
    if args.lead_check:
        options = replace(config.task_options, fact_lead=args.lead_check, dev_docs=0)
        other = build_qa_set(config, options, model_name=config.preset, validation_docs=args.docs).validation
        access = ReaderConfig(reader="random-access", skip_k=k, skip_alpha=chosen[best]["alpha"], pooling=best)
        row, lengths = evaluate(trainer, other, access, window=window)
        near = [{**evaluate(trainer, other, sequential, window=window)[0], "fact_lead": args.lead_check}, row]
        drawn = ReaderConfig(reader="random-skip", skip_k=k, skip_lengths=",".join(map(str, lengths)))
        near += [evaluate(trainer, other, drawn, window=window, seed=seed)[0] for seed in range(args.seeds)]
        near.append(truncated(trainer, other, row["read_fraction"], window=window, k=k))
        print(near, flush=True)
    chosen = {pooling: row["alpha"] for pooling, row in chosen.items()}
    write(Path(args.out), rows, dev, chosen, losses, info, args, config, near)


def _reader_name(row: dict) -> str:
    return f"{row['reader']} (seed {row['seed']})" if row["reader"] == "random-skip" else row["reader"]


def _ratio(value: float, full: float) -> str:
    return f"{value / full:.3f}" if full else "—"


def _mean_std(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{values[0]:.3f}"


def write(
    out: Path,
    rows: list[dict],
    dev: list[dict],
    chosen: dict[str, float],
    losses: dict,
    info: dict,
    args: argparse.Namespace,
    config: TrainConfig,
    near: list[dict],
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    full, dev_full = rows[0]["accuracy"], dev[0]["accuracy"]
    options = config.task_options
    lines = [
        "# Random-access reading on synthetic long-document QA (gpt2-tiny, CPU)",
        "",
        f"Command: `{COMMAND}` (machine: {platform.processor() or platform.machine()}, shared by several jobs, "
        "2 cores; accuracies are deterministic; the one time, training, is of that shared, loaded machine).",
        "",
        "Model: gpt2-tiny trained by the `longqa` task through the Trainer: "
        + (
            f"{args.init_steps} steps of sequential reading on 512-token documents (two 128-token passages, fact "
            f"at least 48 tokens in; {info['stage1']['train_s']:.0f} s), then "
            if info.get("stage1")
            else ""
        )
        + f"{args.steps} steps on the documents below with the {args.train_reader} reader as its data source "
        f"(α = {args.train_alpha:g}, mean pooling; {info['train_s']:.0f} s; both cached). Documents of "
        f"{options.doc_tokens} tokens, "
        f"two BBC passages of {options.passage_tokens} tokens each (one holds the fact, at least "
        f"{options.fact_lead} tokens in), window L = {args.window}, K = {args.k}, {args.distractors} distractor "
        f"facts; 8 answers (chance 0.125). α chosen on {args.dev_docs} development documents, then "
        f"{args.docs} validation documents read.",
        "",
        "## Pooled loss C of sequential windows, by what they hold (development documents)",
        "",
        "| window holds | windows | C, mean pooling | C, last pooling |",
        "|---|---|---|---|",
        *(
            f"| {kind} | {v['windows']} | {v['mean']:.2f} ± {v['mean_std']:.2f} | "
            f"{v['last']:.2f} ± {v['last_std']:.2f} |"
            for kind, v in losses.items()
        ),
        "",
        f"## α chosen on the development documents (full reading: {dev_full:.3f}; budget: read ≤ {args.budget:g})",
        "",
        "| pooling | α | read | accuracy | accuracy / full | fact read | chosen |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {r['pooling']} | {r['alpha']:g} | {r['read_fraction']:.3f} | {r['accuracy']:.3f} | "
            f"{_ratio(r['accuracy'], dev_full)} | {r['facts_read']:.3f} | "
            f"{'**yes**' if chosen[r['pooling']] == r['alpha'] else ''} |"
            for r in dev[1:]
        ),
        "",
        f"## Validation documents: full sequential reading **{full:.3f}** ({rows[0]['windows']} windows)",
        "",
        "| pooling | α | read | random access: accuracy | / full | fact read | random skip (same skip lengths) "
        "| gap (points) | sequential-truncated (same read) | extra model rows |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    summary = []
    for i, row in enumerate(rows):
        if row["reader"] != "random-access":
            continue
        skips = rows[i + 1 : i + 1 + args.seeds]
        head = rows[i + 1 + args.seeds]
        rs_acc = [r["accuracy"] for r in skips]
        gap = 100 * (row["accuracy"] - statistics.mean(rs_acc))
        summary.append({**row, "random_skip_accuracy": statistics.mean(rs_acc), "gap_points": gap})
        mark = " (chosen on dev)" if row["chosen_on_dev"] else ""
        lines.append(
            f"| {row['pooling']} | {row['alpha']:g}{mark} | {row['read_fraction']:.3f} | {row['accuracy']:.3f} | "
            f"{_ratio(row['accuracy'], full)} | {row['facts_read']:.3f} | {_mean_std(rs_acc)} (read "
            f"{_mean_std([r['read_fraction'] for r in skips])}, "
            f"fact read {_mean_std([r['facts_read'] for r in skips])})"
            f" | {gap:+.1f} | {head['accuracy']:.3f} (read {head['read_fraction']:.3f}) | {row['extra_model_rows']} |"
        )
    lines += [
        "",
        '"read": fraction of the documents\' tokens inside a window read; "fact read": share of documents whose '
        'answering fact was inside a window read; "extra model rows": rows the model processed beyond one per '
        f"window read (counted by a forward hook). Random skip: mean ± std over {args.seeds} seeds.",
    ]
    if near:
        lines += [
            "",
            f"## Facts nearer their passage's start: {args.docs} validation documents with facts at least "
            f"{args.lead_check} tokens into their passage (not {options.fact_lead}); same model, α = "
            f"{near[1]['alpha']:g} ({near[1]['pooling']})",
            "",
            "| reader | read | accuracy | fact read |",
            "|---|---|---|---|",
            *(
                f"| {_reader_name(r)} | {r['read_fraction']:.3f} | {r['accuracy']:.3f} | {r['facts_read']:.3f} |"
                for r in near
            ),
        ]
    (out / "reading_qa.md").write_text("\n".join(lines) + "\n")
    payload = {
        "command": COMMAND,
        "train": info,
        "config": config.to_dict(),
        "chosen_alpha": chosen,
        "window_losses": losses,
        "dev_rows": dev,
        "rows": rows,
        "summary": summary,
        "lead_check_rows": near,
    }
    (out / "reading_qa.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    plot(out / "reading_qa.png", rows, full)


def plot(path: Path, rows: list[dict], full: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for pooling, color in (("mean", "C0"), ("last", "C1")):
        for reader, marker, style in (
            ("random-access", "o", "-"),
            ("random-skip", "x", ":"),
            ("sequential-truncated", "s", "--"),
        ):
            chosen = [r for r in rows if r["reader"] == reader and r["pooling"] == pooling]
            if not chosen:
                continue
            points: dict[float, list[dict]] = {}
            for r in chosen:
                points.setdefault(r["alpha"], []).append(r)
            xs = [statistics.mean(r["read_fraction"] for r in group) for group in points.values()]
            ys = [statistics.mean(r["accuracy"] for r in group) for group in points.values()]
            order = sorted(range(len(xs)), key=xs.__getitem__)
            ax.plot(
                [xs[i] for i in order],
                [ys[i] for i in order],
                marker=marker,
                linestyle=style,
                color=color,
                label=f"{reader} ({pooling} α grid)",
            )
        best = [r for r in rows if r["reader"] == "random-access" and r["pooling"] == pooling and r["chosen_on_dev"]]
        ax.scatter(
            [r["read_fraction"] for r in best], [r["accuracy"] for r in best], s=160, facecolors="none", edgecolors="k"
        )
    ax.scatter([1.0], [full], marker="*", s=140, color="k", label="sequential (full)", zorder=3)
    ax.axhline(0.9 * full, color="grey", linestyle="--", linewidth=0.8, label="90% of full")
    ax.axvline(0.5, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("fraction of tokens read")
    ax.set_ylabel("QA accuracy (validation documents)")
    ax.set_title("Random access vs random skip vs truncated reading (circled: α chosen on dev)", fontsize=9)
    ax.legend(fontsize=6.5)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
