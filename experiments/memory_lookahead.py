"""Wait-to-attend on a fine-tuned MiniLM: the ``lookahead`` task (the label of ``[CLS]`` is a cue word 1..32 tokens
after it), fine-tuned through the Trainer once per variant: full bidirectional attention, a causal FIFO memory
(w = 0) and bounded memories whose queries wait w later tokens (Attendre's Q memory, arXiv 2401.04881 §3,
reconstruction). Each variant is trained with its memory in place; the fully bidirectional model is also read
through each memory without further training (a second column).

Usage:
    PYTHONPATH=. .venv/bin/python experiments/memory_lookahead.py --out experiments/results/memory_lookahead
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import time
from pathlib import Path

import torch

from tensorslim.data.cache import cache_dir
from tensorslim.layers.memory import MemoryConfig, equip_memory_
from tensorslim.train.config import TrainConfig
from tensorslim.train.trainer import Trainer


def train_config(args: argparse.Namespace, name: str) -> TrainConfig:
    return TrainConfig(
        preset="minilm",
        task="lookahead",
        method="dense",
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.length,
        lr=args.lr,
        eval_every=args.steps,
        eval_blocks=args.test,
        checkpoint_every=args.steps,
        progress=False,
        tensorboard=False,
        seed=args.seed,
        out_dir=str(cache_dir("runs", f"memory_lookahead-{name}")),
        task_options={"max_distance": args.max_distance, "examples": args.train},
    )


def memory(args: argparse.Namespace, wait: int) -> MemoryConfig:
    return MemoryConfig(capacity=args.capacity, chunk=args.chunk, wait=wait, policy="fifo")


def accuracy(trainer: Trainer, model: torch.nn.Module) -> float:
    model.eval()
    metrics = trainer.task.evaluate(model, trainer.data, batch_size=32, autocast=contextlib.nullcontext)
    return metrics["val_accuracy"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=64, help="tokens per document, [CLS] included")
    parser.add_argument("--max-distance", type=int, default=32)
    parser.add_argument("--train", type=int, default=2000, help="training documents")
    parser.add_argument("--test", type=int, default=400, help="validation documents (BBC test split)")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--capacity", type=int, default=48, help="memory entries (>= wait + chunk)")
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--waits", type=int, nargs="+", default=[0, 8, 32])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)  # the machine is shared: more threads than free cores only thrash
    rows = []
    for wait in [None, *args.waits]:
        name = "full" if wait is None else f"wait{wait}"
        trainer = Trainer(train_config(args, name))
        if wait is not None:
            equip_memory_(trainer.model, memory(args, wait))  # same parameters: the optimizer is unchanged
        start = time.perf_counter()
        result = trainer.run()
        row = {
            "variant": "full bidirectional" if wait is None else f"FIFO memory {args.capacity}, wait {wait}",
            "wait": wait,
            "trained_accuracy": result.val_metrics["val_accuracy"],
            "train_s": time.perf_counter() - start,
        }
        if wait is None:
            full_model = trainer.model
            full_trainer = trainer
        else:  # the bidirectional model, read through this memory without training
            reader = copy.deepcopy(full_model)
            equip_memory_(reader, memory(args, wait))
            row["full_model_read_accuracy"] = accuracy(full_trainer, reader)
        rows.append(row)
        print(json.dumps(row), flush=True)
    full = rows[0]["trained_accuracy"]
    for row in rows:
        row["of_full"] = row["trained_accuracy"] / full
    write(rows, args)


def write(rows: list[dict], args: argparse.Namespace) -> None:
    out = Path(args.out)
    command = "PYTHONPATH=. .venv/bin/python " + " ".join(sys.argv)
    out.with_suffix(".json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))
    lines = [
        "# Wait-to-attend on a fine-tuned MiniLM: look-ahead task",
        "",
        f"Command: `{command}`",
        "",
        f"Task `lookahead`: {args.length}-token BBC News documents; the label of [CLS] is which of 'false'/'true' lies "
        f"1..{args.max_distance} tokens after it. MiniLM fine-tuned through the Trainer for {args.steps} steps "
        f"(batch {args.batch_size}, lr {args.lr:g}, {args.train} training documents) once per variant, with its "
        f"memory in place (chunk {args.chunk}); accuracy on {args.test} held-out documents (BBC test split). "
        "Chance is 50%. The last column reads the fully bidirectional model through the same memory, untrained.",
        "",
        "| variant | accuracy (fine-tuned with it) | of full bidirectional | full model read through it |",
        "|---|---|---|---|",
    ]
    for r in rows:
        read = r.get("full_model_read_accuracy")
        lines.append(
            f"| {r['variant']} | {100 * r['trained_accuracy']:.1f}% | {100 * r['of_full']:.0f}% | "
            f"{'-' if read is None else f'{100 * read:.1f}%'} |"
        )
    lines.append("")
    out.with_suffix(".md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
