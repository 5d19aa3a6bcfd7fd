"""CoMERA's experiment reproduced at small scale on CPU (issue 3, item 6).

Parts (each can run alone):

* ``books``: parameters of the ``bert6`` classifier dense vs CoMERA-tensorized (paper shapes, vocabulary 30,522).
* ``profile``: step time and peak training memory at batch 1 of ``bert6`` masked-LM training: dense (AdamW),
  dense + GaLore (``galore-torch``, rank 128, gap 200, scale 0.25) and CoMERA (TT r=30, TTM r=32, gates, early loss).
* ``mlm``: masked-LM on the built-in code corpus (``stdlib``): dense, dense + GaLore and CoMERA two-stage training
  with target ratios, validation MLM loss, size and per-layer ranks after each stage (``--cuda-graphs``: every step
  captured in a CUDA graph, GPU only).
* ``classify``: the labelled BBC News articles (5 topics, fixed split), trained from scratch: dense vs CoMERA test
  accuracy (CoMERA's MNLI experiment also trains the six-encoder classifier from scratch), optionally with two-stage
  CoMERA runs at target ratios (``--classify-ratios``); mean pooling by default (``--pooling cls`` is CoMERA's).

Peak memory on CPU = parameters + gradients + optimizer state + activations saved for backward
(:mod:`tensorslim.bench.memory`). Usage: ``python -m tensorslim.comera_experiment --parts books,profile``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.bench.memory import count_saved_tensors, training_memory
from tensorslim.comera import CoMERAConfig, CoMERAObjective, build_optimizer
from tensorslim.comera.gates import format_rank_report, layer_size, tt_layers
from tensorslim.comera.loop import train_two_stage
from tensorslim.models.bert import (
    BERT_PRESETS,
    POOLINGS,
    BertForMaskedLM,
    BertForSequenceClassification,
    comera_,
    get_bert_preset,
)
from tensorslim.train.cuda_graph import GraphedStep

MASK_FRACTION = 0.15  # BERT: 15 % of tokens, 80 % [MASK] / 10 % random / 10 % kept
PAPER_VOCAB = 30522


def padded_vocab(n: int, *, multiple: int = 64) -> int:
    """``n`` rounded up to a multiple, so the TT decoder's output rows factor into balanced modes (30,522 → 30,720 =
    30·32·32 with ``multiple=1024``; 4,097 → 4,160 = 13·16·20). Ids stay below ``n``; the padding logits are never
    targets."""
    return -(-n // multiple) * multiple


def mask_tokens(ids: torch.Tensor, *, mask_id: int, vocab: int, generator: torch.Generator):
    """BERT masking; returns ``(inputs, labels)`` with label -100 where no prediction is made."""
    chosen = torch.rand(ids.shape, generator=generator) < MASK_FRACTION
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    roll = torch.rand(ids.shape, generator=generator)
    inputs = ids.clone()
    inputs[chosen & (roll < 0.8)] = mask_id
    random_ids = torch.randint(vocab, ids.shape, generator=generator)
    swap = chosen & (roll >= 0.8) & (roll < 0.9)
    inputs[swap] = random_ids[swap]
    return inputs, labels


def mlm_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, labels = batch
    logits = model(inputs)  # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


def build(
    preset: str, method: str, *, vocab_size: int, head: str = "mlm", n_classes: int = 3, pooling: str = "cls"
) -> nn.Module:
    """A ``preset`` model for ``method`` in {dense, galore, comera}; CoMERA gets rank gates."""
    config = get_bert_preset(preset)
    config = type(config)(**{**config.__dict__, "vocab_size": vocab_size, "n_classes": n_classes, "pooling": pooling})
    model = BertForMaskedLM(config) if head == "mlm" else BertForSequenceClassification(config)
    if method == "comera":
        comera_(model, rank_gates=True)
    return model


def optimizer_for(
    model: nn.Module, method: str, *, lr: float, lr_cores: float, lr_gates: float, capturable: bool = False
) -> torch.optim.Optimizer:
    """AdamW for ``dense`` and CoMERA's three groups for ``comera`` (``capturable`` for CUDA graphs), or GaLore."""
    if capturable and method == "galore":
        raise ValueError("method='galore' cannot run in a CUDA graph (its projector SVDs run on the host side)")
    if method == "comera":
        optimizer = build_optimizer(model, lr_cores=lr_cores, lr_gates=lr_gates, lr_other=lr)
        for group in optimizer.param_groups:  # safe before the first step: no state exists yet
            group["capturable"] = capturable
        return optimizer
    if method == "galore":
        from galore_torch import GaLoreAdamW

        projected = [p for n, p in model.named_parameters() if n.startswith("encoder.layers.") and p.ndim == 2]
        ids = {id(p) for p in projected}
        rest = [p for p in model.parameters() if id(p) not in ids]
        groups = [
            {"params": rest},
            {"params": projected, "rank": 128, "update_proj_gap": 200, "scale": 0.25, "proj_type": "std"},
        ]
        return GaLoreAdamW(groups, lr=lr, weight_decay=0.0)
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, capturable=capturable)


