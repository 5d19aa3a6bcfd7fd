"""Wait-to-attend on frozen MiniLM: a look-ahead task where a token's label is a cue up to ``--max-distance`` tokens
after it. A linear probe on the token's final hidden state is trained and tested for each wait ``w`` (Attendre's Q
memory, arXiv 2401.04881 §3, reconstruction), next to full bidirectional attention and the causal memory (w = 0).

Usage:
    PYTHONPATH=. .venv/bin/python benchmarks/memory_lookahead.py --out benchmarks/results/memory_lookahead
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch

from tensorslim.memory import MemoryConfig, equip_memory_

CUES = ("red", "blue")


def lookahead_set(tokenizer: object, *, count: int, length: int, max_distance: int, seed: int) -> tuple:
    """``(ids (N, L), targets (N,), labels (N,))``: BBC filler with a [MASK] whose label is which cue word follows it
    within ``max_distance`` tokens."""
    from tensorslim.data.longdocs import bbc_topic_text

    generator = torch.Generator().manual_seed(seed)
    text = " ".join(bbc_topic_text("business"))
    filler = tokenizer(text, add_special_tokens=False)["input_ids"]
    cue_ids = [tokenizer.convert_tokens_to_ids(c) for c in CUES]
    ids = torch.empty(count, length, dtype=torch.long)
    targets, labels = torch.empty(count, dtype=torch.long), torch.randint(0, 2, (count,), generator=generator)
    for n in range(count):
        start = int(torch.randint(0, len(filler) - length, (1,), generator=generator))
        row = [tokenizer.cls_token_id, *filler[start : start + length - 2], tokenizer.sep_token_id]
        target = int(torch.randint(4, length - max_distance - 2, (1,), generator=generator))
        distance = int(torch.randint(1, max_distance + 1, (1,), generator=generator))
        row = [tokenizer.unk_token_id if t in cue_ids else t for t in row]  # no stray cue words
        row[target] = tokenizer.mask_token_id
        row[target + distance] = cue_ids[int(labels[n])]
        ids[n], targets[n] = torch.tensor(row), target
    return ids, targets, labels


@torch.no_grad()
def features(model: torch.nn.Module, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    rows = []
    for start in range(0, len(ids), 16):
        hidden = model(ids[start : start + 16]).last_hidden_state  # (b, L, d)
        rows.append(hidden[torch.arange(len(hidden)), targets[start : start + 16]])
    return torch.cat(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--max-distance", type=int, default=32)
    parser.add_argument("--train", type=int, default=300)
    parser.add_argument("--test", type=int, default=200)
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--waits", type=int, nargs="+", default=[0, 8, 16, 32, 64])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)  # the machine is shared: more threads than free cores only thrash
    from sklearn.linear_model import LogisticRegression
    from transformers import AutoTokenizer

    from tensorslim.models.registry import build_model, get_model

    tokenizer = AutoTokenizer.from_pretrained(str(get_model("minilm").tokenizer_folder()), local_files_only=True)
    model = build_model("minilm", task="embed").eval()
    ids, targets, labels = lookahead_set(
        tokenizer, count=args.train + args.test, length=args.length, max_distance=args.max_distance, seed=0
    )
    variants = {"full bidirectional": None}
    for wait in args.waits:
        variants[f"wait {wait}"] = MemoryConfig(capacity=args.length, chunk=args.chunk, wait=wait)
    variants["wait 32, LRA memory of 48"] = MemoryConfig(capacity=48, chunk=args.chunk, wait=32, policy="lra", sinks=4)
    rows = []
    for name, config in variants.items():
        encoder = copy.deepcopy(model)
        if config is not None:
            equip_memory_(encoder, config)
        x = features(encoder, ids, targets).numpy()
        probe = LogisticRegression(max_iter=2000, C=1.0).fit(x[: args.train], labels[: args.train].numpy())
        accuracy = float(probe.score(x[args.train :], labels[args.train :].numpy()))
        rows.append({"variant": name, "wait": None if config is None else config.wait, "accuracy": accuracy})
        print(json.dumps(rows[-1]), flush=True)
    full = rows[0]["accuracy"]
    for row in rows:
        row["of_full"] = row["accuracy"] / full
    out = Path(args.out)
    command = "PYTHONPATH=. .venv/bin/python " + " ".join(sys.argv)
    out.with_suffix(".json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))
    lines = [
        "# Wait-to-attend on frozen MiniLM: look-ahead task",
        "",
        f"Command: `{command}`",
        "",
        f"{args.length}-token BBC filler; a [MASK] token's label is which of {list(CUES)} appears "
        f"1..{args.max_distance} tokens after it. Linear probe on the [MASK]'s final hidden state, "
        f"{args.train} train / {args.test} test documents; chunk {args.chunk}. Chance is 50%.",
        "",
        "| variant | accuracy | of full bidirectional |",
        "|---|---|---|",
        *(f"| {r['variant']} | {100 * r['accuracy']:.1f}% | {100 * r['of_full']:.0f}% |" for r in rows),
        "",
    ]
    out.with_suffix(".md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
