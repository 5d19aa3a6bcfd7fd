"""A trained LLaMA run compressed to 75/50/25 % of its linear layers' parameters and to 1/8 of their bytes: held-out
perplexity before and after healing.

The run is any ``tensorslim train`` run of our LLaMA (its ``model/`` folder and tokenizer); calibration and healing
use its training text, perplexity is measured on the first blocks of its validation split, all in this one process.
Per size: ``tensorslim.compress`` without healing, then again with healing (layer by layer, then logit distillation
end to end on the Trainer); the 1/8-bytes arm chooses among low rank, Kronecker, 8- and 4-bit per layer. Writes
``benchmarks/results/compress_llama_<date>.md/.json/.png``.

    python -m tensorslim train --preset tiny --method dense --steps 200 --batch-size 8 --seq-len 128 \
        --out-dir /tmp/tiny-dense
    python benchmarks/compress_llama.py --run /tmp/tiny-dense
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from datetime import date
from pathlib import Path

from _results import table, write

SIZES = (("params", 0.75), ("params", 0.5), ("params", 0.25), ("bytes", 0.125))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a tensorslim train run folder of our LLaMA")
    parser.add_argument("--data", default="stdlib", help="the run's corpus")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--calibration", type=int, default=32, help="training blocks to calibrate on")
    parser.add_argument("--heal-blocks", type=int, default=512, help="training blocks to heal on")
    parser.add_argument("--held-out", type=int, default=64, help="validation blocks to measure perplexity on")
    parser.add_argument("--block-steps", type=int, default=100)
    parser.add_argument("--steps", type=int, default=200, help="end-to-end healing steps")
    parser.add_argument("--lr", type=float, default=3e-4, help="end-to-end healing learning rate")
    parser.add_argument("--out", default=f"benchmarks/results/compress_llama_{date.today():%Y-%m-%d}")
    args = parser.parse_args(argv)

    import torch

    from tensorslim import Budget, load_pretrained
    from tensorslim.compression import compress
    from tensorslim.compression.heal import HealConfig
    from tensorslim.data import build_lm_data
    from tensorslim.pretrained import locate_model
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
    calibration = list(data.train[: args.calibration].split(8))
    heal_data = list(data.train[: args.heal_blocks].split(8))
    held_out = list(data.validation.split(8))
    healing = HealConfig(block_steps=args.block_steps, steps=args.steps, lr=args.lr, progress=False)

    @torch.no_grad()
    def perplexity(model: torch.nn.Module) -> float:
        total = sum(lm_loss(model, block, reduction="sum").item() for block in held_out)
        return math.exp(total / sum(b.shape[0] * (b.shape[1] - 1) for b in held_out))

    def linear_params(model: torch.nn.Module) -> int:
        return sum(p.numel() for name, p in model.named_parameters() if ".layers." in f".{name}")

    rows: list[list[object]] = []

    def save() -> Path:
        columns = ["budget", "perplexity, compressed", "block params", "linear bytes", "perplexity, healed",
                   "compress s", "compress + heal s"]  # fmt: skip
        body = [
            f"Run `{Path(args.run).name}` ({linear_params(original):,} parameters in its blocks); calibration on "
            f"{args.calibration} training blocks of {args.seq_len} tokens, healing on {len(heal_data) * 8} blocks "
            f"({healing}), perplexity on {len(held_out) * 8 if held_out else 0} validation blocks. The 1/8-bytes "
            "arm chooses among low rank, Kronecker, 8- and 4-bit per layer; the others among low rank and Kronecker.",
            "",
            *table(columns, rows),
        ]
        path = write(Path(args.out), "A trained LLaMA run compressed and healed: perplexity", body, data={"rows": rows})
        if len(rows) > 1:
            plot(rows, path.with_suffix(".png"))
        return path  # after every size: a stopped run keeps what it measured

    dense_ppl = perplexity(original)
    rows.append(["dense", "-", f"{linear_params(original):,}", "-", f"{dense_ppl:.2f}", "-", "0"])
    print(rows[-1], flush=True)
    for kind, value in SIZES:
        families = ("lowrank", "kron", "int8", "int4") if kind == "bytes" else ("lowrank", "kron")
        budget = Budget(**{kind: value})
        start = time.perf_counter()
        small, report = compress(original, budget, calibration, families=families, progress=False)
        plain = perplexity(small)
        built = time.perf_counter() - start
        start = time.perf_counter()
        healed, report = compress(
            original, budget, calibration, families=families, healing=healing, heal_data=heal_data, progress=False
        )
        fixed = perplexity(healed)
        spent = time.perf_counter() - start
        bytes_ = sum(c.nbytes for c in report.choices.values())
        rows.append([f"{kind} {value:g}", f"{plain:.2f}", f"{linear_params(healed):,}", f"{bytes_:,}", f"{fixed:.2f}",
                     f"{built:.0f}", f"{spent:.0f}"])  # fmt: skip
        print(rows[-1], flush=True)
        print(report.table().splitlines()[-1], flush=True)
        save()

    print(f"wrote {save()}")
    return 0


def plot(rows: list[list[object]], path: Path) -> None:
    """Perplexity per budget, compressed and healed, against the dense run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = rows[1:]
    fig, ax = plt.subplots(figsize=(6, 4))
    x = range(len(sizes))
    ax.plot(x, [float(r[1]) for r in sizes], marker="o", label="compressed")
    ax.plot(x, [float(r[4]) for r in sizes], marker="o", label="healed")
    ax.axhline(float(rows[0][4]), color="gray", linestyle="--", label="dense")
    ax.set_xticks(list(x), [str(r[0]) for r in sizes])
    ax.set_yscale("log")
    ax.set_ylabel("held-out perplexity")
    ax.set_title("trained LLaMA compressed, before and after healing")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
