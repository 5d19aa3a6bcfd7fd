"""``tensorslim distill``: MiniLM teacher → TT + QAT student (QAT-TT, arXiv 2306.01076), as a report.

An alias of ``tensorslim train --preset minilm --task distill --method tt-qat --data bbcnews`` (the one Trainer, so
the run folder gets the usual progress, metrics, loss curve, summary and checkpoints) whose flags keep the release's
vocabulary: ``--steps-per-layer`` and ``--task-steps`` give the step count, and the release's constant ``--lr`` with
its drop to ``--final-lr`` for the task phase becomes the Trainer's cosine from ``lr`` to ``final_lr``. Afterwards
it prints (and with ``--out`` writes) a JSON report: fidelity to the teacher, compression and, optionally, BBC topic
accuracy of teacher and student read out by one head fit on teacher features.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tensorslim._checks import require_int
from tensorslim.options import option

if TYPE_CHECKING:  # torch loads only when a command runs (after the OpenMP setting)
    from torch import nn

    from tensorslim.train.config import TrainConfig

MODEL = "minilm"


@dataclass(frozen=True, kw_only=True)
class DistillRunConfig:
    """The run settings of ``tensorslim distill`` beside the student's (``tt-qat``) and curriculum's options."""

    task_steps: int = option(40, "final-phase steps (every layer + the embedding loss)")
    lr: float = option(1e-3, "peak learning rate (release: 1e-3)")
    final_lr: float = option(2e-5, "learning rate at the end (release's task phase: 2e-5)")
    batch_size: int = option(8, "sequences per step")
    seq_len: int = option(64, "tokens per sequence")
    eval_docs: int = option(64, "held-out BBC articles for cosine/Spearman")
    eval_bbc: bool = option(True, "BBC topic accuracy with a head fit on teacher features")
    head_docs: int = option(400, "BBC training articles used to fit the head")
    test_docs: int | None = option(
        None, "BBC test articles the accuracy is read on, spread over the classes (default: all 444)"
    )
    seed: int = option(0, "seed of student init and data order")
    out_dir: str | None = option(None, "run folder (default: runs/minilm-distill-tt-qat)")
    resume: bool = option(False, "continue from the run folder's latest checkpoint")
    overwrite: bool = option(False, "replace the run in a non-empty out_dir, and an existing --out report")
    out: str | None = option(None, "write the JSON report here")

    def __post_init__(self) -> None:
        require_int("task_steps", self.task_steps, minimum=0)
        for name in ("batch_size", "seq_len", "eval_docs", "head_docs"):  # named as the flags, not as TrainConfig's
            require_int(name, getattr(self, name))
        if self.test_docs is not None:
            require_int("test_docs", self.test_docs)
        if not 0 < self.lr < math.inf:
            raise ValueError(f"lr={self.lr!r} is invalid; allowed: a finite number > 0")
        if not 0 < self.final_lr <= self.lr:
            raise ValueError(f"final_lr={self.final_lr!r} is invalid; allowed: 0 < final_lr <= lr={self.lr!r}")


def train_config(run: DistillRunConfig, *, options: Any, task_options: Any) -> TrainConfig:
    """The :class:`~tensorslim.train.config.TrainConfig` that ``run`` stands for (Adam without weight decay and
    gradient clipping at 10, as released)."""
    from tensorslim.models.registry import get_model
    from tensorslim.train.config import TrainConfig

    steps = task_options.steps_per_layer * get_model(MODEL).config.n_layers + run.task_steps
    return TrainConfig(
        preset=MODEL,
        task="distill",
        method="tt-qat",
        options=options,
        task_options=task_options,
        steps=steps,
        batch_size=run.batch_size,
        seq_len=run.seq_len,
        lr=run.lr,
        min_lr_ratio=run.final_lr / run.lr,
        warmup_fraction=0.0,
        weight_decay=0.0,
        grad_clip=10.0,
        seed=run.seed,
        data="bbcnews",
        eval_blocks=run.eval_docs,
        eval_every=steps,
        checkpoint_every=steps,
        out_dir=run.out_dir,
        resume=run.resume,
        overwrite=run.overwrite,
    )


def run_distill(run: DistillRunConfig, *, options: Any = None, task_options: Any = None) -> dict:
    """Distill MiniLM into a TT (+QAT) student through the Trainer; returns (and prints) the report dict.

    Args:
        run: the run settings.
        options: the student's :class:`~tensorslim.methods.qat.TTQATOptions` (or a mapping of some fields).
        task_options: the curriculum's :class:`~tensorslim.tasks.distill.DistillOptions` (likewise).
    """
    import json
    import time

    from tensorslim.methods import method_options
    from tensorslim.options import resolve_options
    from tensorslim.quant.qat import qat_bits
    from tensorslim.tasks.distill import DistillOptions
    from tensorslim.train.trainer import Trainer

    options = method_options("tt-qat", options)
    task_options = resolve_options(DistillOptions, task_options, owner="task 'distill'")
    trainer = Trainer(train_config(run, options=options, task_options=task_options))
    start = time.perf_counter()
    result = trainer.run()
    student, teacher = trainer.model.eval(), trainer.task.teacher
    student_bits, float_bits = qat_bits(student)
    teacher_params = sum(p.numel() for p in teacher.parameters())
    report = {
        "config": {**dataclasses.asdict(options), **dataclasses.asdict(task_options), **dataclasses.asdict(run)},
        "run_dir": result.run_dir,
        "distill_seconds": time.perf_counter() - start,
        "steps": result.steps,
        "loss_first": result.losses[0],
        "loss_last": result.losses[-1],
        "val_loss": result.val_loss,
        "cos_mean": result.val_metrics["val_cos_mean"],
        "cos_min": result.val_metrics["val_cos_min"],
        "spearman_pairwise": result.val_metrics.get("val_spearman", float("nan")),
        "encoder_linear_params": [trainer.reports[0].params_before, trainer.reports[0].params_after],
        "model_params": [teacher_params, sum(p.numel() for p in student.parameters())],
        "model_bits": [teacher_params * 32, student_bits],
        "student_float_bits": float_bits,
    }
    encoder_params = sum(p.numel() for p in teacher.encoder.parameters())  # layers, LayerNorms, biases
    report["encoder_params"] = [encoder_params, sum(p.numel() for p in student.encoder.parameters())]
    report["encoder_bits"] = [encoder_params * 32, qat_bits(student.encoder)[0]]
    for what in ("model_params", "model_bits", "encoder_params", "encoder_bits"):
        report[f"compression_{what}"] = report[what][0] / report[what][1]
    report["compression_params"] = report["compression_model_params"]  # the names of earlier reports
    report["compression_bits"] = report["compression_model_bits"]
    if run.eval_bbc:
        report.update(_bbc_accuracy(teacher, student, trainer.data.tokenizer, run))
    print(json.dumps(report, indent=1))
    if run.out is not None:
        with open(run.out, "w") as handle:
            json.dump(report, handle, indent=1)
    return report


def _every_class(indices: list[int], about: int) -> list[int]:
    """About ``about`` of ``indices``, evenly strided: the split is sorted by class, so a stride keeps every class."""
    return indices[:: max(1, len(indices) // about)]


def _bbc_accuracy(teacher: nn.Module, student: nn.Module, tokenizer: Any, run: DistillRunConfig) -> dict[str, float]:
    """Teacher vs student topic accuracy, both read out by one logistic head fit on teacher features."""
    import torch
    from sklearn.linear_model import LogisticRegression

    from tensorslim.data import bbcnews_labelled, bbcnews_split
    from tensorslim.quant.distill import mean_pooled
    from tensorslim.tasks.distill import encode_texts, split_rows

    texts, labels, _ = bbcnews_labelled()
    train_idx, test_idx = bbcnews_split()
    fit_idx = _every_class(train_idx, run.head_docs)
    if run.test_docs is not None:
        test_idx = _every_class(test_idx, run.test_docs)

    @torch.no_grad()
    def features(model: nn.Module, indices: list[int]) -> torch.Tensor:  # (N, D)
        rows = encode_texts(tokenizer, [texts[i] for i in indices], seq_len=run.seq_len)
        device = next(model.parameters()).device
        out = []
        for start in range(0, len(rows), run.batch_size):
            ids, mask = (t.to(device) for t in split_rows(rows[start : start + run.batch_size]))
            out.append(mean_pooled(model(input_ids=ids, attention_mask=mask).last_hidden_state, mask).cpu())
        return torch.cat(out)

    head = LogisticRegression(max_iter=2000, C=10.0).fit(
        features(teacher, fit_idx).numpy(), [labels[i] for i in fit_idx]
    )
    y_test = torch.tensor([labels[i] for i in test_idx])
    accuracy = {}
    for name, model in (("teacher", teacher), ("student", student)):
        predicted = torch.tensor(head.predict(features(model, test_idx).numpy()))
        accuracy[f"bbc_acc_{name}"] = float((predicted == y_test).float().mean())
    return accuracy


NAME = "distill"
HELP = "distill MiniLM into a TT + QAT student, layer by layer (an alias of train --task distill --method tt-qat)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tensorslim.cli.flags import add_dataclass_arguments
    from tensorslim.methods.qat import TTQATOptions
    from tensorslim.tasks.distill import DistillOptions

    add_dataclass_arguments(parser, TTQATOptions)
    add_dataclass_arguments(parser, DistillOptions)
    add_dataclass_arguments(parser, DistillRunConfig)


def run(args: argparse.Namespace) -> int:
    from tensorslim._checks import require_output
    from tensorslim.cli.flags import config_from_args
    from tensorslim.methods.qat import TTQATOptions
    from tensorslim.tasks.distill import DistillOptions

    run_config = config_from_args(DistillRunConfig, args)
    options, task_options = config_from_args(TTQATOptions, args), config_from_args(DistillOptions, args)
    run_dir = train_config(run_config, options=options, task_options=task_options).run_dir
    require_output("out_dir", run_dir, folder=True)
    if run_config.out is not None:
        require_output("out", run_config.out, folder=False, overwrite=run_config.overwrite)
    run_distill(run_config, options=options, task_options=task_options)
    return 0