# ----------------------------------------------------------------------------------------------------------- books


def books() -> dict:
    """Parameter counts of the paper's model (meta device: costs nothing)."""
    config = BERT_PRESETS["bert6"]
    with torch.device("meta"):
        dense = BertForSequenceClassification(config)
        tensorized = BertForSequenceClassification(config)
    dense_params = sum(p.numel() for p in dense.parameters())
    comera_(tensorized, rank_gates=False)
    plain = sum(p.numel() for p in tensorized.parameters())
    with torch.device("meta"):
        gated = BertForSequenceClassification(config)
    comera_(gated, rank_gates=True)
    return {
        "dense_params": dense_params,
        "comera_params": plain,
        "comera_params_with_gates": sum(p.numel() for p in gated.parameters()),
        "compression": dense_params / plain,
        # Gate values do not exist on meta; at init every gate is 1, so the active ranks are the core ranks.
        "tensorized_size": sum(layer_size(layer, layer.ranks) for _, layer in tt_layers(gated)),
    }


# --------------------------------------------------------------------------------------------------------- profile


def profile(*, preset: str, batch: int, seq: int, repeats: int, warmup: int, vocab: int) -> dict:
    """Alternating step timing and memory of dense / dense+GaLore / CoMERA masked-LM training."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(PAPER_VOCAB, (batch, seq), generator=gen)
    data = mask_tokens(ids, mask_id=PAPER_VOCAB, vocab=PAPER_VOCAB, generator=gen)
    arms = {}
    for method in ("dense", "galore", "comera"):
        torch.manual_seed(0)
        model = build(preset, method, vocab_size=vocab)
        arms[method] = {
            "model": model,
            "optimizer": optimizer_for(model, method, lr=1e-4, lr_cores=1e-4, lr_gates=1e-3),
            "objective": CoMERAObjective(CoMERAConfig()) if method == "comera" else None,
            "times": [],
            "saved": 0,
        }
    for round_index in range(warmup + repeats):
        for arm in arms.values():
            model, optimizer = arm["model"], arm["optimizer"]
            start = time.perf_counter()
            with count_saved_tensors(model) as tally:
                loss = mlm_loss(model, data)
                if arm["objective"] is not None:
                    loss, _ = arm["objective"].early(loss, model)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if round_index >= warmup:
                arm["times"].append(time.perf_counter() - start)
            arm["saved"] = max(arm["saved"], tally.bytes)
    rows = {}
    for method, arm in arms.items():
        memory = training_memory(arm["model"], arm["optimizer"], arm["saved"])
        rows[method] = {
            "params": sum(p.numel() for p in arm["model"].parameters()),
            "step_time_s": statistics.median(arm["times"]),
            "step_times_s": arm["times"],
            "memory_bytes": {**memory.__dict__, "total": memory.total},
        }
    for method in rows:
        rows[method]["speedup_vs_dense"] = rows["dense"]["step_time_s"] / rows[method]["step_time_s"]
        rows[method]["memory_vs_galore"] = (
            rows["galore"]["memory_bytes"]["total"] / rows[method]["memory_bytes"]["total"]
        )
    return {"preset": preset, "batch": batch, "seq": seq, "vocab": vocab, "repeats": repeats, "rows": rows}


# ------------------------------------------------------------------------------------------------------------- mlm


def _mlm_batches(blocks: torch.Tensor, *, batch: int, mask_id: int, vocab: int, seed: int) -> Iterator:
    gen = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(blocks), generator=gen)
        for start in range(0, len(order) - batch + 1, batch):
            yield mask_tokens(blocks[order[start : start + batch]], mask_id=mask_id, vocab=vocab, generator=gen)


@torch.no_grad()
def _mlm_eval(model: nn.Module, batches: list) -> float:
    model.eval()
    total, count = 0.0, 0
    device = next(model.parameters()).device
    for inputs, labels in batches:
        logits = model(inputs.to(device))
        labels = labels.to(device)
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum").item()
        count += int((labels != -100).sum())
    model.train()
    return total / count


def mlm(
    *,
    preset: str,
    methods: list[str],
    steps: int,
    late_fraction: float,
    ratios: list[float],
    batch: int,
    seq: int,
    lr: float,
    lr_cores: float,
    lr_gates: float,
    gamma: float,
    stop_at_target: bool = True,
    target_loss: float | None = None,
    cuda_graphs: bool = False,
) -> dict:
    """Dense, dense + GaLore and CoMERA (one run per target ratio) masked-LM on ``stdlib``; same data order and masks.

    ``L*`` of the CoMERA late stage is ``target_loss`` or, when None, the dense run's final training loss (so
    ``methods`` must then list ``dense`` first). ``cuda_graphs`` trains on the GPU with every step captured
    (:class:`tensorslim.train.cuda_graph.GraphedStep`; GaLore cannot be captured)."""
    from tensorslim.data import build_lm_data

    data = build_lm_data("stdlib", tokenizer=None, vocab_size=4096, seq_len=seq, max_val_blocks=32)
    vocab = data.tokenizer.vocab_size
    mask_id = vocab  # one extra row for [MASK]
    gen = torch.Generator().manual_seed(1234)
    val = [
        mask_tokens(data.validation[i : i + batch], mask_id=mask_id, vocab=vocab, generator=gen)
        for i in range(0, len(data.validation), batch)
    ]
    results: dict = {"tokenizer": data.tokenizer.name, "vocab": padded_vocab(vocab + 1), "runs": {}}
    late = round(steps * late_fraction)
    runs = [(method, None) for method in methods if method != "comera"]
    if "comera" in methods:
        runs += [("comera", ratio) for ratio in ratios]
    for method, ratio in runs:
        torch.manual_seed(0)
        model = build(preset, method, vocab_size=padded_vocab(vocab + 1)).to("cuda" if cuda_graphs else "cpu")
        optimizer = optimizer_for(model, method, lr=lr, lr_cores=lr_cores, lr_gates=lr_gates, capturable=cuda_graphs)
        batches = _mlm_batches(data.train, batch=batch, mask_id=mask_id, vocab=vocab, seed=0)
        start = time.perf_counter()
        run: dict = {"params_start": sum(p.numel() for p in model.parameters())}
        if method != "comera":
            losses = _train_plain(model, optimizer, batches, mlm_loss, steps=steps, cuda_graphs=cuda_graphs)
        else:
            star = target_loss if target_loss is not None else _target_loss(results)
            config = CoMERAConfig(gamma=gamma, target_ratio=ratio, target_loss=star)
            log = train_two_stage(
                model,
                batches,
                mlm_loss,
                optimizer=optimizer,
                early_steps=steps - late,
                late_steps=late,
                config=config,
                enforce_target=True,
                stop_at_target=stop_at_target,
                truncate_every=50,
                cuda_graphs=cuda_graphs,
                log_every=50 if cuda_graphs else 1,  # one host sync per 50 captured steps
            )
            losses = log.losses
            run.update(
                size_start=log.size_start,
                size_after_early=log.size_after_early,
                target_size=log.target_size,
                size_after_late=log.size_after_late,
                size_over_target=log.size_after_late / log.target_size,
                gates_killed_to_reach_target=log.pruned_to_target,
                late_steps_on_size_objective=int(sum(log.lambdas[steps - late :])),
                ranks_after_early=format_rank_report(log.ranks_after_early),
                ranks_after_late=format_rank_report(log.ranks_after_late),
            )
        run.update(
            train_seconds=time.perf_counter() - start,
            step_seconds=(time.perf_counter() - start) / steps,
            final_train_loss=statistics.mean(losses[-20:]),
            val_mlm_loss=_mlm_eval(model, val),
            params_end=sum(p.numel() for p in model.parameters()),
        )
        results["runs"][method if ratio is None else f"comera_ratio_{ratio}"] = run
    return results


def _train_plain(
    model: nn.Module, optimizer, batches: Iterator, loss_fn, *, steps: int, cuda_graphs: bool = False
) -> list[float]:
    """``steps`` steps of a model without rank gates: the static-shape step, replayed from a CUDA graph if asked."""

    def loss_and_info(module: nn.Module, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = loss_fn(module, batch)
        return loss, {"task": loss.detach()}

    step = GraphedStep(model, optimizer, loss_and_info, capture=cuda_graphs, warmup=3 if cuda_graphs else 0)
    kept = [step(next(batches))["task"].clone() for _ in range(steps)]  # the step overwrites its outputs
    return torch.stack(kept).tolist()  # one host sync


def _target_loss(results: dict) -> float:
    """``L*`` for the late stage: the dense run's final training loss (CoMERA hard-codes 0.8 for MNLI)."""
    if "dense" not in results["runs"]:
        raise ValueError(
            "the CoMERA late stage needs L*: give --target-loss or run dense first (--mlm-methods, --classify-methods)"
        )
    return results["runs"]["dense"]["final_train_loss"]


