"""Should our adapter methods train BERT's pooler with the classifier head? A choice made on the development set.

Full fine-tuning trains the pooler (``Linear(d, d) → tanh`` on ``[CLS]``); our adapter methods, like the official
UniPELT code (Mao et al., arXiv 2110.07577) and peft, kept it frozen. MiniLM's checkpoint (sentence-transformers'
all-MiniLM-L6-v2) was trained with mean pooling, so its pooler never served its training objective.
``adapters_protocol.py --train-pooler`` reruns the K = 100 grids with the pooler trained; this script compares the two
variants of each method (:func:`adapters_protocol.variant`: the default row and ``(pooler trained)``) on the
development accuracy of the best-on-dev rate per seed, with the test accuracy beside it (not used for the choice). It
also gives each method's per-seed test difference from full fine-tuning (``dense``), paired on the seed (same subsets),
and the two-sided sign-flip p-value of its mean: with 5 seeds the smallest possible value is 2/32. ``--below`` adds the
pooler-trained variant on its grid moved one step down (the runs of ``adapters_protocol.py --train-pooler --rates
below``); several
``--runs`` files pool their runs (extra seeds kept out of the table's file).

    python experiments/adapters_pooler.py --runs experiments/results/adapters_bbc_titles.jsonl \\
        experiments/results/adapters_seeds.jsonl --below experiments/results/adapters_pooler_below.jsonl \\
        --out experiments/results/adapters_pooler

Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from adapters_protocol import LR_GRIDS, best_runs, variant

from tensorslim.methods.adapters import MODULES

TRAINED = " (pooler trained)"


def compare(records: list[dict[str, Any]], *, k: int = 100) -> dict[str, dict[str, Any]]:
    """Per adapter method and pooler variant with complete grids: per-seed best-on-dev dev and test accuracy (%),
    the chosen rates and the seeds shared by both variants."""
    best = best_runs(records)
    out: dict[str, dict[str, Any]] = {}
    for method in MODULES:
        names = [method, method + TRAINED]
        seeds = {name: {s: r for (v, kk, s), r in best.items() if v == name and kk == k} for name in names}
        present = [name for name in names if seeds[name]]
        if len(present) < 2:
            continue
        shared = sorted(set.intersection(*(set(seeds[name]) for name in present)))
        out[method] = {
            name: {
                "seeds": shared,
                "dev": [100 * seeds[name][s]["_dev"] for s in shared],
                "test": [100 * seeds[name][s]["test_accuracy"] for s in shared],
                "lr": [seeds[name][s]["lr"] for s in shared],
            }
            for name in present
        }
    return out


SHIFTED = " (pooler trained, grid one step down)"


def shifted(records: list[dict[str, Any]], below: list[dict[str, Any]], *, k: int = 100) -> dict[str, Any]:
    """The pooler-trained variant of each method on its grid moved one step down (the same size): the run at the
    rate below the grid (``adapters_protocol.py --rates below``, in ``below``) and at the grid's two lowest rates;
    per seed the best on dev (a tie keeps the lower rate). Returns ``{method: {name: per-seed lists}}`` as
    :func:`compare`, and the picked runs under ``"_runs"``."""
    out: dict[str, Any] = {}
    for method in MODULES:
        name = method + TRAINED
        picks = {}
        for seed in sorted({r["seed"] for r in below if variant(r) == name and r["k"] == k}):
            mine = [r for r in [*below, *records] if variant(r) == name and r["k"] == k and r["seed"] == seed]
            runs = sorted((r for r in mine if r["lr"] < LR_GRIDS[method][2]), key=lambda r: r["lr"])
            if len(runs) == 3:
                picks[seed] = max(runs, key=lambda r: (r["dev_accuracy"], -r["lr"]))
        if picks:
            out[method] = {
                method + SHIFTED: {
                    "seeds": sorted(picks),
                    "dev": [100 * r["dev_accuracy"] for r in picks.values()],
                    "test": [100 * r["test_accuracy"] for r in picks.values()],
                    "lr": [r["lr"] for r in picks.values()],
                    "_runs": picks,
                }
            }
    return out


def paired(
    records: list[dict[str, Any]], name: str, *, k: int = 100, against: str = "dense", mine: dict | None = None
) -> dict[str, Any]:
    """Per-seed test difference (points) of the variant ``name`` (or the per-seed runs ``mine``) minus ``against``,
    its mean, std and the exact two-sided sign-flip p-value of the mean (all 2^n sign patterns)."""
    best = best_runs(records)
    if mine is None:
        mine = {s: r for (v, kk, s), r in best.items() if v == name and kk == k}
    theirs = {s: r for (v, kk, s), r in best.items() if v == against and kk == k}
    diffs = [100 * (mine[s]["test_accuracy"] - theirs[s]["test_accuracy"]) for s in sorted(set(mine) & set(theirs))]
    total = abs(sum(diffs))
    flips = [
        abs(sum(d * sign for d, sign in zip(diffs, signs, strict=True)))
        for signs in itertools.product((1, -1), repeat=len(diffs))
    ]
    return {
        "diffs": diffs,
        "mean": statistics.fmean(diffs),
        "std": statistics.stdev(diffs) if len(diffs) > 1 else 0.0,
        "p_signflip": sum(f >= total - 1e-9 for f in flips) / len(flips),
    }


def _mean_std(values: list[float]) -> str:
    return f"{statistics.fmean(values):.1f} ± {statistics.stdev(values) if len(values) > 1 else 0.0:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", default=["experiments/results/adapters_bbc_titles.jsonl"])
    parser.add_argument(
        "--below", default=None, help="runs of adapters_protocol.py --train-pooler --rates below (.jsonl)"
    )
    parser.add_argument("--out", default="experiments/results/adapters_pooler")
    args = parser.parse_args(argv)
    records = [json.loads(line) for path in args.runs for line in Path(path).read_text().splitlines()]
    table = compare(records)
    if args.below:
        below = [json.loads(line) for line in Path(args.below).read_text().splitlines()]
        for method, rows in shifted(records, below).items():
            table.setdefault(method, {}).update(rows)
    lines = [
        "| method | variant | seeds | mean best dev | dev per seed | test (not used) | rates chosen |",
        "|---|---|---|---|---|---|---|",
    ]
    for method, variants in table.items():
        for name, v in variants.items():
            per_seed = " ".join(f"{d:.0f}" for d in v["dev"])
            rates = " ".join(f"{lr:g}" for lr in v["lr"])
            row = f"| {method} | {name} | {len(v['seeds'])} | {statistics.fmean(v['dev']):.1f} | {per_seed} | "
            lines.append(row + f"{_mean_std(v['test'])} | {rates} |")
    means = {
        tail: statistics.fmean(statistics.fmean(v[m + tail]["dev"]) for m, v in table.items() if m + tail in v)
        for tail in ("", TRAINED, SHIFTED)
        if any(m + tail in v for m, v in table.items())
    }
    lines += ["", "Mean over methods of the mean best development accuracy: "]
    lines[-1] += ", ".join(f"{'default' if not tail else tail.strip(' ()')} {m:.2f}" for tail, m in means.items())
    pairs = {name: paired(records, name, mine=v[name].pop("_runs", None)) for v in table.values() for name in v}
    lines += ["", "| variant | test − dense per seed (points) | mean ± std | sign-flip p |", "|---|---|---|---|"]
    for name, p in pairs.items():
        diffs = " ".join(f"{d:+.1f}" for d in p["diffs"])
        lines.append(f"| {name} | {diffs} | {p['mean']:+.2f} ± {p['std']:.2f} | {p['p_signflip']:.3f} |")
    command = "python experiments/adapters_pooler.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text = f"```\n{command}\n```\n\n" + "\n".join(lines) + "\n"
    out = Path(args.out)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps({"compare": table, "paired": pairs, "command": command}, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
