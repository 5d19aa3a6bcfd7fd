"""Train-step time against LoRA and inference time against the frozen MiniLM backbone, each method side by side.

**Train step.** Each method as ``tensorslim finetune`` trains it (MiniLM, 5 classes, AdamW on the trainable
parameters): one step = forward, cross-entropy, backward, optimizer step, on one batch of 16 training titles cut and
padded to 16 tokens (the sweep's ``--batch-size 16 --seq-len 16``). A round times ``--steps`` steps of every method in
a rotated order; the figure is each method's median over rounds of its seconds per step. Timing every method in one
process, interleaved, is what makes the ratios comparable on a shared machine; the sweep's own step times come from
runs hours apart.

**Inference.**
Every method is put on the same MiniLM classifier (5 classes) in its deployed form: ungated LoRA merged into
``W_q``/``W_v`` (``merge_lora_``, exact; peft's LoRA through its own ``merge``), prefixes computed once
(``PrefixEncoder`` caches them without gradients), gated modules as they are (a gate depends on the input, so a
gated LoRA cannot be merged). Input: BBC News test titles in their order, in batches of ``--batch`` titles padded to
the longest title of the batch (MiniLM's tokenizer, ``[CLS] … [SEP]``). One round times every model once over all
batches, in a rotated order; the ratio is the median over rounds of (model time / backbone time) within a round, so
load changes between rounds cancel. One thread (``torch.set_num_threads(1)``).

**Longer inputs.** Titles average 9 tokens, so a 10-token prompt nearly doubles every layer's sequence. To show how
that overhead shrinks with the input, the same run repeats both measurements on the first ``--long-tokens`` tokens of
the BBC articles themselves (``--long-batch`` articles per batch, the same ``--batches`` batches, cut to
``--long-tokens``; training batches of ``--long-batch`` training articles). ``--long-tokens 0`` skips it.

    OMP_NUM_THREADS=1 python benchmarks/adapters_costs.py --out benchmarks/results/adapters_costs

Writes ``<out>.json`` and ``<out>.md``; ``python experiments/adapters_protocol.py --summarize --costs <out>.json``
puts both in the accuracy table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _results, when loaded by path (tests)
from _results import write  # noqa: E402

# name → (registered method, deployed form)
ARMS = {
    "lora (merged)": ("lora", "merge"),
    "lora (unmerged)": ("lora", None),
    "peft-lora (merged)": ("peft-lora", "peft-merge"),
    "adapter": ("adapter", None),
    "prefix": ("prefix", None),
    "prompt": ("prompt", None),
    "peft-prompt": ("peft-prompt", None),
    "unipelt": ("unipelt", None),
    "unipelt-prompt": ("unipelt-prompt", None),
}
TRAINED = ("dense", "lora", "peft-lora", "adapter", "prefix", "prompt", "peft-prompt", "unipelt", "unipelt-prompt")
# The method name the accuracy table uses for each arm's ratio.
TABLE_NAMES = {
    "lora (merged)": "lora",
    "peft-lora (merged)": "peft-lora",
    "adapter": "adapter",
    "prefix": "prefix",
    "prompt": "prompt",
    "peft-prompt": "peft-prompt",
    "unipelt": "unipelt",
    "unipelt-prompt": "unipelt-prompt",
}


def build(method: str, deploy: str | None) -> nn.Module:
    from tensorslim.layers.adapters import merge_lora_
    from tensorslim.methods import build_for_method

    model, _, _ = build_for_method("minilm", method, task="classify", n_classes=5)
    if deploy == "merge":
        merge_lora_(model)
    elif deploy == "peft-merge":
        from peft.tuners.lora import LoraLayer

        for module in model.modules():
            if isinstance(module, LoraLayer):
                module.merge()
    return model.eval()


def _tokenizer() -> Any:
    import transformers

    from tensorslim.models.registry import get_model

    folder = get_model("minilm").tokenizer_folder()
    return transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def _texts(articles: bool) -> tuple[list[str], list[int], list[int], list[int]]:
    """``(texts, labels, train indices, test indices)``: the titles, or the whole articles (title first)."""
    from tensorslim.data import bbcnews_labelled, bbcnews_split, bbcnews_titles

    if articles:
        texts, labels, _ = bbcnews_labelled()
        return texts, labels, *bbcnews_split()
    texts, labels, _, train, test = bbcnews_titles()
    return texts, labels, train, test


def batches(size: int, count: int, *, max_tokens: int | None = None) -> list[dict[str, torch.Tensor]]:
    """``count`` batches of ``size`` test titles, each padded to its longest title; with ``max_tokens``, of the
    test articles cut to ``max_tokens`` tokens."""
    texts, _, _, test = _texts(max_tokens is not None)
    chosen = [texts[i] for i in test[: size * count]]
    cut = {} if max_tokens is None else {"truncation": True, "max_length": max_tokens}
    tokenizer = _tokenizer()
    return [
        dict(tokenizer(chosen[i : i + size], padding="longest", return_tensors="pt", **cut))
        for i in range(0, len(chosen), size)
    ]


def train_batch(size: int, seq_len: int, *, articles: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids, mask, labels)``: ``size`` training titles (or articles) cut and padded to ``seq_len`` tokens, as in
    the sweep."""
    texts, labels, train, _ = _texts(articles)
    rows = _tokenizer()([texts[i] for i in train[:size]], padding="max_length", truncation=True, max_length=seq_len)
    ids = torch.tensor(rows["input_ids"])
    return ids, torch.tensor(rows["attention_mask"]), torch.tensor([labels[i] for i in train[:size]])


