"""Size against held-out perplexity of a trained LLaMA run under post-training compression, before and after healing.

The run is any ``tensorslim train`` run of our LLaMA (its ``model/`` folder and tokenizer). Every arm is measured in
one process on the same text: calibration on the first blocks of the run's training split, healing on the blocks
after them, perplexity on the first blocks of its validation split (never calibrated or healed on). Arms per size:
each single family at its best (plain SVD with ranks by budget, input-whitened SVD with ranks by budget, Kronecker
chosen per layer; RTN and COMQ 4-bit for a bytes budget) against ``tensorslim.compress`` over all its default
families. For a bytes budget ``compress`` also runs at exactly the bytes that COMQ 4-bit takes (its scales and zero
points make it a little more than 1/8 of fp32). Healing (layer by layer, then optionally end to end) runs on
``compress`` at every size (its quantized layers, if any, stay fixed) and on the best structured single family of
each parameter budget. Sizes are shares of the dense linear layers inside the blocks (the output head stays dense).
Writes ``benchmarks/results/compress_llama_<date>.md/.json/.png``; the table is rewritten as each row finishes, so a
stopped run keeps what it measured.

    python -m tensorslim train --preset 60m --method dense --steps 1000 --batch-size 4 --seq-len 256 --lr 2e-3 \
        --out-dir runs/60m-dense
    OMP_NUM_THREADS=1 python benchmarks/compress_llama.py --run runs/60m-dense --held-out 64 --block-steps 0
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
import warnings
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _results, when loaded by path
from _results import read, result_stem, table, write  # noqa: E402

ARMS = (
    "SVD",
    "SVD, whitened",
    "Kronecker (per layer)",
    "RTN 4-bit",
    "COMQ 4-bit",
    "compress",
    "compress (COMQ's bytes)",
)
SIZES = (("params", 0.5), ("bytes", 0.125), ("params", 0.75), ("params", 0.25))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a tensorslim train run folder of our LLaMA")
    parser.add_argument("--data", default="stdlib", help="the run's corpus")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--calibration", type=int, default=8, help="training blocks to calibrate on")
    parser.add_argument("--heal-blocks", type=int, default=800, help="training blocks to heal on (after those)")
    parser.add_argument("--held-out", type=int, default=64, help="validation blocks to measure perplexity on")
    parser.add_argument("--block-steps", type=int, default=100, help="layer-by-layer healing steps per block")
    parser.add_argument("--steps", type=int, default=0, help="end-to-end healing steps")
    parser.add_argument("--lr", type=float, default=2e-4, help="end-to-end healing learning rate")
    parser.add_argument(
        "--sizes", default=",".join(f"{k}:{v}" for k, v in SIZES), help="kind:value pairs, e.g. params:0.5,bytes:0.125"
    )
    parser.add_argument("--arms", default=";".join(ARMS), help=f"a ';'-separated subset of: {'; '.join(ARMS)}")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", default=f"benchmarks/results/compress_llama_{date.today():%Y-%m-%d}")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="continue the result at --out (same run and settings): measure only its missing rows",
    )
    args = parser.parse_args(argv)
    arms = {arm.strip() for arm in args.arms.split(";")}
    if arms - set(ARMS):
        parser.error(f"--arms {sorted(arms - set(ARMS))} unknown; allowed: {'; '.join(ARMS)}")
    sizes = [(kind, float(value)) for kind, value in (pair.split(":") for pair in args.sizes.split(","))]
    if any(kind not in ("params", "bytes") for kind, _ in sizes):
        parser.error(f"--sizes {args.sizes!r} is invalid; allowed: kinds params and bytes, e.g. params:0.5")
    torch.set_num_threads(args.threads)

    from tensorslim import Budget, SVDConfig, convert_, load_pretrained
    from tensorslim.compression import CompressReport, calibrate, compress, heal
    from tensorslim.compression.api import model_size
    from tensorslim.compression.heal import HealConfig
    from tensorslim.convert import output_head_ids
    from tensorslim.data import build_lm_data
    from tensorslim.layers._source import is_dense_linear
    from tensorslim.pretrained import locate_model
    from tensorslim.quant import COMQConfig, RTNConfig, quantize_
    from tensorslim.tasks.lm import lm_loss

    warnings.simplefilter("ignore")
    original = load_pretrained(args.run).eval()
    manifest, folder, _, _ = locate_model(args.run)
    data = build_lm_data(
        args.data,
        tokenizer=str(folder / manifest["run"]["tokenizer"]),
        vocab_size=original.config.vocab_size,
        seq_len=args.seq_len,
        max_val_blocks=args.held_out,
    )
    cal = list(data.train[: args.calibration].split(8))
    heal_data = list(data.train[args.calibration : args.calibration + args.heal_blocks].split(8))
    held_out = list(data.validation.split(8))
    healing = HealConfig(block_steps=args.block_steps, steps=args.steps, lr=args.lr, progress=False)
    heads = output_head_ids(original)
    linear = [m for m in original.modules() if is_dense_linear(m) and id(m) not in heads]
    dense_params = sum(p.numel() for m in linear for p in m.parameters())
    dense_bytes = sum(p.numel() * p.element_size() for m in linear for p in m.parameters())
    full_params, full_bytes = model_size(original)

    @torch.no_grad()
    def perplexity(model: torch.nn.Module) -> float:
        total = sum(lm_loss(model, block, reduction="sum").item() for block in held_out)
        return math.exp(total / sum(b.shape[0] * (b.shape[1] - 1) for b in held_out))

    def linear_share(model: torch.nn.Module, kind: str) -> float:
        params, nbytes = model_size(model)
        if kind == "params":
            return (dense_params - (full_params - params)) / dense_params
        return (dense_bytes - (full_bytes - nbytes)) / dense_bytes

    intro = [
        f"Run `{Path(args.run).name}`: {dense_params:,} parameters in the linear layers of its blocks (the size "
        f"measured here; the output head and embedding stay dense). Calibration on the first {args.calibration} "
        f"training blocks of {args.seq_len} tokens, healing on the next {sum(len(b) for b in heal_data)} ({healing}), "
        f"perplexity on {sum(len(b) for b in held_out)} validation blocks. Single families: SVD and input-whitened "
        "SVD with ranks by budget (`convert_(SVDConfig(budget=…))`), Kronecker chosen per layer "
        "(`compress(families=('kron',), allocation='per-layer')`), RTN/COMQ 4-bit on every layer; `compress` with its "
        "defaults (end-to-end allocation over low rank and Kronecker, plus 8/4/3-bit under a bytes budget)."
        " Healing runs on a copy of each compressed model (quantized layers stay fixed).",
        "",
    ]
    columns = ["size", "arm", "linear-layer share", "healing steps per block", "perplexity", "seconds"]
    lines: list[list[object]] = []
    rows: list[tuple[str, str, float, float]] = []  # (size, arm, share, perplexity) for the plot and the summary
    notes: list[str] = []
    earlier: list[str] = []  # the commands that measured the kept rows
    stem = result_stem(args.out)
    if args.keep and (record_ := read(stem)) is not None:
        earlier = [*record_["result"].get("earlier", []), record_["command"]]
        lines = record_["result"]["rows"]
        notes = [n for n in stem.with_name(stem.name + ".md").read_text().splitlines() if ": kept `" in n]
        rows = [(r[0], r[1] + (" + healing" if r[3] else ""), float(r[2]), float(r[4])) for r in lines[1:]]

    def kept(size: str, arm: str, steps: int) -> float | None:
        """The perplexity of a row the result already holds (``--keep``), else None."""
        return next((float(r[4]) for r in lines[1:] if (r[0], r[1], int(r[3])) == (size, arm, steps)), None)

    def save() -> Path:
        body = [*intro, *table(columns, lines), *summary(rows), *notes]
        title = "A trained LLaMA run under post-training compression: held-out perplexity"
        data = {"rows": lines, "earlier": earlier}
        path = write(stem, title, body, data=data, notes=[f"earlier rows: `{c}`" for c in earlier])
        plot(rows, path.with_suffix(".png"), dense_ppl)
        return path

    def note(size: str, arm: str, report: CompressReport) -> None:
        if report.plan_losses:
            # three significant digits: on a trained LM the low-rank plans differ in the 6th decimal
            losses = ", ".join(f"{plan} {loss:.3g}" for plan, loss in report.plan_losses.items())
            notes.append(f"- {size}, {arm}: kept `{report.plan}`; calibration loss (1 − logits cosine): {losses}")

    def record(size: str, arm: str, model: torch.nn.Module, kind: str, steps: int, start: float) -> float:
        ppl = perplexity(model)
        share = linear_share(model, kind)
        rows.append((size, arm + (" + healing" if steps else ""), share, ppl))
        lines.append([size, arm, f"{share:.3f}", steps, f"{ppl:.2f}", f"{time.time() - start:.0f}"])
        save()
        print(f"{size} {arm} steps={steps} share={share:.3f} perplexity={ppl:.2f}", flush=True)
        return ppl

    def healed(size: str, arm: str, model: torch.nn.Module, kind: str) -> None:
        # what compress(healing=…) does after building its choice, but with quantized layers already quantized (their
        # codes stay fixed; compress would heal them as floats and quantize after): one compress per size, not two
        if kept(size, arm, args.block_steps) is not None:
            return
        start = time.time()
        model = copy.deepcopy(model)
        heal(model, copy.deepcopy(original), heal_data, config=healing)
        record(size, arm, model, kind, args.block_steps, start)

    if lines:
        dense_ppl = float(lines[0][4])
    else:
        dense_ppl = perplexity(original)
        lines.append(["dense", "dense", "1.000", 0, f"{dense_ppl:.2f}", "-"])
    print(lines[0], flush=True)
    healing_on = bool(args.block_steps or args.steps)
    for kind, value in sizes:
        size = f"{value:g} {kind}"
        budget = Budget(**{kind: value})
        # a kept row is not measured again; its model is rebuilt only where healing still needs it
        singles: dict[str, tuple[float, torch.nn.Module | None]] = {}
        if kind == "params":
            structured = [a for a in ("SVD", "SVD, whitened", "Kronecker (per layer)") if a in arms]
            measured = {arm: ppl for arm in structured if (ppl := kept(size, arm, 0)) is not None}
            best_kept = min(measured, key=measured.__getitem__) if measured else None
            for arm in structured:
                if (ppl := measured.get(arm)) is not None and not (healing_on and arm == best_kept):
                    singles[arm] = (ppl, None)
                    continue
                start = time.time()
                if arm == "Kronecker (per layer)":
                    model, _ = compress(
                        original, budget, cal, families=("kron",), allocation="per-layer", progress=False
                    )
                else:
                    model = copy.deepcopy(original)
                    # a calibration is keyed by the layers of the model it ran on: this copy's
                    calibration = calibrate(model, cal, progress=False) if arm != "SVD" else None
                    convert_(model, SVDConfig(budget=budget, calibration=calibration))
                singles[arm] = (ppl if ppl is not None else record(size, arm, model, kind, 0, start), model)
        else:
            for arm, config in (("RTN 4-bit", RTNConfig(bits=4)), ("COMQ 4-bit", COMQConfig(bits=4))):
                if arm not in arms:
                    continue
                start = time.time()
                model = copy.deepcopy(original)
                quantize_(model, config, cal)
                if kept(size, arm, 0) is None:
                    record(size, arm, model, kind, 0, start)
                share = linear_share(model, kind)
                at_comq = f"{share:.3f} {kind}"
                if (
                    arm == "COMQ 4-bit"
                    and "compress (COMQ's bytes)" in arms
                    and kept(at_comq, "compress (COMQ's bytes)", 0) is None
                ):
                    start = time.time()
                    # as a count: 4 bits everywhere fits it exactly
                    model, report = compress(original, Budget(bytes=round(share * dense_bytes)), cal, progress=False)
                    note(at_comq, "compress (COMQ's bytes)", report)
                    record(at_comq, "compress (COMQ's bytes)", model, kind, 0, start)
        model = None
        if "compress" in arms and (kept(size, "compress", 0) is None or healing_on):
            start = time.time()
            model, report = compress(original, budget, cal, progress=False)
            if kept(size, "compress", 0) is None:
                note(size, "compress", report)
                record(size, "compress", model, kind, 0, start)
            print(report.table(), flush=True)
        if healing_on:
            if singles:
                best = min(singles, key=lambda arm: singles[arm][0])
                healed(size, best, singles[best][1], kind)
            if model is not None:
                healed(size, "compress", model, kind)
    print(f"wrote {save()}")
    return 0


def summary(rows: list[tuple[str, str, float, float]]) -> list[str]:
    """Per size, whether ``compress`` has a lower perplexity than every single family (before healing, and after
    healing against the healed single family), and ``compress`` at COMQ's bytes against COMQ 4-bit."""
    out = []
    for size in dict.fromkeys(r[0] for r in rows):
        here = [r for r in rows if r[0] == size]
        for healed in (False, True):
            mine = [r[3] for r in here if r[1] == "compress" + (" + healing" if healed else "")]
            others = [r for r in here if not r[1].startswith("compress") and r[1].endswith(" + healing") == healed]
            if mine and others:
                best = min(others, key=lambda r: r[3])
                out.append(
                    f"- {size}{', healed' if healed else ''}: compress {mine[0]:.2f} is {_verdict(mine[0], best[3])} "
                    f"the best single family ({best[1]}, {best[3]:.2f})"
                )
    for size, arm, share, ppl in rows:
        comq = [r for r in rows if r[1] == "COMQ 4-bit" and abs(r[2] - share) < 5e-4]
        if arm == "compress (COMQ's bytes)" and comq:
            out.append(f"- {size}: compress {ppl:.2f} is {_verdict(ppl, comq[0][3])} COMQ 4-bit ({comq[0][3]:.2f})")
    return [*out, ""] if out else []


