"""MiniLM at half its linear layers' parameters on BBC News: embedding cosine and a fine-tuned classifier's accuracy,
dense vs compressed vs healed (layer by layer, then end to end).

Two arms, each in this one process:

- **embedding**: the pretrained MiniLM encoder, compressed with ``tensorslim.compress`` (low rank, calibrated on the
  first BBC training articles), healed on the BBC training articles; the mean cosine of its mean-pooled sentence
  embeddings to the original's on the validation articles after every stage.
- **classifier**: MiniLM fine-tuned on the training split of the BBC classification data (5 topics, the ``classify``
  task on the Trainer; its test-split accuracy every ``--finetune-eval-every`` steps shows whether it converged), its
  encoder compressed (calibrated on training articles), the whole classifier healed from the fine-tuned one on
  training articles (layer by layer, then the KL of its class distribution); test-split accuracy after every stage.

Every stage's wall time and process CPU time are recorded (the machine may be shared: CPU seconds are the figure
that does not depend on the other jobs). Writes ``benchmarks/results/compress_bbc_<date>.md/.json/.png``.

    HF_HUB_OFFLINE=1 python benchmarks/compress_bbc.py
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import tempfile
import time
import warnings
from contextlib import nullcontext
from datetime import date
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _results import command, machine, read, table, write  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=0.5, help="budget: share of the linear layers' parameters")
    parser.add_argument("--calibration", type=int, default=128, help="BBC training articles to calibrate on")
    parser.add_argument("--heal-texts", type=int, default=0, help="BBC training articles to heal on (0: all)")
    parser.add_argument(
        "--heal-windows", type=int, default=1,
        help="embedding arm: sequences of --seq-len tokens cut from each healing article (its first N consecutive "
        "windows, in a fixed random order; 1: its first --seq-len tokens only)",
    )  # fmt: skip
    parser.add_argument("--held-out", type=int, default=0, help="BBC validation articles to score on (0: all)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--block-steps", type=int, default=None, help="layer-by-layer steps (default: HealConfig's)")
    parser.add_argument("--block-lr", type=float, default=None)
    parser.add_argument("--steps", type=int, default=None, help="end-to-end steps (default: HealConfig's)")
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--loss", default=None, help="end-to-end loss of the encoder (default: HealConfig's)")
    parser.add_argument(
        "--compressed", default=None,
        help="embedding arm: a folder with the compressed model (loaded if it holds one; else compressed and saved "
        "there), so that healing settings can be compared on one compressed model",
    )  # fmt: skip
    parser.add_argument("--arms", default="embedding,classifier", help="embedding, classifier or both")
    parser.add_argument("--finetune-steps", type=int, default=300, help="steps of the classifier's fine-tuning")
    parser.add_argument("--finetune-lr", type=float, default=1e-4, help="peak learning rate of the fine-tuning")
    parser.add_argument("--finetune-eval-every", type=int, default=100, help="fine-tuning steps between evaluations")
    parser.add_argument("--test-articles", type=int, default=0, help="BBC test articles to score on (0: all 445)")
    parser.add_argument("--out", default=f"benchmarks/results/compress_bbc_{date.today():%Y-%m-%d}")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoTokenizer

    from tensorslim import Budget
    from tensorslim.compression import compress
    from tensorslim.compression.heal import HealConfig, heal
    from tensorslim.compression.texts import window_batches
    from tensorslim.data import load_corpus
    from tensorslim.models.registry import build_model
    from tensorslim.tasks.base import model_tokenizer

    warnings.simplefilter("ignore")
    given = {k: getattr(args, k) for k in ("block_steps", "block_lr", "steps", "lr", "batch_size", "loss")}
    healing = HealConfig(**{k: v for k, v in given.items() if v is not None})
    tokenizer = AutoTokenizer.from_pretrained(model_tokenizer("minilm"))
    corpus = load_corpus("bbcnews")

    def batches(texts: list[str]) -> list[dict]:
        return [
            dict(tokenizer(texts[i : i + 8], truncation=True, max_length=args.seq_len, padding=True,
                           return_tensors="pt"))
            for i in range(0, len(texts), 8)
        ]  # fmt: skip

    train = list(corpus.train)  # sorted by topic: drawn in a fixed random order, as tensorslim compress does
    train = [train[i] for i in torch.randperm(len(train), generator=torch.Generator().manual_seed(0)).tolist()]
    calibration = batches(train[: args.calibration])

    heal_texts = train[: args.heal_texts or None]
    if args.heal_windows == 1:
        heal_data = batches(heal_texts)
    else:
        heal_data = window_batches(tokenizer, heal_texts, seq_len=args.seq_len, windows=args.heal_windows)
    held_out = batches(list(corpus.validation[: args.held_out or None]))
    rows: list[list[object]] = []
    data: dict[str, object] = {
        "healing": healing.__dict__,
        "heal_texts": len(heal_texts),
        "heal_sequences": sum(len(b["input_ids"]) for b in heal_data),
    }
    budget = Budget(params=args.params)

    def clock() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    def measure(arm: str, stage: str, quality: float, metric: str, since: tuple[float, float], params: int) -> None:
        now = clock()
        row = [
            arm,
            stage,
            f"{params:,}",
            f"{quality:.4f}",
            metric,
            f"{now[0] - since[0]:.0f}",
            f"{now[1] - since[1]:.0f}",
        ]
        rows.append(row)
        print(" | ".join(row), flush=True)
        save()  # after every row: a stopped run keeps what it measured

    running = [arm for arm in ("embedding", "classifier") if arm in args.arms]
    kept = kept_arms(Path(args.out), running)  # the other arm's rows of an earlier run into the same file

    def described(arm: str) -> str:
        if arm == "classifier":
            return f"healing on its training articles with {healing}"
        per = f", up to {args.heal_windows} windows per article" if args.heal_windows > 1 else ""
        return (
            f"healing on {data['heal_sequences']} sequences of up to {args.seq_len} tokens from {data['heal_texts']} "
            f"training articles{per}, with {healing}"
        )

    def save() -> Path:
        columns = ["arm", "stage", "params", "quality", "metric", "wall s", "CPU s"]
        mine = [dict(zip(columns, row, strict=True)) for row in rows]
        now = {"command": command(), "date": machine()["date"], "load_average": machine()["load_average"]}
        arms = {
            **kept,
            **{
                arm: {**now, "healing": described(arm), "rows": [r for r in mine if r["arm"] == arm]} for arm in running
            },
        }
        if "classifier" in running:
            arms["classifier"]["finetune_curve"] = data.get("finetune_curve", [])
        finetuned = arms.get("classifier", {}).get("finetune_curve", [])
        curve = ", ".join(f"{accuracy:.4f} at step {step}" for step, accuracy in finetuned)
        body = [
            f"MiniLM at {args.params:.0%} of its linear layers' parameters (low rank, calibrated on "
            f"{args.calibration} BBC training articles of {args.seq_len} tokens). Embedding arm: the corpus split "
            f"(healing on its training articles, cosine on its {sum(len(b['input_ids']) for b in held_out)} "
            "validation articles). Classifier arm: the stratified split of the labelled articles (fine-tuning, "
            "calibration and healing on its training articles, accuracy on "
            f"{str(args.test_articles) + ' random' if args.test_articles else 'all'} of its test articles). Times are "
            "per stage: wall seconds, and CPU seconds of the process (all threads); the load average says how busy "
            "the shared machine was. Each arm's rows come from the command named for it (the header names the "
            "latest):",
            "",
            *(
                f"- {arm}: `{record['command']}` ({record['date']}, load {record['load_average']}; {record['healing']})"
                for arm, record in arms.items()
            ),
            *(["", f"Fine-tuning, test accuracy: {curve}."] if curve else []),
            "",
            *table(columns, [list(r.values()) for record in arms.values() for r in record["rows"]]),
        ]
        data["rows"] = mine
        data["arms"] = arms
        path = write(Path(args.out), "MiniLM on BBC News: dense vs compressed vs healed", body, data=data)
        plot([list(r.values()) for record in arms.values() for r in record["rows"]], path.with_suffix(".png"))
        return path

    def size(model: torch.nn.Module) -> int:
        return sum(p.numel() for p in model.parameters())

    if "embedding" in args.arms:
        from tensorslim.compression.api import agreement
        from tensorslim.pretrained import MANIFEST, load_pretrained, save_pretrained

        original = build_model("minilm", task="embed").eval()
        start = clock()
        saved = Path(args.compressed) if args.compressed else None
        if saved is not None and (saved / MANIFEST).is_file():
            student = load_pretrained(saved)
            measure("embedding", "original", 1.0, "cosine", start, size(original))
            quality = agreement(student, original, held_out)
            measure("embedding", f"compressed (loaded from {saved.name})", quality, "cosine", start, size(student))
        else:
            student, report = compress(original, budget, calibration, families=("lowrank",), held_out=held_out)
            measure("embedding", "original", 1.0, "cosine", start, size(original))
            measure("embedding", "compressed", report.stages[-1].quality, "cosine", start, size(student))
            if saved is not None:
                save_pretrained(student, saved)
        since = clock()

        def embedding_stage(name: str) -> None:
            nonlocal since
            measure("embedding", name, agreement(student, original, held_out), "cosine", since, size(student))
            since = clock()

        heal(student, copy.deepcopy(original), heal_data, held_out=held_out, config=healing, on_stage=embedding_stage)

    if "classifier" in args.arms:
        import json

        from tensorslim.cli.finetune import finetune_config
        from tensorslim.tasks.classify import split_rows
        from tensorslim.train.trainer import Trainer

        with tempfile.TemporaryDirectory() as run_dir:
            config = finetune_config(
                model="minilm", method="dense", data="bbcnews", train_size=0, dev_size=0, steps=args.finetune_steps,
                batch_size=16, seq_len=args.seq_len, lr=args.finetune_lr, seed=0, out_dir=run_dir,
            )  # fmt: skip
            config = dataclasses.replace(config, eval_every=args.finetune_eval_every)
            start = clock()
            trainer = Trainer(config)
            trainer.run()
            records = [json.loads(line) for path in Path(run_dir).rglob("metrics.jsonl") for line in path.open()]
        curve = [(r["step"], r["val_accuracy"]) for r in records if "val_accuracy" in r]
        data["finetune_curve"] = curve
        classifier = trainer.model.eval()
        test, pad_id = trainer.data.validation
        shuffled = torch.randperm(len(test), generator=torch.Generator().manual_seed(0))  # the split is sorted by class
        scored = dataclasses.replace(trainer.data, validation=(test[shuffled[: args.test_articles or None]], pad_id))
        # the classifier's own training articles (ordered by class: shuffled once), tokenized as it saw them;
        # calibration and healing never see its test articles
        articles = trainer.data.train.rows.blocks
        ids, mask, _ = split_rows(
            articles[torch.randperm(len(articles), generator=torch.Generator().manual_seed(0))], pad_id=pad_id
        )
        texts = [{"input_ids": ids[i : i + 8], "attention_mask": mask[i : i + 8]} for i in range(0, len(ids), 8)]
        classifier_calibration = texts[: max(1, args.calibration // 8)]
        classifier_healing = texts[: (args.heal_texts + 7) // 8 if args.heal_texts else None]

        def accuracy(model: torch.nn.Module) -> float:
            metrics = trainer.task.evaluate(model, scored, batch_size=32, autocast=nullcontext)
            return metrics["val_accuracy"]

        measure("classifier", f"fine-tuned ({args.finetune_steps} steps)", accuracy(classifier), "accuracy", start,
                size(classifier))  # fmt: skip
        start = clock()
        # the pooler feeds the classifier head but not the encoder's mean-pooled output, by which compress measures
        # the encoder: left to compress, it would cost nothing there and be cut to rank 1
        encoder, _ = compress(
            classifier.bert, budget, classifier_calibration, families=("lowrank",),
            filter_fn=lambda module, name: not name.startswith("pooler."),
        )  # fmt: skip
        small = copy.deepcopy(classifier)
        small.bert = encoder
        measure("classifier", "compressed", accuracy(small), "accuracy", start, size(small))
        since = clock()

        def classifier_stage(name: str) -> None:
            nonlocal since
            measure("classifier", name, accuracy(small), "accuracy", since, size(small))
            since = clock()

        heal(small, copy.deepcopy(classifier), classifier_healing, config=healing, on_stage=classifier_stage)

    print(f"wrote {save()}")
    return 0


def kept_arms(path: Path, running: list[str]) -> dict[str, dict]:
    """The arms of an earlier result at ``path`` that this run does not measure: their command, date, load, healing
    settings and rows, kept in the result file beside this run's arms."""
    record = read(path)
    if record is None:
        return {}
    result = record["result"]
    arms = result.get("arms") or {  # a file of one run: its rows under its command
        arm: {
            "command": record["command"],
            "date": record["machine"]["date"],
            "load_average": record["machine"]["load_average"],
            "healing": "HealConfig(" + ", ".join(f"{k}={v!r}" for k, v in result["healing"].items()) + ")",
            "rows": [r for r in result["rows"] if r["arm"] == arm],
            **({"finetune_curve": result["finetune_curve"]} if arm == "classifier" else {}),
        }
        for arm in dict.fromkeys(r["arm"] for r in result["rows"])
    }
    return {arm: arms[arm] for arm in arms if arm not in running}


def plot(rows: list[list[object]], path: Path) -> None:
    """One line per arm: its quality after each stage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm in dict.fromkeys(row[0] for row in rows):
        mine = [row for row in rows if row[0] == arm]
        ax.plot(range(len(mine)), [float(row[3]) for row in mine], marker="o", label=f"{arm} ({mine[0][4]})")
        for i, row in enumerate(mine):
            ax.annotate(str(row[1]).split(" (")[0], (i, float(row[3])), fontsize=7, rotation=15)
    ax.set_xlabel("stage")
    ax.set_ylabel("quality (cosine to the original / test accuracy)")
    ax.set_title("MiniLM at half its linear parameters, BBC News")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
