"""Parameter-efficient fine-tuning methods side by side on a low-resource classification task: the tables and figure of
docs/adapters.md ("Side by side").

UniPELT's protocol (Mao et al., ACL 2022, arXiv 2110.07577, §4.1): for each training size K and seed, K training and
a development set drawn from the training split; each method trains at every learning rate of its (equally sized)
grid through the one Trainer, the development accuracy picks the rate, and the test accuracy of that run is
reported as mean ± std over seeds, with trainable parameters, train-step time and inference time against the frozen
backbone. A TF-IDF + logistic-regression reference runs on the same subsets. Every run is appended to
``<out>.jsonl`` as it ends, so an interrupted sweep keeps its runs and ``--summarize`` rebuilds the table and figure.
Each run is one ``tensorslim finetune`` run (:func:`tensorslim.cli.finetune.finetune_config`).

Usage:
    python experiments/adapters_protocol.py --adapter dense,lora --train-size 100 --out experiments/results/adapters
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from tensorslim._checks import require_int
from tensorslim.cli.finetune import finetune_config

# One grid of three peak learning rates per method (the same size for all), each family's own range. The middle rate
# is the one the development set chose in every seed of the earlier two-rate grid (its top rate), so the grid
# reaches past it on both sides.
LR_GRIDS = {
    "dense": (5e-5, 2e-4, 8e-4),
    "lora": (1e-3, 5e-3, 2e-2),
    "peft-lora": (1e-3, 5e-3, 2e-2),
    "prefix": (1e-3, 5e-3, 2e-2),
    "adapter": (1e-3, 5e-3, 2e-2),
    "prompt": (1e-2, 5e-2, 2e-1),
    "peft-prompt": (1e-2, 5e-2, 2e-1),
    "unipelt": (1e-3, 5e-3, 2e-2),
    "unipelt-prompt": (1e-3, 5e-3, 2e-2),
}
# Methods with a soft prompt, and so a prompt initialization.
PROMPTED = ("prompt", "peft-prompt", "unipelt-prompt")
# Where their soft prompt starts unless --prompt-init says otherwise (chosen on the development split, see
# docs/adapters.md).
PROMPT_INIT = "random"
METHODS = tuple(LR_GRIDS)
TFIDF = "tfidf-logreg"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="minilm", help="registered pretrained classifier model (default: minilm)")
    parser.add_argument(
        "--adapter",
        default=",".join(METHODS),
        help="comma-separated methods ('unipelt+prompt' = unipelt-prompt; 'dense' = full fine-tuning)",
    )
    parser.add_argument("--data", default="bbcnews-titles", help="classification data set (default: bbcnews-titles)")
    parser.add_argument("--train-size", type=int, nargs="+", default=[100], help="training sizes K (0: all)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per (method, K)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed (to split a sweep over processes)")
    parser.add_argument("--dev-size", type=int, default=100, help="development examples drawn from the training split")
    parser.add_argument("--epochs", type=float, default=5.0, help="passes over the K examples (steps = epochs·K/batch)")
    parser.add_argument("--max-steps", type=int, default=400, help="cap on optimizer steps per run")
    parser.add_argument(
        "--lr-from",
        type=int,
        default=None,
        metavar="K",
        help="at other sizes, run each method only at the rate its development accuracy chose most often at this K "
        "(those runs must be in <out>.jsonl)",
    )
    parser.add_argument(
        "--rates",
        choices=("all", "middle", "below"),
        default="all",
        help="run each method's whole learning-rate grid, only its middle rate (the rate the K=100 sweeps chose "
        "most; to try another --epochs at one rate per method), or only the rate one grid step below its lowest (to "
        "see whether a variant's optimum lies below the grid)",
    )
    parser.add_argument(
        "--prompt-init",
        default=PROMPT_INIT,
        metavar="random|vocab|labels|TEXT",
        help="soft prompt start: 'random' (uniform in ±0.5), 'vocab' (word embeddings of tokens drawn from the 5,000 "
        "most frequent, Lester et al. 2021's sampled vocabulary, arXiv 2104.08691 §3.2), 'labels' (the class names' "
        "word embeddings, like their class-label init) or the word embeddings of TEXT (default: random; see "
        "docs/adapters.md for the development-set comparison)",
    )
    parser.add_argument(
        "--prompt-combine",
        choices=("prefix", "prefix_after_bos"),
        default=None,
        help="where the soft prompt of prompt and unipelt-prompt goes: before the input, or after its first token "
        "([CLS], which the classifier reads) (default: each method's, see docs/adapters.md)",
    )
    parser.add_argument(
        "--prompt-lr-scale",
        type=float,
        default=None,
        metavar="X",
        help="the soft prompt's rate as a multiple of the run's, for prompt and unipelt-prompt (default: each "
        "method's, 10 for unipelt-prompt, see docs/adapters.md)",
    )
    parser.add_argument(
        "--train-pooler",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="train the base model's pooler with the classifier head, for our adapter methods (default: off, see "
        "docs/adapters.md; dense trains it, peft's methods keep it frozen)",
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=16, help="tokens per title ([CLS] included)")
    parser.add_argument("--out", default="runs/finetune/adapters", help="output prefix: .jsonl, .json, .md, .png")
    parser.add_argument("--run-dir", default="runs/finetune", help="folder of the individual Trainer runs")
    parser.add_argument("--summarize", action="store_true", help="only rebuild the table and figure from <out>.jsonl")
    parser.add_argument(
        "--costs",
        default=None,
        metavar="JSON",
        help="take train-step times and inference ratios from this benchmarks/adapters_costs.py result (measured "
        "side by side, deployed forms) instead of the sweep's own",
    )


def _methods(text: str) -> list[str]:
    names = [name.strip().replace("+", "-") for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in METHODS]
    if unknown:
        raise ValueError(f"adapter={unknown[0]!r} is unknown; allowed: {list(METHODS)}")
    return names


# Lester et al. (arXiv 2104.08691, §3.2) sample prompt starts from the 5,000 most common tokens.
VOCAB_INIT_TOKENS = 5000


def prompt_init_options(choice: str, label_names: list[str]) -> dict[str, Any]:
    """The method options a soft prompt starts from for ``--prompt-init choice``: nothing (uniform random) for
    ``random``, tokens sampled from the 5,000 most frequent for ``vocab``, the class names joined by spaces for
    ``labels``, else the text ``choice``.

    Raises:
        ValueError: ``choice`` is blank.
    """
    if not choice.strip():
        raise ValueError(f"prompt_init={choice!r} is invalid; allowed: 'random', 'vocab', 'labels' or a non-empty text")
    if choice == "random":
        return {}
    if choice == "vocab":
        return {"prompt_init_vocab": VOCAB_INIT_TOKENS}
    return {"prompt_init_text": " ".join(label_names) if choice == "labels" else choice}


def _check_sizes(args: argparse.Namespace) -> None:
    """One line for a size that cannot make a sweep (``--batch-size 0`` divided by zero deep in :func:`_steps`)."""
    for flag in ("seeds", "dev_size", "max_steps", "batch_size"):
        require_int(f"--{flag.replace('_', '-')}", getattr(args, flag))
    require_int("--first-seed", args.first_seed, minimum=0)
    require_int("--seq-len", args.seq_len, minimum=2)  # [CLS] and at least one token
    for k in args.train_size:
        require_int("--train-size", k, minimum=0)
    if not math.isfinite(args.epochs) or args.epochs <= 0:
        raise ValueError(f"--epochs={args.epochs!r} is invalid; allowed: a finite number > 0")


def run(args: argparse.Namespace) -> int:
    _check_sizes(args)
    methods = _methods(args.adapter)
    if prompt_init_options(args.prompt_init, []).get("prompt_init_vocab") and "peft-prompt" in methods:
        raise ValueError(
            "--prompt-init vocab: peft's SAMPLE_VOCAB draws from the whole vocabulary; allowed: drop peft-prompt"
        )
    if args.prompt_combine not in (None, "prefix") and "peft-prompt" in methods:
        raise ValueError("--prompt-combine: peft puts its prompt before the input; allowed: drop peft-prompt")
    _scale_of(args, "unipelt-prompt")  # so does a bad --prompt-lr-scale
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    raw = out.with_suffix(".jsonl")
    if not args.summarize:
        done = {_key(r) for r in _read(raw)}
        command = "python experiments/adapters_protocol.py " + " ".join(_argv(args))
        for k in args.train_size:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                if _key({"method": TFIDF, "k": k, "seed": seed, "lr": 0.0}) not in done:
                    _append(raw, {**_tfidf(args, k, seed), "command": command})
                for method in methods:
                    grid = _grid(args, method, k, _read(raw))
                    for lr in grid:
                        planned = {"method": method, "k": k, "seed": seed, "lr": lr, "steps": _steps(args, k)}
                        planned |= _settings(args, method)
                        if _key(planned) not in done:
                            record = _one_run(args, method, k, seed, lr)
                            _append(raw, {**record, "grid": list(grid), "command": command})
    summary = summarize(_read(raw))
    if args.costs:
        use_costs(summary, json.loads(Path(args.costs).read_text()))
    write_summary(summary, out)
    print(out.with_suffix(".md").read_text())
    return 0


def _argv(args: argparse.Namespace) -> list[str]:
    sizes = " ".join(str(k) for k in args.train_size)
    reuse = [] if args.lr_from is None else [f"--lr-from {args.lr_from}"]
    reuse += [] if args.rates == "all" else [f"--rates {args.rates}"]
    return [
        f"--model {args.model} --adapter {args.adapter} --data {args.data} --train-size {sizes}",
        f"--seeds {args.seeds} --first-seed {args.first_seed}",
        f"--dev-size {args.dev_size} --epochs {args.epochs:g} --max-steps {args.max_steps}",
        *reuse,
        f"--prompt-init {shlex.quote(args.prompt_init)}",
        *([] if args.prompt_combine is None else [f"--prompt-combine {args.prompt_combine}"]),
        *([] if args.prompt_lr_scale is None else [f"--prompt-lr-scale {args.prompt_lr_scale:g}"]),
        *(["--train-pooler"] if args.train_pooler else []),
        f"--batch-size {args.batch_size} --seq-len {args.seq_len} --out {args.out}",
    ]


def _grid(args: argparse.Namespace, method: str, k: int, records: list[dict[str, Any]]) -> tuple[float, ...]:
    """The learning rates ``method`` runs at size ``k``: its grid, or with ``--lr-from K0`` (and ``k ≠ K0``) the one
    rate chosen by development accuracy at ``K0``."""
    if args.rates == "middle":
        return (LR_GRIDS[method][len(LR_GRIDS[method]) // 2],)
    if args.rates == "below":
        low, next_up = LR_GRIDS[method][:2]
        return (float(f"{low * low / next_up:.3g}"),)  # the grid's lowest ratio, one step further down
    if args.lr_from is None or k == args.lr_from:
        return LR_GRIDS[method]
    name = variant({"method": method, **_settings(args, method)})
    return (chosen_lr(records, name, args.lr_from),)


def chosen_lr(records: list[dict[str, Any]], name: str, k: int) -> float:
    """The rate that won on the development set in most seeds of the method :func:`variant` ``name`` at size ``k``;
    a tie goes to the rate with the higher mean development accuracy.

    Raises:
        ValueError: no complete grid of ``name`` at ``k`` among ``records``.
    """
    mine = [r for r in records if variant(r) == name and r["k"] == k]
    best = best_runs(mine)
    if not best:
        raise ValueError(f"lr_from={k}: no complete {name} grid at K={k} in the runs file; run that size first")
    wins: dict[float, list[float]] = {}
    for r in best.values():
        wins.setdefault(r["lr"], []).append(r["_dev"])
    mean_dev = {lr: statistics.fmean(r["dev_accuracy"] for r in mine if r["lr"] == lr) for lr in wins}
    return max(wins, key=lambda lr: (len(wins[lr]), mean_dev[lr]))


def _key(record: dict[str, Any]) -> tuple:
    init, steps, combine = record.get("prompt_init"), record.get("steps"), _combine(record)
    key = record["method"], record["k"], record["seed"], record["lr"], init, _scale(record), steps, combine
    return (*key, _pooler(record))


def _combine(record: dict[str, Any]) -> str | None:
    """Where a run's soft prompt went (runs from before ``--prompt-combine`` put it before the input), else None."""
    return record.get("prompt_combine", "prefix") if record["method"] in PROMPTED else None


