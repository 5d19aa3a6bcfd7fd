"""Layer-by-layer distillation of a compressed student from its own pretrained teacher (QAT-TT, arXiv 2306.01076).

The teacher is the run's registered model with its trained weights, frozen; the student is the same model after
the run's method restructured it (``tt-qat``: TT cores by TT-SVD, fake-quantized with learned scales). The loss is
the released curriculum (:mod:`tensorslim.quant.distill`): at step ``t`` the first
``layer_use = min(1 + t // steps_per_layer, L + 1)`` encoder layers are matched (hidden MSE + 1 − cos, attention
KL); once every layer is on, the sentence-embedding loss (1 − cos of the mean-pooled outputs) is added.

The release drops the learning rate to ``final_lr`` for that last phase; here the Trainer's one schedule applies
(warm-up, cosine to ``min_lr_ratio``). Texts come from ``--data`` (``bbcnews`` as in ``tensorslim distill``),
tokenized with the model's own tokenizer; the held-out set is the first ``eval_blocks`` validation documents,
scored by the full-curriculum loss (``val_loss``), the teacher–student cosine of the sentence embeddings and the
Spearman correlation of their pairwise similarities.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim._checks import check_fields, require_int
from tensorslim.options import option
from tensorslim.quant.distill import distill_loss, embedding_loss, layers_in_use, mean_pooled
from tensorslim.tasks.base import Autocast, Task, TaskData, model_tokenizer, register_task

Batch = tuple[torch.Tensor, torch.Tensor]  # input ids (B, T), attention mask (B, T)


@dataclass(frozen=True, kw_only=True)
class DistillOptions:
    """The curriculum of :class:`Distillation`."""

    steps_per_layer: int = option(20, "steps before one more encoder layer joins the loss (release: 2000)")

    def __post_init__(self) -> None:
        check_fields(self)
        require_int("steps_per_layer", self.steps_per_layer)


class TextStream:
    """Resumable ``(ids, mask)`` batches from rows ``[ids ‖ mask]`` ``(N, 2T)`` in a block stream."""

    def __init__(self, rows: Any) -> None:
        self.rows = rows

    def next_batch(self) -> Batch:
        return split_rows(self.rows.next_batch())

    def state_dict(self) -> dict[str, Any]:
        return self.rows.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows.load_state_dict(state)


def split_rows(rows: torch.Tensor) -> Batch:
    """``(ids, mask)`` of rows ``[ids ‖ mask]`` ``(B, 2T)``."""
    ids, mask = rows.chunk(2, dim=1)
    return ids, mask


def encode_texts(tokenizer: Any, texts: list[str], *, seq_len: int) -> torch.Tensor:
    """Rows ``[ids ‖ mask]`` ``(N, 2·seq_len)``: each text's first ``seq_len`` tokens, padded to ``seq_len``."""
    enc = tokenizer(texts, truncation=True, max_length=seq_len, padding="max_length", return_tensors="pt")
    return torch.cat([enc["input_ids"], enc["attention_mask"]], dim=1)


def with_attentions(model: nn.Module) -> nn.Module:
    """``model`` switched to eager attention, the only kind that returns attention probabilities."""
    if model.config._attn_implementation != "eager":
        model.set_attn_implementation("eager")
    return model