def _verdict(mine: float, best: float) -> str:
    """How ``mine`` compares with ``best`` at the two decimals the table shows (a kept row has no more)."""
    if round(mine, 2) == round(best, 2):
        return "equal (to two decimals) to"
    return "lower than" if mine < best else "higher than"


def plot(rows: list[tuple[str, str, float, float]], path: Path, dense: float) -> None:
    """Held-out perplexity against the linear layers' share of dense, one line per arm, the dense run dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    # an arm that fails (here Kronecker alone, up to 40x dense) would flatten the others into one line: the axis spans
    # the points within 10 % of dense, and the legend gives the worst perplexity of an arm that leaves it
    shown = [ppl for *_, ppl in rows if ppl <= 1.1 * dense] + [dense]
    top = max(shown) + 0.1 * (max(shown) - min(shown) + 1e-3)
    for arm in dict.fromkeys(row[1] for row in rows):
        points = sorted((share, ppl) for _, a, share, ppl in rows if a == arm)
        worst = max(ppl for _, ppl in points)
        label = arm if worst <= top else f"{arm} (up to {worst:,.0f}, off the axis)"
        ax.plot(*zip(*points, strict=True), marker="o", linestyle="--" if "healing" in arm else "-", label=label)
    ax.axhline(dense, color="gray", linestyle=":", label="dense")
    ax.set_ylim(min(shown) - 0.1 * (top - min(shown)), top)
    ax.set_xlabel("share of the dense linear layers in the blocks (params; bytes for the 1/8 arms)")
    ax.set_ylabel("held-out perplexity")
    ax.set_title("trained LLaMA, post-training compression")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