def _pooler(record: dict[str, Any]) -> bool | None:
    """Whether a run of one of our adapter methods trained the pooler (runs from before ``--train-pooler`` did not),
    else None (dense trains it, peft's methods do not: neither has a choice)."""
    from tensorslim.methods.adapters import MODULES

    return record.get("train_pooler", False) if record["method"] in MODULES else None


def _steps(args: argparse.Namespace, k: int) -> int:
    """Optimizer steps of a run at size ``k``: ``--epochs`` passes over the K examples, at most ``--max-steps``."""
    pool = k or 1_500  # "all": about the training split minus the development set
    return min(args.max_steps, max(1, math.ceil(args.epochs * pool / args.batch_size)))


def _scale(record: dict[str, Any]) -> float | None:
    """The prompt's learning-rate multiple of a run of ``prompt`` or ``unipelt-prompt`` (runs from before the option
    trained the prompt at the run's rate, ×1), else None."""
    from tensorslim.methods.adapters import PROMPT_LR_SCALE

    return record.get("prompt_lr_scale", 1.0) if record["method"] in PROMPT_LR_SCALE else None


def variant(record: dict[str, Any]) -> str:
    """The table row of a run: its method, then ``(prompt lr ×s)`` when it trained its prompt at a multiple ``s``
    other than the method's default (such as the ×1 of the runs from before ``--prompt-lr-scale``) and ``(init X)``
    when its prompt started from another ``--prompt-init`` than the default, ``(after [CLS])`` or ``(before [CLS])``
    when it went elsewhere than ``--prompt-combine``'s default, ``(pooler trained)`` when it trained the pooler
    (``--train-pooler``)."""
    from tensorslim.methods.adapters import DEFAULT_PROMPT_COMBINE, PROMPT_LR_SCALE

    name, scale = record["method"], _scale(record)
    if scale is not None and scale != PROMPT_LR_SCALE[record["method"]]:
        name += f" (prompt lr ×{scale:g})"
    init = record.get("prompt_init")  # runs from before --prompt-init started at random
    if name.split(" ")[0] in PROMPTED and (init or "random") != PROMPT_INIT:
        name += f" (init {init})"
    combine = _combine(record)
    if combine is not None and combine != DEFAULT_PROMPT_COMBINE.get(record["method"], "prefix"):
        name += " (after [CLS])" if combine == "prefix_after_bos" else " (before [CLS])"
    if _pooler(record):
        name += " (pooler trained)"
    return name