# -------------------------------------------------------------------------------------------------------- classify


def _classification_data(seq: int):
    from tensorslim.data import bbcnews_labelled, bbcnews_split, load_corpus, load_tokenizer

    texts, labels, names = bbcnews_labelled()
    train_idx, test_idx = bbcnews_split()
    tokenizer = load_tokenizer(None, load_corpus("bbcnews"), vocab_size=4096)
    vocab = tokenizer.vocab_size
    cls_id, pad_id = vocab, vocab + 1
    encoded = tokenizer.encode_batch(texts)
    ids = torch.full((len(texts), seq), pad_id, dtype=torch.long)
    for i, tokens in enumerate(encoded):
        row = [cls_id, *tokens[: seq - 1]]
        ids[i, : len(row)] = torch.tensor(row)
    mask = ids != pad_id
    y = torch.tensor(labels)
    split = {"train": torch.tensor(train_idx), "test": torch.tensor(test_idx)}
    return ids, mask, y, split, vocab + 2, names


def _classify_batches(
    ids: torch.Tensor, mask: torch.Tensor, y: torch.Tensor, train: torch.Tensor, *, batch: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Random training batches ``(ids, mask, labels)``, the same sequence for every run."""
    gen = torch.Generator().manual_seed(0)
    while True:
        pick = train[torch.randint(len(train), (batch,), generator=gen)]
        yield ids[pick], mask[pick], y[pick]


def classify_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    ids, mask, labels = batch
    return F.cross_entropy(model(ids, attention_mask=mask), labels)


def classify(
    *,
    preset: str,
    methods: list[str],
    pooling: str,
    steps: int,
    batch: int,
    seq: int,
    lr: float,
    lr_cores: float,
    lr_gates: float,
    ratios: Sequence[float] = (),
    late_fraction: float = 0.5,
    gamma: float = 0.01,
    target_loss: float | None = None,
) -> dict:
    """Dense vs CoMERA from scratch on BBC News; test accuracy on the fixed split.

    ``comera`` trains the early-stage loss for all steps (as the official trainer does without CUDA graphs); each
    of ``ratios`` adds a two-stage run with that target size (CoMERA's MNLI table: targets 0.8 / 0.5 / 0.2), whose
    ``L*`` is ``target_loss`` or the dense run's final training loss. Gates freeze once the target is reached.
    """
    ids, mask, y, split, vocab, names = _classification_data(seq)
    out: dict = {"classes": names, "train": len(split["train"]), "test": len(split["test"]), "pooling": pooling}
    out["runs"] = {}
    runs = [(method, None) for method in methods]
    if "comera" in methods:
        runs += [("comera", ratio) for ratio in ratios]
    for method, ratio in runs:
        torch.manual_seed(0)
        model = build(preset, method, vocab_size=vocab, head="classify", n_classes=len(names), pooling=pooling)
        optimizer = optimizer_for(model, method, lr=lr, lr_cores=lr_cores, lr_gates=lr_gates)
        batches = _classify_batches(ids, mask, y, split["train"], batch=batch)
        params_start = sum(p.numel() for p in model.parameters())
        start = time.perf_counter()
        run: dict = {}
        if method != "comera":
            losses = _train_plain(model, optimizer, batches, classify_loss, steps=steps)
        else:
            late = 0 if ratio is None else round(steps * late_fraction)
            config = CoMERAConfig(gamma=gamma)  # early stage only
            if ratio is not None:
                star = target_loss if target_loss is not None else _target_loss(out)
                config = CoMERAConfig(gamma=gamma, target_ratio=ratio, target_loss=star)
            log = train_two_stage(
                model,
                batches,
                classify_loss,
                optimizer=optimizer,
                early_steps=steps - late,
                late_steps=late,
                config=config,
                stop_at_target=True,
            )
            losses = log.losses
            run.update(size_start=log.size_start, size_after_early=log.size_after_early)
            if ratio is not None:
                run.update(target_size=log.target_size, size_after_late=log.size_after_late)
                run.update(ranks_after_late=format_rank_report(log.ranks_after_late))
        seconds = time.perf_counter() - start
        run.update(
            params_start=params_start,
            params=sum(p.numel() for p in model.parameters()),
            test_accuracy=_accuracy(model, ids, mask, y, split["test"]),
            majority_class_share=float(torch.bincount(y[split["test"]]).max() / len(split["test"])),
            final_train_loss=statistics.mean(losses[-20:]),
            train_seconds=seconds,
            step_seconds=seconds / steps,
        )
        out["runs"][method if ratio is None else f"comera_ratio_{ratio}"] = run
    return out


@torch.no_grad()
def _accuracy(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, y: torch.Tensor, test: torch.Tensor) -> float:
    model.eval()
    predictions = torch.cat(
        [
            model(ids[test[i : i + 64]], attention_mask=mask[test[i : i + 64]]).argmax(-1)
            for i in range(0, len(test), 64)
        ]
    )
    model.train()
    return float((predictions == y[test]).float().mean())


# ---------------------------------------------------------------------------------------------------------- report


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def render_markdown(result: dict) -> str:
    """The experiment's JSON as a Markdown report (numbers copied, nothing recomputed but ratios)."""
    lines = [
        "# CoMERA small-scale experiment (CPU)",
        "",
        f"- command: `{result['command']}`",
        f"- date: {result['date']}; machine: {result['machine']}",
        f"- load average before: {result['load_average_before']}, after: {result.get('load_average_after')}",
        "",
    ]
    if "books" in result:
        b = result["books"]
        lines += [
            "## Books: `bert6` classifier, paper shapes (vocabulary 30,522, TT r=30, TTM r=32)",
            "",
            f"dense {b['dense_params']:,} params → CoMERA {b['comera_params']:,} ({b['compression']:.2f}×); "
            f"with gates {b['comera_params_with_gates']:,}.",
            "",
        ]
    if "profile" in result:
        p = result["profile"]
        lines += [
            f"## Masked-LM training step, `{p['preset']}`, batch {p['batch']}×{p['seq']}, vocabulary {p['vocab']}",
            "",
            "Methods alternate within each repeat; median step time. Memory = params + grads + optimizer state + "
            "saved activations.",
            "",
            "| method | params | step s | speedup vs dense | memory | GaLore memory / this |",
            "|---|---|---|---|---|---|",
        ]
        for method, row in p["rows"].items():
            lines.append(
                f"| {method} | {row['params']:,} | {row['step_time_s']:.3f} | {row['speedup_vs_dense']:.2f}× | "
                f"{_mib(row['memory_bytes']['total'])} | {row['memory_vs_galore']:.2f}× |"
            )
        lines.append("")
    if "mlm" in result:
        m = result["mlm"]
        lines += [
            f"## Masked-LM on `stdlib` ({m['tokenizer']}, model vocabulary {m['vocab']})",
            "",
            "| run | params start → end | train s | s/step | final train loss | val MLM loss | "
            "size early → target → late |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, run in m["runs"].items():
            sizes = (
                f"{run['size_after_early']:,.0f} → {run['target_size']:,.0f} → {run['size_after_late']:,.0f} "
                f"({run['size_over_target']:.3f} of target; {run['gates_killed_to_reach_target']} gates cut after "
                f"the late stage; {run['late_steps_on_size_objective']} late steps with λ=1)"
                if "target_size" in run
                else "–"
            )
            lines.append(
                f"| {name} | {run['params_start']:,} → {run['params_end']:,} | {run['train_seconds']:.0f} | "
                f"{run['step_seconds']:.2f} | "
                f"{run['final_train_loss']:.3f} | {run['val_mlm_loss']:.3f} | {sizes} |"
            )
        for name, run in m["runs"].items():
            for stage in ("ranks_after_early", "ranks_after_late"):
                if stage in run:
                    lines += ["", f"### {name}: {stage.replace('_', ' ')}", "", "```", run[stage], "```"]
        lines.append("")
    if "classify" in result:
        c = result["classify"]
        lines += [
            f"## BBC News from scratch ({c['train']} train / {c['test']} test articles, 5 topics, "
            f"{c['pooling']} pooling)",
            "",
            "| run | params (start → end) | test accuracy | majority-class share | final train loss | train s | "
            "s/step |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, run in c["runs"].items():
            params = f"{run['params_start']:,} → {run['params']:,}" if "params_start" in run else f"{run['params']:,}"
            lines.append(
                f"| {name} | {params} | {run['test_accuracy']:.3f} | {run['majority_class_share']:.3f} | "
                f"{run['final_train_loss']:.3f} | {run['train_seconds']:.0f} | {run['step_seconds']:.2f} |"
            )
        for name, run in c["runs"].items():
            if "ranks_after_late" in run:
                over = run["size_after_late"] / run["target_size"]
                lines += ["", f"### {name}: ranks after late ({over:.3f} of the target size)", "", "```"]
                lines += [run["ranks_after_late"], "```"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------------------ main


def _check_runs(args: argparse.Namespace) -> str | None:
    """What is wrong with the requested runs (checked before hours of training), or None."""
    unknown = set(args.parts.split(",")) - {"books", "profile", "mlm", "classify"}
    if unknown:
        return f"--parts {args.parts!r} names unknown parts {sorted(unknown)}; allowed: books, profile, mlm, classify"
    for flag, value, allowed in (
        ("--mlm-methods", args.mlm_methods, ("dense", "galore", "comera")),
        ("--classify-methods", args.classify_methods, ("dense", "comera")),
    ):
        methods = value.split(",")
        if set(methods) - set(allowed):
            return f"{flag} {value!r} is invalid; allowed: a comma list of {', '.join(allowed)}"
        late = "comera" in methods and (flag == "--mlm-methods" or args.classify_ratios)
        if late and args.target_loss is None and (methods[0] != "dense"):
            return f"{flag} {value!r}: the CoMERA late stage needs L*; list dense first or give --target-loss"
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="CoMERA small-scale experiment (CPU)")
    parser.add_argument("--parts", default="books,profile,mlm,classify")
    parser.add_argument("--profile-preset", default="bert6")
    parser.add_argument("--profile-repeats", type=int, default=5)
    parser.add_argument("--profile-batch", type=int, default=1, help="sequences per profiled step (paper: 1)")
    parser.add_argument("--cuda-graphs", action="store_true", help="capture the static-shape step (GPU only)")
    parser.add_argument("--preset", default="bert-small", help="model for the mlm and classify training runs")
    parser.add_argument("--mlm-methods", default="dense,galore,comera", help="masked-LM runs, dense first")
    parser.add_argument("--classify-methods", default="dense,comera")
    parser.add_argument("--classify-ratios", default="", help="two-stage CoMERA classifier runs, e.g. 0.5,0.2")
    parser.add_argument("--pooling", default="mean", choices=POOLINGS, help="classifier pooling (CoMERA: cls)")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--late-fraction", type=float, default=0.5)
    parser.add_argument("--ratios", default="0.5,0.2")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--lr", type=float, default=5e-4, help="dense params (CoMERA 'other' group)")
    parser.add_argument("--lr-cores", type=float, default=1e-3)
    parser.add_argument("--lr-gates", type=float, default=1e-2)
    parser.add_argument("--gamma", type=float, default=0.01)
    parser.add_argument(
        "--target-loss", type=float, default=None, help="L* (default: the dense run's final train loss)"
    )
    parser.add_argument(
        "--stop-at-target", action=argparse.BooleanOptionalAction, default=True, help="freeze gates once S <= S*"
    )
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None, help="write <out>.json and <out>.md")
    parser.add_argument("--render", type=Path, default=None, help="only write the .md of an existing result .json")
    args = parser.parse_args(argv)
    if args.render is not None:
        args.render.with_suffix(".md").write_text(render_markdown(json.loads(args.render.read_text())))
        return
    if args.cuda_graphs and "galore" in args.mlm_methods.split(","):
        parser.exit(
            2, "error: --cuda-graphs cannot capture GaLore (host-side projector SVDs); drop it from --mlm-methods\n"
        )
    if args.cuda_graphs and set(args.parts.split(",")) - {"mlm", "books"}:
        parser.exit(2, f"error: --cuda-graphs applies to --parts mlm (and books) only; got --parts {args.parts}\n")
    if args.cuda_graphs and not torch.cuda.is_available():
        parser.exit(2, "error: --cuda-graphs needs a CUDA device; torch.cuda.is_available() is False on this machine\n")
    if args.threads:
        torch.set_num_threads(args.threads)
    parts = args.parts.split(",")
    problem = _check_runs(args)
    if problem:
        parser.exit(2, f"error: {problem}\n")
    result: dict = {
        "command": "python -m tensorslim.comera_experiment " + " ".join(argv if argv is not None else os.sys.argv[1:]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, "
        f"torch {torch.__version__}",
        "load_average_before": os.getloadavg(),
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    if "books" in parts:
        result["books"] = books()
    if "profile" in parts:
        result["profile"] = profile(
            preset=args.profile_preset,
            batch=args.profile_batch,
            seq=args.seq_len,
            repeats=args.profile_repeats,
            warmup=2,
            vocab=padded_vocab(PAPER_VOCAB, multiple=1024),
        )
    common = {"preset": args.preset, "batch": args.batch_size, "seq": args.seq_len, "lr": args.lr}
    common.update(lr_cores=args.lr_cores, lr_gates=args.lr_gates)
    if "mlm" in parts:
        ratios = [float(r) for r in args.ratios.split(",")]
        result["mlm"] = mlm(
            methods=args.mlm_methods.split(","),
            steps=args.steps,
            late_fraction=args.late_fraction,
            ratios=ratios,
            gamma=args.gamma,
            stop_at_target=args.stop_at_target,
            target_loss=args.target_loss,
            cuda_graphs=args.cuda_graphs,
            **common,
        )
    if "classify" in parts:
        result["classify"] = classify(
            methods=args.classify_methods.split(","),
            pooling=args.pooling,
            steps=args.steps,
            ratios=[float(r) for r in args.classify_ratios.split(",") if r],
            late_fraction=args.late_fraction,
            gamma=args.gamma,
            target_loss=args.target_loss,
            **common,
        )
    result["load_average_after"] = os.getloadavg()
    text = json.dumps(result, indent=2, default=lambda v: v if not isinstance(v, float) or math.isfinite(v) else None)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(text + "\n")
        args.out.with_suffix(".md").write_text(render_markdown(json.loads(text)))


if __name__ == "__main__":
    main()