def _forward(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> Any:
    return model(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)


@register_task
class Distillation(Task):
    """Layer-wise distillation from the model's own pretrained weights (QAT-TT, arXiv 2306.01076)."""

    name = "distill"
    options = DistillOptions
    model_task = "embed"

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        self.teacher: nn.Module | None = None
        self.n_layers = 0
        self.layer_use = 1

    def attach_teacher(self, teacher: nn.Module) -> None:
        """Distill from ``teacher`` (a Hugging Face BERT-like encoder), frozen from now on."""
        self.teacher = with_attentions(teacher).eval().requires_grad_(False)
        self.n_layers = teacher.config.num_hidden_layers

    def build_data(self, config: Any, *, model_name: str) -> TaskData:
        from transformers import AutoTokenizer

        from tensorslim.data import BatchStream, load_corpus
        from tensorslim.models.registry import build_model, get_model

        if not get_model(model_name).pretrained:
            raise ValueError(f"task 'distill' needs a pretrained teacher; model={model_name!r} has no trained weights")
        self.attach_teacher(build_model(model_name, task=self.model_task))
        tokenizer = AutoTokenizer.from_pretrained(config.tokenizer or model_tokenizer(model_name))
        corpus = load_corpus(config.data)
        train = encode_texts(tokenizer, list(corpus.train), seq_len=config.seq_len)
        held_out = encode_texts(tokenizer, list(corpus.validation[: config.eval_blocks]), seq_len=config.seq_len)
        return TaskData(
            train=TextStream(BatchStream(train, batch_size=config.batch_size, seed=config.seed)),
            validation=held_out,
            tokenizer=tokenizer,
            model_overrides={"max_seq_len": config.seq_len},
            tokens_per_batch=config.batch_size * config.seq_len,
        )

    def begin_step(self, step: int) -> None:
        self.layer_use = layers_in_use(step, steps_per_layer=self.settings.steps_per_layer, n_layers=self.n_layers)

    def _teacher_on(self, device: torch.device) -> nn.Module:
        if self.teacher is None:
            raise ValueError("task 'distill' has no teacher yet: call build_data (or attach_teacher) first")
        if next(self.teacher.parameters()).device != device:
            self.teacher.to(device)
        return self.teacher

    def _loss(self, model: nn.Module, batch: Batch, *, layer_use: int) -> tuple[torch.Tensor, Any, Any]:
        ids, mask = batch
        student = _forward(with_attentions(model), ids, mask)
        with torch.no_grad():
            teacher = _forward(self._teacher_on(ids.device), ids, mask)
        # The loss in float32 even under bf16 autocast: 1 − cos and the KL of near-equal models are small differences.
        s_h, t_h = [h.float() for h in student.hidden_states], [h.float() for h in teacher.hidden_states]
        s_att, t_att = [a.float() for a in student.attentions], [a.float() for a in teacher.attentions]
        loss = distill_loss(s_h, t_h, s_att, t_att, layer_use=layer_use)
        if layer_use > self.n_layers:
            loss = loss + embedding_loss(s_h[-1], t_h[-1], mask)
        return loss, student, teacher

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return self._loss(model, batch, layer_use=self.layer_use)[0]

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data: TaskData, *, batch_size: int, autocast: Autocast) -> dict[str, float]:
        """The full-curriculum loss, the teacher–student cosine of the mean-pooled sentence embeddings and the Spearman
        correlation of the two models' pairwise embedding similarities."""
        from scipy.stats import spearmanr

        rows: torch.Tensor = data.validation
        device = next(model.parameters()).device
        total, pooled = 0.0, []
        for start in range(0, len(rows), batch_size):
            ids, mask = (t.to(device) for t in split_rows(rows[start : start + batch_size]))
            with autocast():
                loss, student, teacher = self._loss(model, (ids, mask), layer_use=self.n_layers + 1)
            total += loss.item() * len(ids)
            s = mean_pooled(student.last_hidden_state.float(), mask)  # (B, D)
            t = mean_pooled(teacher.last_hidden_state.float(), mask)
            pooled.append(torch.stack([s, t]).cpu())
        s, t = F.normalize(torch.cat(pooled, dim=1), dim=-1)  # (N, D) each
        cos = (s * t).sum(-1)  # (N,)
        pairs = torch.triu_indices(len(s), len(s), offset=1)
        s_sim, t_sim = (s @ s.T)[pairs[0], pairs[1]], (t @ t.T)[pairs[0], pairs[1]]
        metrics = {"val_loss": total / len(rows), "val_cos_mean": cos.mean().item(), "val_cos_min": cos.min().item()}
        if len(s) > 2:  # the rank correlation of the pairwise similarities needs two pairs or more
            metrics["val_spearman"] = float(spearmanr(s_sim.numpy(), t_sim.numpy()).statistic)
        return metrics
