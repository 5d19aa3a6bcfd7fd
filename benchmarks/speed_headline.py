"""Summary of ``benchmarks/speed_headline.sh``: each headline speed figure, what its run measured, and its target.

Reads the ``speed_headline_*.json`` files the script wrote into ``--out`` and writes ``<out>/speed_headline.md``.
Every figure is a ratio of medians measured side by side in one run (wall clock); nothing is computed that the runs
did not measure. A figure whose run is missing or failed is reported as such.

Usage: ``python benchmarks/speed_headline.py --out benchmarks/results --log benchmarks/results/speed_headline.log``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from _results import table, write


def _load(out: Path, name: str) -> dict[str, Any] | None:
    path = out / f"speed_headline_{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _row(result: dict[str, Any] | None, label: str) -> dict[str, Any] | None:
    return None if result is None else next((r for r in result["rows"] if r["label"] == label), None)


def headline_figures(out: Path) -> list[tuple[str, float | None, float, str]]:
    """``(figure, measured, target, source file)`` for every headline figure; measured is None when its run is
    missing."""
    rows: list[tuple[str, float | None, float, str]] = []
    train = _load(out, "train_350m")
    cola = _row(train, "cola fp32")
    rows.append(("350m CoLA train step, fp32, × dense", cola and cola["vs_dense"]["speedup"], 1.9, "train_350m"))
    bf16 = _row(train, "cola bf16")
    if train is not None and bf16 is None:
        rows.append(("350m `--dtype auto`: chose fp32 (no native bf16), bf16 figures not applicable", None, 0, ""))
    else:
        rows.append(("350m CoLA bf16 (auto) × own fp32", bf16 and bf16["speedup_vs_baseline"], 2.0, "train_350m"))
        rows.append(("350m CoLA bf16 (auto) × dense bf16", bf16 and bf16["vs_dense"]["speedup"], 1.8, "train_350m"))
    small = _row(_load(out, "train_60m"), "cola fp32")
    rows.append(("60m CoLA train step, fp32, × dense", small and small["vs_dense"]["speedup"], 1.4, "train_60m"))
    tt = _load(out, "tt_layer")
    rows.append(
        ("TT 768² layer fwd+bwd, 2 threads, × dense", tt and tt["ratios"]["dense_over_tt_linear"], 6.0, "tt_layer")
    )
    bert = _row(_load(out, "bert6_mlm"), "comera fp32")
    rows.append(("bert6 MLM step, batch 8, CoMERA × dense", bert and bert["vs_dense"]["speedup"], 4.0, "bert6_mlm"))
    decode = _load(out, "decode_350m")
    for batch in (1, 8):
        row = decode and next((r for r in decode["rows"] if r["method"] == "cola" and r["batch_size"] == batch), None)
        threshold = 1.5 if batch == 1 else 0.0
        rows.append(
            (
                f"350m decode tokens/s, batch {batch}, CoLA × dense",
                row and row["vs_dense"]["decode_speedup"],
                threshold,
                "decode_350m",
            )
        )
    compiled = _load(out, "compile_60m")
    for row in [] if compiled is None else [r for r in compiled["rows"] if r["compiled"]]:
        rows.append(
            (
                f"60m `--compile` {row['method']}: eager step / compiled step (compile {row['compile_s']:.0f} s apart)",
                row["speedup_vs_baseline"],
                1.0,
                "compile_60m",
            )
        )
    if compiled is None:
        rows.append(("60m `--compile` vs eager", None, 1.0, "compile_60m"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--log", type=Path, default=None)
    parser.add_argument("--tiny", default="0", help="1: the tiny-size check run (not headline figures)")
    args = parser.parse_args()
    lines = []
    if args.tiny == "1":
        lines += ["**Tiny sizes (TINY=1): a check that every step runs; these are not the headline figures.**", ""]
    rows = []
    for figure, measured, threshold, source in headline_figures(args.out):
        if measured is None:
            rows.append([figure, "" if not source else "missing (see log)", "", "", source])
            continue
        reached = "yes" if measured >= threshold else "no"
        shown = f"≥ {threshold:g}×" if threshold else "(context)"
        rows.append([figure, f"{measured:.2f}×", shown, reached if threshold else "", f"`speed_headline_{source}.md`"])
    lines += table(["figure", "measured", "target", "reached", "run"], rows)
    if args.log is not None and args.log.exists():
        lines += ["## Log (commands, load average, exit status, seconds)", "", "```text"]
        lines += [line for line in args.log.read_text().splitlines() if line.startswith(("## ", "load", "exit"))]
        lines += ["```"]
    path = write(args.out / "speed_headline.md", "Speed headline figures (`bash benchmarks/speed_headline.sh`)", lines)
    print(path.read_text())


if __name__ == "__main__":
    main()