def _settings(args: argparse.Namespace, method: str) -> dict[str, Any]:
    """The settings of a run of ``method`` that name its table row (:func:`variant`) and tell it apart in the runs
    file (:func:`_key`): the prompt's start, rate multiple and placement, and whether the pooler trains; None where
    the method has no such choice."""
    return {
        "prompt_init": _init_of(args, method),
        "prompt_lr_scale": _scale_of(args, method),
        "prompt_combine": _combine_of(args, method),
        "train_pooler": _pooler_of(args, method),
    }


def _scale_of(args: argparse.Namespace, method: str) -> float | None:
    """The prompt's learning-rate multiple ``method`` runs at (``--prompt-lr-scale`` or its default), else None."""
    from tensorslim.methods.adapters import PROMPT_LR_SCALE, PELTOptions, prompt_lr_scale

    if method not in PROMPT_LR_SCALE:
        return None
    return prompt_lr_scale(method, PELTOptions(prompt_lr_scale=args.prompt_lr_scale))


def _combine_of(args: argparse.Namespace, method: str) -> str | None:
    """Where the soft prompt of ``method`` goes (``--prompt-combine`` or the method's default; peft's always before
    the input), else None."""
    from tensorslim.methods.adapters import DEFAULT_PROMPT_COMBINE, PELTOptions, prompt_combine

    if method not in DEFAULT_PROMPT_COMBINE:
        return "prefix" if method in PROMPTED else None
    return prompt_combine(method, PELTOptions(prompt_combine=args.prompt_combine))


