"""LaX experiment: validation loss of dense, CoLA, LaX-CoLA, SVD and LaX-SVD at equal steps and tokens.

Each run is one ``tensorslim train`` command (printed and recorded); runs go seed by seed so that an interrupted
sweep still has complete seeds. The table reports mean ± std over seeds of the final validation loss, the
parameters, and what LaX adds to the low-rank layers.

    .venv/bin/python experiments/lax_experiment.py --steps 200 --seeds 0 1 2 --out /tmp/lax_tiny
    .venv/bin/python experiments/lax_experiment.py --summarize-only --out /tmp/lax_tiny

The default ``--out`` is ``bench-out/lax_tiny`` (ignored by git), never the committed results.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

METHODS = ("dense", "cola", "lax-cola", "svd", "lax-svd")


def run_command(*, preset: str, method: str, steps: int, seed: int, run_dir: Path) -> list[str]:
    return [
        str(Path(sys.executable).parent / "tensorslim"),
        "train",
        "--preset",
        preset,
        "--method",
        method,
        "--steps",
        str(steps),
        "--seed",
        str(seed),
        "--out-dir",
        str(run_dir),
        "--no-progress",
        "--no-tensorboard",
    ]


def _mean_std(values: list[float]) -> str:
    if not values:
        return "–"
    std = statistics.stdev(values) if len(values) > 1 else float("nan")
    return f"{statistics.mean(values):.4f} ± {std:.4f}"


def summarize(out: Path, runs: list[dict]) -> str:
    """The Markdown table of the finished runs in ``runs``."""
    lines = [
        "| method | seeds | val loss (mean ± std) | val ppl (mean) | params total | non-embedding "
        "| tokens/s (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    for method in METHODS:
        rows = [r for r in runs if r["method"] == method]
        if not rows:
            continue
        losses = [r["val_loss"] for r in rows]
        ppl = statistics.mean(r["val_perplexity"] for r in rows)
        speed = statistics.median(r["tokens_per_s"] for r in rows)
        lines.append(
            f"| {method} | {', '.join(str(r['seed']) for r in rows)} | {_mean_std(losses)} | {ppl:.1f} "
            f"| {rows[0]['params_total']:,} | {rows[0]['params_non_embedding']:,} | {speed:,.0f} |"
        )
    return "\n".join(lines) + "\n"


def collect(runs_dir: Path, *, preset: str, steps: int, log_path: Path) -> list[dict]:
    """Every finished run: the records logged at launch, plus runs whose launcher was stopped (their command is
    rebuilt from the run folder's name; the load average at their start was not recorded)."""
    logged = [json.loads(line) for line in log_path.read_text().splitlines()] if log_path.exists() else []
    known = {(r["method"], r["seed"]) for r in logged}
    for summary_path in sorted(runs_dir.glob(f"{preset}-*-s*/summary.json")):
        method, _, seed = summary_path.parent.name[len(preset) + 1 :].rpartition("-s")
        if (method, int(seed)) in known or method not in METHODS:
            continue
        summary = json.loads(summary_path.read_text())
        if summary["steps"] != steps:
            continue
        command = run_command(preset=preset, method=method, steps=steps, seed=int(seed), run_dir=summary_path.parent)
        logged.append(
            {
                "method": method,
                "seed": int(seed),
                "steps": steps,
                "command": " ".join(command),
                "load_average_at_start": None,
                **{k: summary[k] for k in ("val_loss", "params_total", "tokens_per_s")},
                "val_perplexity": summary["val_metrics"]["val_perplexity"],
                "params_non_embedding": summary["params_non_embedding"],
            }
        )
    order = {m: i for i, m in enumerate(METHODS)}
    return sorted(logged, key=lambda r: (order[r["method"]], r["seed"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--out", default="bench-out/lax_tiny")
    parser.add_argument("--runs-dir", default="runs/lax_experiment")
    parser.add_argument("--summarize-only", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    runs_dir = Path(args.runs_dir)
    log_path = out.with_suffix(".runs.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    if not args.summarize_only:
        for seed in args.seeds:
            for method in args.methods:
                run_dir = runs_dir / f"{args.preset}-{method}-s{seed}"
                command = run_command(preset=args.preset, method=method, steps=args.steps, seed=seed, run_dir=run_dir)
                load = os.getloadavg()
                started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
                print(" ".join(command), flush=True)
                subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
                summary = json.loads((run_dir / "summary.json").read_text())
                record = {
                    "method": method,
                    "seed": seed,
                    "steps": args.steps,
                    "command": " ".join(command),
                    "started": started,
                    "load_average_at_start": load,
                    "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                    **{k: summary[k] for k in ("val_loss", "params_total", "tokens_per_s")},
                    "val_perplexity": summary["val_metrics"]["val_perplexity"],
                    "params_non_embedding": summary["params_non_embedding"],
                }
                with log_path.open("a") as f:
                    f.write(json.dumps(record) + "\n")
    runs = collect(runs_dir, preset=args.preset, steps=args.steps, log_path=log_path)
    runs = [r for r in runs if r["method"] in args.methods]
    table = summarize(out, runs)
    print(table)
    out.with_suffix(".json").write_text(json.dumps(runs, indent=2) + "\n")
    loads = [r["load_average_at_start"] for r in runs if r.get("load_average_at_start")]
    template = " ".join(run_command(preset=args.preset, method="M", steps=args.steps, seed=0, run_dir=Path("DIR")))
    header = (
        f"# LaX experiment: `{args.preset}`, {args.steps} steps per run\n\n"
        f"- per run: `{template}` with `--seed S` (exact commands in the .json)\n"
        f"- written {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}; "
        f"1-minute load averages at run starts: {sorted(round(load[0], 1) for load in loads)}\n\n"
    )
    out.with_suffix(".md").write_text(header + table)


if __name__ == "__main__":
    main()
