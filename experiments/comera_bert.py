"""CoMERA's BERT experiments at small scale, on the public API only (``TrainConfig`` / ``train``).

CoMERA (Yang et al., NeurIPS 2024, arXiv 2405.14377, §5) trains a six-encoder transformer (our ``bert6``) from
scratch with rank-adaptive TT layers. This script reproduces the runs of ``docs/comera.md`` with the one trainer:

* ``mlm``: masked LM on the built-in code corpus (``stdlib``): ``dense``, ``galore`` and ``comera`` at each target
  ratio, same data order and masks.
* ``classify``: BBC News (5 topics, fixed split) from scratch: ``dense`` and ``comera`` at each target ratio.

Each run is one ``tensorslim train`` run in ``<out>/<part>-<run>/`` (its ``summary.json``, ``metrics.jsonl`` and, for
CoMERA, ``comera_ranks.json``); the table of all runs goes to ``<out>/results.md`` and ``<out>/results.json``.
CoMERA's learning rates follow its groups (cores : gates : rest = 1 : 10 : 0.5 of ``--lr``; dense and GaLore train at
``--dense-lr``, the rest group's rate) and, as upstream, stay
constant (no warm-up, no cosine decay, no weight decay, no clipping). ``L*`` of the late stage is the trainer's rule
(``--comera-target-loss``, else the mean task loss of the last tenth of the early stage); ``--target-loss dense``
passes the dense run's final training loss explicitly, as the documented runs did.

Usage::

    python experiments/comera_bert.py --parts mlm --preset bert6 --methods dense,comera --steps 400 \\
        --batch-size 8 --out runs/comera_bert6_mlm

Not imported by ``tensorslim``; it uses nothing but the package's public API.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from tensorslim.train.config import TrainConfig
from tensorslim.train.trainer import train

PARTS = {"mlm": ("mlm", "stdlib"), "classify": ("classify", "bbcnews")}
METHODS = ("dense", "galore", "comera")


def _run(args: argparse.Namespace, part: str, method: str, ratio: float | None, target_loss: float | None) -> dict:
    """One trainer run; returns its summary plus CoMERA's size report."""
    task, data = PARTS[part]
    name = method if ratio is None else f"comera-{ratio}"
    options = None
    if method == "comera":
        options = {"target_ratio": ratio, "late_fraction": args.late_fraction, "gamma": args.gamma}
        if target_loss is not None:
            options["target_loss"] = target_loss
    config = TrainConfig(
        preset=args.preset,
        task=task,
        method=method,
        options=options,
        data=data,
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        lr=args.lr if method == "comera" else args.dense_lr,
        warmup_fraction=0.0,
        min_lr_ratio=1.0,
        weight_decay=0.0,
        grad_clip=0.0,
        eval_every=args.steps,
        checkpoint_every=args.steps,
        out_dir=str(args.out / f"{part}-{name}"),
        device=args.device,
        seed=args.seed,
    )
    result = train(config)
    summary = json.loads((Path(config.run_dir) / "summary.json").read_text())
    row = {
        "run": name,
        "params": summary["params_total"],
        "dense_params": summary["dense_params_total"],
        "final_train_loss": statistics.mean(result.losses[-20:]),
        **{key: value for key, value in summary["val_metrics"].items()},
        "tokens_per_s": summary["tokens_per_s"],
    }
    ranks = Path(config.run_dir) / "comera_ranks.json"
    if ranks.exists():
        report = json.loads(ranks.read_text())
        late = report.get("after_late", report.get("after_early", {}))
        row.update(
            target_loss=report.get("target_loss"),
            size_start=report["start_size"],
            size_after_early=report["after_early"]["size"],
            target_size=report.get("target_size"),
            size_after_late=late.get("size"),
        )
        if report.get("target_size"):
            row["size_over_target"] = late["size"] / report["target_size"]
    return row


def run_part(args: argparse.Namespace, part: str) -> list[dict]:
    """The dense baseline first (its final loss may set ``L*``), then the other methods."""
    rows: list[dict] = []
    target_loss = args.comera_target_loss
    for method in sorted(args.methods, key=lambda m: m != "dense"):
        for ratio in args.ratios if method == "comera" else [None]:
            if method == "comera" and args.target_loss == "dense" and target_loss is None:
                dense = next((row for row in rows if row["run"] == "dense"), None)
                if dense is None:
                    raise SystemExit("--target-loss dense needs the dense run: add dense to --methods")
                target_loss = dense["final_train_loss"]
            rows.append(_run(args, part, method, ratio, target_loss))
    return rows


def render(results: dict[str, list[dict]], argv: list[str]) -> str:
    """A markdown table per part, headed by the command that produced it."""
    lines = ["# CoMERA BERT experiment", "", f"- command: `python experiments/comera_bert.py {' '.join(argv)}`", ""]
    for part, rows in results.items():
        keys = list(dict.fromkeys(key for row in rows for key in row))
        lines += [f"## {part}", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        for row in rows:
            cells = [f"{row[k]:.4g}" if isinstance(row.get(k), float) else str(row.get(k, "–")) for k in keys]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _list(text: str, *, allowed: tuple[str, ...] | None = None, kind: type = str) -> list:
    values = [kind(v) for v in text.split(",") if v]
    if allowed is not None and not set(values) <= set(allowed):
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: a comma-separated subset of {list(allowed)}")
    return values


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", type=lambda t: _list(t, allowed=tuple(PARTS)), default=["mlm", "classify"])
    parser.add_argument("--preset", default="bert6", help="a bert-family model (bert6, bert-small, bert-tiny)")
    parser.add_argument("--methods", type=lambda t: _list(t, allowed=METHODS), default=["dense", "comera"])
    parser.add_argument("--ratios", type=lambda t: _list(t, kind=float), default=[0.5, 0.2])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--late-fraction", type=float, default=0.5)
    parser.add_argument("--gamma", type=float, default=0.01)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3, help="cores' lr; gates 10x, the rest 0.5x (CoMERA's groups)")
    parser.add_argument("--dense-lr", type=float, default=5e-4, help="lr of dense and GaLore (CoMERA's rest group)")
    parser.add_argument("--target-loss", choices=("dense", "hook"), default="dense", help="how L* is chosen")
    parser.add_argument("--comera-target-loss", type=float, default=None, help="an explicit L*")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/comera_bert"))
    args = parser.parse_args(argv)
    results = {part: run_part(args, part) for part in args.parts}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "results.md").write_text(render(results, argv))
    print(render(results, argv))


if __name__ == "__main__":
    main()
