"""``tensorslim distill``: MiniLM teacher → tensor-train (+ QAT) student, layer by layer."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads only when a command runs (after the OpenMP setting)
    from torch import nn

QAT_CHOICES = ("none", "weight", "weight+activation")


@dataclass(frozen=True, kw_only=True)
class DistillRunConfig:
    """What ``tensorslim distill`` does: MiniLM teacher → TT (+QAT) student, layer by layer; one flag per field."""

    rank: int = field(default=16, metadata={"help": "max TT rank of the student's encoder linear layers"})
    n_cores: int = field(default=4, metadata={"help": "TT cores per linear layer (half input, half output modes)"})
    init: str = field(default="tt_svd", metadata={"help": "'tt_svd' (from the teacher) or 'random' (release)"})
    tt_embedding: bool = field(default=False, metadata={"help": "also put the word embedding in TTM format"})
    embedding_rank: int = field(default=32, metadata={"help": "TTM rank of the word embedding"})
    qat: str = field(default="weight", metadata={"help": f"one of {QAT_CHOICES}"})
    bits: int = field(default=4, metadata={"help": "core (and input) bits"})
    bits_intermediate: int = field(default=8, metadata={"help": "intermediate bits (weight+activation mode)"})
    steps_per_layer: int = field(default=20, metadata={"help": "steps before one more layer joins the loss"})
    task_steps: int = field(default=40, metadata={"help": "final-phase steps (task loss, final lr)"})
    lr: float = field(default=1e-3, metadata={"help": "layer-wise phase learning rate"})
    final_lr: float = field(default=2e-5, metadata={"help": "task phase learning rate"})
    batch_size: int = field(default=8, metadata={"help": "sequences per step"})
    seq_len: int = field(default=64, metadata={"help": "tokens per sequence"})
    eval_docs: int = field(default=64, metadata={"help": "held-out BBC test articles for cosine/Spearman"})
    eval_bbc: bool = field(default=True, metadata={"help": "BBC topic accuracy with a head fit on teacher features"})
    head_docs: int = field(default=400, metadata={"help": "BBC training articles used to fit the head"})
    seed: int = field(default=0, metadata={"help": "seed of student init and data order"})
    out: str | None = field(default=None, metadata={"help": "write the JSON report here"})

    def __post_init__(self) -> None:
        if self.qat not in QAT_CHOICES:
            raise ValueError(f"qat={self.qat!r} is not supported; use one of {QAT_CHOICES}")
        if self.init not in ("tt_svd", "random"):
            raise ValueError(f"init={self.init!r} is not supported; use 'tt_svd' or 'random'")
        for name in ("rank", "batch_size", "seq_len", "eval_docs", "head_docs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 1")
        self.qat_config()
        from tensorslim.quant.distill import DistillConfig

        DistillConfig(
            steps_per_layer=self.steps_per_layer, task_steps=self.task_steps, lr=self.lr, final_lr=self.final_lr
        )

    def qat_config(self):  # noqa: ANN201 - QATConfig | None, imported lazily
        from tensorslim.quant.qat import QATConfig

        if self.qat == "none":
            return None
        return QATConfig(mode=self.qat, bits=self.bits, bits_intermediate=self.bits_intermediate)


def _pooled(model: nn.Module, batches: list[dict]):  # noqa: ANN202 - (N, D) tensor
    import torch

    outs = []
    with torch.no_grad():
        for batch in batches:
            hidden = model(**batch).last_hidden_state  # (B, T, D)
            mask = batch["attention_mask"][..., None].to(hidden.dtype)
            outs.append((hidden * mask).sum(1) / mask.sum(1))
    return torch.cat(outs)


def _embedding_task_loss(student_out: object, teacher_out: object, batch: dict):  # noqa: ANN202 - scalar tensor
    """Sentence-embedding task: 1 − cosine of the mean-pooled outputs."""
    import torch.nn.functional as F

    mask = batch["attention_mask"][..., None].to(student_out.last_hidden_state.dtype)
    s = (student_out.last_hidden_state * mask).sum(1) / mask.sum(1)
    t = (teacher_out.last_hidden_state * mask).sum(1) / mask.sum(1)
    return 1 - F.cosine_similarity(s, t, dim=-1).mean()


def _build_distill_student(teacher: nn.Module, config: DistillRunConfig):  # noqa: ANN202
    from tensorslim.convert import convert_
    from tensorslim.layers.tt import TTConfig
    from tensorslim.layers.tt_embedding import TTEmbeddingConfig
    from tensorslim.quant.distill import build_student
    from tensorslim.quant.qat import prepare_qat_

    tt = TTConfig(rank=config.rank, n_cores=config.n_cores, init=config.init)
    student, report = build_student(teacher, tt=tt, qat=None)
    if config.tt_embedding:
        init = "ttm_svd" if config.init == "tt_svd" else "random"
        convert_(
            student,
            TTEmbeddingConfig(rank=config.embedding_rank, init=init),
            filter_fn=lambda m, n: n.endswith("word_embeddings"),
        )
    if config.qat_config() is not None:
        prepare_qat_(student, config.qat_config())
    return student, report


def run_distill(config: DistillRunConfig) -> dict:
    """Distill MiniLM into a TT (+QAT) student and report fidelity and compression; returns the report dict."""
    import json
    import time

    import torch
    from scipy.stats import spearmanr
    from transformers import AutoTokenizer, BertModel

    from tensorslim.data import bbcnews_labelled, bbcnews_split
    from tensorslim.quant.distill import DistillConfig, distill
    from tensorslim.quant.hf_inputs import calibration_batches, model_folder
    from tensorslim.quant.qat import qat_bits

    torch.manual_seed(config.seed)
    folder = model_folder("minilm")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    teacher = BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    teacher.requires_grad_(False)
    texts, labels, _ = bbcnews_labelled()
    train_idx, test_idx = bbcnews_split()
    order = torch.randperm(len(train_idx), generator=torch.Generator().manual_seed(config.seed)).tolist()
    train_texts = [texts[train_idx[i]] for i in order]
    batches = calibration_batches(tokenizer, train_texts, seq_len=config.seq_len, batch_size=config.batch_size)
    student, report = _build_distill_student(teacher, config)
    student.requires_grad_(True)
    start = time.perf_counter()
    history = distill(
        teacher,
        student,
        batches,
        DistillConfig(
            steps_per_layer=config.steps_per_layer, task_steps=config.task_steps, lr=config.lr, final_lr=config.final_lr
        ),
        task_loss=_embedding_task_loss,
    )
    seconds = time.perf_counter() - start
    student.eval()
    held = calibration_batches(tokenizer, [texts[i] for i in test_idx[: config.eval_docs]], seq_len=config.seq_len)
    t_emb, s_emb = _pooled(teacher, held), _pooled(student, held)
    cos = torch.nn.functional.cosine_similarity(t_emb, s_emb, dim=-1)
    tn, sn = torch.nn.functional.normalize(t_emb, dim=-1), torch.nn.functional.normalize(s_emb, dim=-1)
    upper = torch.triu_indices(len(tn), len(tn), offset=1)
    t_sim, s_sim = (tn @ tn.T)[upper[0], upper[1]], (sn @ sn.T)[upper[0], upper[1]]
    student_bits, float_bits = qat_bits(student)
    teacher_params = sum(p.numel() for p in teacher.parameters())
    result = {
        "config": {k: getattr(config, k) for k in config.__dataclass_fields__},
        "distill_seconds": seconds,
        "steps": len(history.losses),
        "loss_first": history.losses[0],
        "loss_last": history.losses[-1],
        "cos_mean": float(cos.mean()),
        "cos_min": float(cos.min()),
        "spearman_pairwise": float(spearmanr(t_sim.numpy(), s_sim.numpy()).statistic),
        "encoder_linear_params": [report.params_before, report.params_after],
        "model_params": [teacher_params, sum(p.numel() for p in student.parameters())],
        "model_bits": [teacher_params * 32, student_bits],
        "student_float_bits": float_bits,
    }
    result["compression_params"] = result["model_params"][0] / result["model_params"][1]
    result["compression_bits"] = result["model_bits"][0] / result["model_bits"][1]
    if config.eval_bbc:
        result.update(_bbc_accuracy(teacher, student, tokenizer, texts, labels, train_idx, test_idx, config))
    print(json.dumps(result, indent=1))
    if config.out is not None:
        with open(config.out, "w") as handle:
            json.dump(result, handle, indent=1)
    return result


def _bbc_accuracy(teacher, student, tokenizer, texts, labels, train_idx, test_idx, config):  # noqa: ANN001, ANN202
    """Teacher vs student topic accuracy, both read out by one logistic head fit on teacher features."""
    import torch
    from sklearn.linear_model import LogisticRegression

    from tensorslim.quant.hf_inputs import calibration_batches

    fit = calibration_batches(
        tokenizer, [texts[i] for i in train_idx[:: max(1, len(train_idx) // config.head_docs)]], seq_len=config.seq_len
    )
    y_fit = [labels[i] for i in train_idx[:: max(1, len(train_idx) // config.head_docs)]]
    test = calibration_batches(tokenizer, [texts[i] for i in test_idx], seq_len=config.seq_len)
    y_test = torch.tensor([labels[i] for i in test_idx])
    head = LogisticRegression(max_iter=2000, C=10.0).fit(_pooled(teacher, fit).numpy(), y_fit)
    acc = {}
    for name, model in (("teacher", teacher), ("student", student)):
        pred = torch.tensor(head.predict(_pooled(model, test).numpy()))
        acc[f"bbc_acc_{name}"] = float((pred == y_test).float().mean())
    return acc


NAME = "distill"
HELP = "distill MiniLM into a TT + QAT student, layer by layer"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tensorslim.cli.flags import add_dataclass_arguments

    add_dataclass_arguments(parser, DistillRunConfig)


def run(args: argparse.Namespace) -> int:
    from tensorslim.cli.flags import config_from_args

    run_distill(config_from_args(DistillRunConfig, args))
    return 0