def step_times(batch: tuple[torch.Tensor, ...], steps: int, rounds: int) -> dict[str, float]:
    """Median over rounds of each method's seconds per training step, the methods interleaved."""
    import torch.nn.functional as F

    from tensorslim.methods import build_for_method

    ids, mask, labels = batch
    arms = {}
    for method in TRAINED:
        model, _, _ = build_for_method("minilm", method, task="classify", n_classes=5)
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        arms[method] = (model, torch.optim.AdamW(params, lr=1e-5))

    def step(method: str) -> None:
        model, optimizer = arms[method]
        optimizer.zero_grad(set_to_none=True)
        logits = model(ids, attention_mask=mask).logits
        F.cross_entropy(logits, labels).backward()
        optimizer.step()

    times: dict[str, list[float]] = {name: [] for name in arms}
    for name in arms:  # warm-up: optimizer states, allocator
        step(name)
    names = list(arms)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            for _ in range(steps):
                step(name)
            times[name].append((time.perf_counter() - start) / steps)
    return {name: statistics.median(t) for name, t in times.items()}


def measure(models: dict[str, nn.Module], data: list[dict[str, torch.Tensor]], rounds: int) -> dict[str, list[float]]:
    """Seconds per round of each model over all batches, the models in a rotated order each round."""
    names = list(models)
    times: dict[str, list[float]] = {name: [] for name in names}
    with torch.inference_mode():
        for name in names:  # warm-up (and the prefix caches)
            models[name](**data[0])
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                start = time.perf_counter()
                for inputs in data:
                    models[name](**inputs)
                times[name].append(time.perf_counter() - start)
    return times