def _pooler_of(args: argparse.Namespace, method: str) -> bool | None:
    """Whether ``method``, one of our adapter methods, trains the pooler (``--train-pooler``), else None."""
    from tensorslim.methods.adapters import MODULES

    return args.train_pooler if method in MODULES else None


def _init_of(args: argparse.Namespace, method: str) -> str | None:
    """``--prompt-init`` for a method with a soft prompt (runs before it existed started at random), else None."""
    return args.prompt_init if method in PROMPTED else None


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _append(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
    print(
        f"{record['method']:<15} K={record['k']:<5} seed={record['seed']} lr={record['lr']:<7g} "
        f"dev={record['dev_accuracy']:.3f} test={record['test_accuracy']:.3f}",
        flush=True,
    )


def _one_run(args: argparse.Namespace, method: str, k: int, seed: int, lr: float) -> dict[str, Any]:
    """One Trainer run; the test accuracy, the trainable parameters and the step and inference times."""
    from tensorslim.layers.adapters import trainable_parameters
    from tensorslim.tasks.classify import labelled_dataset
    from tensorslim.train.trainer import Trainer

    steps = _steps(args, k)
    settings = {name: value for name, value in _settings(args, method).items() if value is not None}
    init = settings.get("prompt_init")
    options = {} if init is None else prompt_init_options(init, labelled_dataset(args.data)[2])
    options |= {name: settings[name] for name in ("prompt_lr_scale", "train_pooler") if name in settings}
    if "prompt_combine" in settings and method != "peft-prompt":  # peft-prompt takes only its own order
        options["prompt_combine"] = settings["prompt_combine"]
    config = finetune_config(
        model=args.model,
        method=method,
        data=args.data,
        train_size=k,
        dev_size=args.dev_size,
        steps=steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        lr=lr,
        seed=seed,
        options=options or None,
        out_dir=str(Path(args.run_dir) / f"{method}-k{k}-s{seed}-lr{lr:g}"),
        overwrite=True,  # an interrupted sweep reruns its unfinished run; its records live in <out>.jsonl
    )
    trainer = Trainer(config)
    result = trainer.run()
    for heavy in ("checkpoints", "model"):  # ~90 MB each a run; the sweep keeps its records in <out>.jsonl
        shutil.rmtree(Path(config.out_dir) / heavy, ignore_errors=True)
    counts = trainable_parameters(trainer.model)
    record = {
        "method": method,
        "k": k,
        "seed": seed,
        "lr": lr,
        "steps": steps,
        "dev_accuracy": result.val_metrics["val_accuracy"],
        "test_accuracy": result.val_metrics["val_test_accuracy"],
        "trainable": counts["trainable"],
        "step_s": args.batch_size * args.seq_len / result.tokens_per_s,
        **settings,
    }
    if seed == 0 and lr == LR_GRIDS[method][0]:
        record["inference_ratio"] = _inference_ratio(trainer, args)
    return record


def _inference_ratio(trainer: Any, args: argparse.Namespace) -> float:
    """Forward time of the trained model over that of its frozen backbone on the same 64 test titles, the two
    timed alternately (median of 5 each) in this process."""
    import torch

    from tensorslim.methods import build_for_method
    from tensorslim.tasks.classify import split_rows

    _, pad_id, *test = trainer.data.validation
    ids, mask, _ = split_rows(test[0][:64], pad_id=pad_id)
    base, _, _ = build_for_method(args.model, "dense", task="classify", **trainer.data.model_overrides)
    models = {"adapted": trainer.model.eval(), "base": base.eval()}
    times: dict[str, list[float]] = {name: [] for name in models}
    with torch.no_grad():
        for _ in range(6):
            for name, model in models.items():
                start = time.perf_counter()
                model(ids, attention_mask=mask)
                times[name].append(time.perf_counter() - start)
    return statistics.median(times["adapted"][1:]) / statistics.median(times["base"][1:])


def _tfidf(args: argparse.Namespace, k: int, seed: int) -> dict[str, Any]:
    """TF-IDF (word 1-2 grams) + logistic regression on the same K titles (the development set is not used)."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    from tensorslim.data import bbcnews_titles, low_resource_split

    texts, labels, _, train_idx, test_idx = bbcnews_titles()
    train_idx, _ = low_resource_split(train_idx, train_size=k, dev_size=args.dev_size, seed=seed)
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)
    features = vectorizer.fit_transform([texts[i] for i in train_idx])
    classifier = LogisticRegression(max_iter=2000, C=10.0).fit(features, [labels[i] for i in train_idx])
    predicted = classifier.predict(vectorizer.transform([texts[i] for i in test_idx]))
    accuracy = sum(int(p == labels[i]) for p, i in zip(predicted, test_idx, strict=True)) / len(test_idx)
    return {"method": TFIDF, "k": k, "seed": seed, "lr": 0.0, "dev_accuracy": math.nan, "test_accuracy": accuracy}


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (method, K): the test accuracy of the best-on-dev learning rate, mean ± std over seeds, and the costs.
    A (method, K, seed) whose grid is not complete (an interrupted sweep) is left out."""
    best = best_runs(records)
    rows: dict[tuple, list[float]] = {}
    for (method, k, _), r in sorted(best.items()):
        rows.setdefault((method, k), []).append(100 * r["test_accuracy"])
    costs = _costs(records)
    table = [
        {
            "method": method,
            "k": k,
            "seeds": len(scores),
            "mean": statistics.fmean(scores),
            "std": statistics.stdev(scores) if len(scores) > 1 else 0.0,
            **costs.get(method, {}),
        }
        for (method, k), scores in rows.items()
    ]
    commands = sorted({r.get("command", "") for r in records} - {""})
    return {"table": table, "commands": commands}


def use_costs(summary: dict[str, Any], measured: dict[str, Any]) -> None:
    """Put the inference ratios (``table``: method → ratio) and train-step seconds (``step_seconds``) of an
    ``adapters_costs.py`` result into the summary's rows, and its command beside the sweep's."""
    figures = measured.get("result", measured)  # the shared result writer's record holds them under "result"
    for row in summary["table"]:
        method = row["method"].split(" (")[0]  # a variant's costs are its method's (a learning rate costs nothing)
        if method in figures["table"]:
            row["inference_ratio"] = figures["table"][method]
        if method in figures.get("step_seconds", {}):
            row["step_s"] = figures["step_seconds"][method]
    summary["commands"] = [*summary["commands"], measured["command"]]


def best_runs(records: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    """Per (:func:`variant`, K, seed) whose grid is complete (the rates in its ``grid`` field, else ``LR_GRIDS``):
    the run with the best development accuracy, its dev accuracy as ``_dev``."""
    grids: dict[tuple, set[float]] = {}
    wanted: dict[tuple, set[float]] = {}
    for r in records:
        key = (variant(r), r["k"], r["seed"])
        grids.setdefault(key, set()).add(r["lr"])
        wanted[key] = set(r.get("grid", LR_GRIDS.get(r["method"], ())))
    complete = {key for key, lrs in grids.items() if key[0] == TFIDF or lrs >= wanted[key]}
    best: dict[tuple, dict[str, Any]] = {}
    for r in (r for r in records if (variant(r), r["k"], r["seed"]) in complete):
        key = (variant(r), r["k"], r["seed"])
        dev = r["dev_accuracy"] if r["dev_accuracy"] == r["dev_accuracy"] else 0.0  # NaN (TF-IDF): no choice
        if key not in best or dev > best[key]["_dev"]:
            best[key] = {**r, "_dev": dev}
    return best


def _costs(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Trainable parameters, median train-step seconds and the inference ratio per :func:`variant`."""
    out: dict[str, dict[str, float]] = {}
    for method in {variant(r) for r in records if "step_s" in r}:
        mine = [r for r in records if variant(r) == method]
        ratios = [r["inference_ratio"] for r in mine if "inference_ratio" in r]
        out[method] = {
            "trainable": mine[0]["trainable"],
            "step_s": statistics.median(r["step_s"] for r in mine),
            "inference_ratio": statistics.median(ratios) if ratios else math.nan,
        }
    return out


def write_summary(summary: dict[str, Any], out: Path) -> None:
    """``<out>.json``, ``<out>.md`` (a table) and ``<out>.png`` (accuracy bars, step and inference costs)."""
    out.with_suffix(".json").write_text(json.dumps(summary, indent=2) + "\n")
    table = summary["table"]
    sizes = sorted({row["k"] for row in table}, key=lambda k: (k == 0, k))  # 0 ("all") last
    methods = list(dict.fromkeys(row["method"] for row in table))
    lora_step = next((row["step_s"] for row in table if row["method"] == "lora" and "step_s" in row), math.nan)
    lines = [
        "| method | "
        + " | ".join(f"K={k or 'all'}" for k in sizes)
        + " | trainable | step / LoRA | inference / frozen |",
        "|---|" + "---|" * (len(sizes) + 3),
    ]
    for method in methods:
        mine = {row["k"]: row for row in table if row["method"] == method}
        cells = [
            f"{mine[k]['mean']:.1f} ± {mine[k]['std']:.1f} ({mine[k]['seeds']})" if k in mine else "" for k in sizes
        ]
        first = next(iter(mine.values()))
        costs = (
            [f"{first['trainable']:,}", _times(first["step_s"] / lora_step), _times(first["inference_ratio"])]
            if "step_s" in first
            else ["", "", ""]
        )
        lines.append(f"| {method} | " + " | ".join(cells + costs) + " |")
    commands = "\n".join(summary["commands"])
    text = "\n".join(lines)
    out.with_suffix(".md").write_text(f"```\n{commands}\n```\n\n{text}\n")
    _plot(table, sizes, methods, out.with_suffix(".png"))


def _times(ratio: float) -> str:
    """A cost ratio as a table cell: ``1.25×``, or ``—`` when it was not measured (no LoRA row, no inference run)."""
    return f"{ratio:.2f}×" if math.isfinite(ratio) else "—"


def _plot(table: list[dict[str, Any]], sizes: list[int], methods: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / max(1, len(sizes))
    for j, k in enumerate(sizes):
        rows = {row["method"]: row for row in table if row["k"] == k}
        xs = [i + j * width for i, m in enumerate(methods) if m in rows]
        axes[0].bar(
            xs,
            [rows[m]["mean"] for m in methods if m in rows],
            width,
            yerr=[rows[m]["std"] for m in methods if m in rows],
            label=f"K={k or 'all'}",
            capsize=2,
        )
    axes[0].set_xticks(range(len(methods)), methods, rotation=40, ha="right")
    axes[0].set_ylabel("test accuracy (%), mean ± std over seeds")
    axes[0].legend()
    costs = {row["method"]: row for row in table if "step_s" in row}
    names = [m for m in methods if m in costs]
    lora = costs.get("lora", {}).get("step_s", math.nan)
    axes[1].bar(
        [i - 0.2 for i in range(len(names))], [costs[m]["step_s"] / lora for m in names], 0.4, label="step / LoRA"
    )
    axes[1].bar(
        [i + 0.2 for i in range(len(names))],
        [costs[m]["inference_ratio"] for m in names],
        0.4,
        label="inference / frozen",
    )
    axes[1].set_xticks(range(len(names)), names, rotation=40, ha="right")
    axes[1].set_ylabel("time ratio (shared, noisy 2-core CPU)")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Run (or, with ``--summarize``, only summarize) the sweep; a bad flag is one line on stderr and exit code 2."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ValueError as error:
        print(f"adapters_protocol.py: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
