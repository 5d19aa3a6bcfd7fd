"""Causal language modelling: next-token cross-entropy on packed sequences (the CoLA/GaLore pre-training task).

Validation loss is the mean cross-entropy over every predicted token of a fixed held-out set (the reference code
divides the summed batch losses by n + 1; we divide by n).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.tasks.base import Autocast, Task, TaskData, logits_of, model_tokenizer, register_task


def causal_lm_loss(logits: torch.Tensor, input_ids: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy: position t predicts token t+1. logits ``(B, T, V)``, ids ``(B, T)``.

    The last position has no target and is ignored, rather than sliced off: slicing ``logits[:, :-1]`` would copy
    the whole ``(B, T, V)`` tensor, which at a 32k vocabulary costs as much memory traffic as a small layer.
    """
    targets = F.pad(input_ids[:, 1:], (0, 1), value=-100)  # (B, T), -100 = ignore_index
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction=reduction, ignore_index=-100)


@register_task
class CausalLM(Task):
    name = "lm"
    help = "causal language modelling on packed text (default data: the Python standard library's source)"

    def build_data(self, config: Any, *, model_name: str) -> TaskData:
        from tensorslim.data import BatchStream, build_lm_data
        from tensorslim.models.registry import get_model

        preset = get_model(model_name)
        data = build_lm_data(
            config.data,
            tokenizer=config.tokenizer or model_tokenizer(model_name),
            vocab_size=config.vocab_size or preset.config.vocab_size,
            seq_len=config.seq_len,
            max_val_blocks=config.eval_blocks,
            text_field=config.text_field,
        )
        return TaskData(
            train=BatchStream(data.train, batch_size=config.batch_size, seed=config.seed),
            validation=data.validation,
            tokenizer=data.tokenizer,
            model_overrides={"vocab_size": data.tokenizer.vocab_size, "max_seq_len": config.seq_len},
            tokens_per_batch=config.batch_size * config.seq_len,
        )

    def loss(self, model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        return causal_lm_loss(logits_of(model(batch)), batch)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data: TaskData, *, batch_size: int, autocast: Autocast) -> dict[str, float]:
        blocks: torch.Tensor = data.validation  # (N, T)
        device = next(model.parameters()).device
        total, count = 0.0, 0
        for start in range(0, len(blocks), batch_size):
            batch = blocks[start : start + batch_size].to(device)
            with autocast():
                total += causal_lm_loss(logits_of(model(batch)), batch, reduction="sum").item()
            count += batch.shape[0] * (batch.shape[1] - 1)
        loss = total / count
        return {"val_loss": loss, "val_perplexity": math.exp(min(loss, 700.0))}