def inference(data: list[dict[str, torch.Tensor]], rounds: int) -> dict[str, Any]:
    """Each deployed model's median ratio to the frozen backbone (within a round) and median seconds per round, with
    the mean real and padded tokens per input."""
    models = {"frozen backbone": build("dense", None)}
    models.update({name: build(method, deploy) for name, (method, deploy) in ARMS.items()})
    times = measure(models, data, rounds)
    base = times["frozen backbone"]
    rows = {
        name: {
            "ratio": statistics.median(t / b for t, b in zip(times[name], base, strict=True)),
            "seconds": statistics.median(times[name]),
        }
        for name in models
    }
    return {
        "tokens_per_input": statistics.fmean(int(b["attention_mask"].sum()) / len(b["attention_mask"]) for b in data),
        "padded_length": statistics.fmean(b["input_ids"].shape[1] for b in data),
        "rows": rows,
        "table": {TABLE_NAMES[name]: rows[name]["ratio"] for name in TABLE_NAMES},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32, help="titles per batch")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=2, help="training steps per method per round")
    parser.add_argument("--train-rounds", type=int, default=5)
    parser.add_argument("--long-tokens", type=int, default=128, help="tokens per article in the longer-input run")
    parser.add_argument("--long-batch", type=int, default=4, help="articles per batch in the longer-input run")
    parser.add_argument("--out", default="bench-out/adapters_costs")
    args = parser.parse_args(argv)
    if args.long_tokens < 0 or args.long_batch < 1:
        parser.error(f"--long-tokens {args.long_tokens} --long-batch {args.long_batch} is invalid; allowed: >= 0, >= 1")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    step_seconds = step_times(train_batch(16, 16), args.steps, args.train_rounds)
    titles = inference(batches(args.batch, args.batches), args.rounds)
    record: dict[str, Any] = {
        "batch": args.batch,
        "batches": args.batches,
        "rounds": args.rounds,
        "tokens_per_title": titles["tokens_per_input"],
        "padded_length": titles["padded_length"],
        "rows": titles["rows"],
        "table": titles["table"],
        "step_seconds": step_seconds,
    }
    if args.long_tokens:
        record["long"] = {
            "tokens": args.long_tokens,
            "batch": args.long_batch,
            "step_seconds": step_times(
                train_batch(args.long_batch, args.long_tokens, articles=True), args.steps, args.train_rounds
            ),
            **inference(batches(args.long_batch, args.batches, max_tokens=args.long_tokens), args.rounds),
        }
    title = "Adapter methods: train step against LoRA, inference against the frozen backbone"
    print(write(Path(args.out), title, report(record, args), data=record).read_text())
    return 0


def report(record: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """The Markdown tables: train step against LoRA, inference against the frozen backbone, titles then (if run)
    the longer inputs side by side."""
    long = record.get("long")
    steps = record["step_seconds"]
    load = "One thread; on a shared machine the seconds are noisy, the ratios within a round less so."
    step_head = "| method | seconds per step | step / LoRA |"
    if long:
        step_head += f" seconds per step, {args.long_batch} × {args.long_tokens} | step / LoRA, {args.long_tokens} |"
    step_rows = []
    for name, sec in steps.items():
        row = f"| {name} | {sec:.3f} | {sec / steps['lora']:.2f}× |"
        if long:
            sec_long = long["step_seconds"][name]
            row += f" {sec_long:.3f} | {sec_long / long['step_seconds']['lora']:.2f}× |"
        step_rows.append(row)
    inference_head = "| model | time / frozen backbone | seconds per round (median) |"
    if long:
        inference_head += f" time / frozen, {args.long_tokens} tokens | seconds per round, {args.long_tokens} |"
    inference_rows = []
    for name, row in record["rows"].items():
        line = f"| {name} | {row['ratio']:.2f}× | {row['seconds']:.3f} |"
        if long:
            line += f" {long['rows'][name]['ratio']:.2f}× | {long['rows'][name]['seconds']:.3f} |"
        inference_rows.append(line)
    long_step = f"; articles: batch {args.long_batch} × {args.long_tokens} tokens" if long else ""
    long_inference = (
        f" Articles: {args.batches} batches of {args.long_batch} BBC test articles cut to {args.long_tokens} tokens "
        f"({long['tokens_per_input']:.1f} tokens per article on average, {long['padded_length']:.1f} after padding)."
        if long
        else ""
    )
    lines = [
        f"**Train step** (titles: batch 16 × 16 tokens{long_step}; forward + backward + AdamW; median over "
        f"{args.train_rounds} interleaved rounds of {args.steps} steps). {load}\n",
        step_head,
        "|---|---|---|" + ("---|---|" if long else ""),
        *step_rows,
        "",
        "**Inference**",
        "",
        f"Titles: {args.batches} batches of {args.batch} BBC test titles, padded to the longest of each batch "
        f"({record['tokens_per_title']:.1f} tokens per title on average, {record['padded_length']:.1f} after "
        f"padding).{long_inference} Median over {args.rounds} rounds of the time ratio to the frozen backbone within "
        f"a round. {load}\n",
        inference_head,
        "|---|---|---|" + ("---|---|" if long else ""),
        *inference_rows,
    ]
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
