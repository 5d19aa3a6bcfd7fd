"""Masked language modelling (BERT, Devlin et al., 2019, §3.1): 15 % of tokens are chosen; of those 80 % become
``[MASK]``, 10 % a random token and 10 % stay; the loss is the cross-entropy on the chosen tokens only.

With our BPE tokenizer, ``[MASK]`` is one extra id after the tokenizer's vocabulary (a model with its own tokenizer
uses that tokenizer's), and the model's vocabulary is padded up to a multiple of 64 so that TT/TTM layers factor it
into balanced modes (the padding rows are never targets). Masks are drawn from a generator seeded by the run's seed
and the batch's index, so a resumed run sees exactly the masks an uninterrupted run would have.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.tasks.base import (
    Autocast,
    Task,
    TaskData,
    logits_of,
    mean_over_batches,
    model_tokenizer,
    register_task,
    special_id,
)

MASK_FRACTION = 0.15


def padded_vocab(n: int, *, multiple: int = 64) -> int:
    """``n`` rounded up to a multiple of ``multiple``."""
    return -(-n // multiple) * multiple


def mask_tokens(
    ids: torch.Tensor, *, mask_id: int, vocab: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking of ``ids`` ``(B, T)``; returns ``(inputs, labels)`` with label -100 where nothing is predicted."""
    chosen = torch.rand(ids.shape, generator=generator) < MASK_FRACTION
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    roll = torch.rand(ids.shape, generator=generator)
    inputs = ids.clone()
    inputs[chosen & (roll < 0.8)] = mask_id
    random_ids = torch.randint(vocab, ids.shape, generator=generator)
    swap = chosen & (roll >= 0.8) & (roll < 0.9)
    inputs[swap] = random_ids[swap]
    return inputs, labels


class MaskedStream:
    """Masks each batch of an LM block stream; the masks depend only on ``(seed, batch index)``."""

    def __init__(self, blocks: Any, *, mask_id: int, vocab: int, seed: int) -> None:
        self.blocks = blocks
        self.mask_id = mask_id
        self.vocab = vocab
        self.seed = seed
        self.drawn = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.drawn)
        self.drawn += 1
        return mask_tokens(self.blocks.next_batch(), mask_id=self.mask_id, vocab=self.vocab, generator=generator)

    def state_dict(self) -> dict[str, Any]:
        return {**self.blocks.state_dict(), "drawn": self.drawn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.blocks.load_state_dict({key: value for key, value in state.items() if key != "drawn"})
        self.drawn = int(state["drawn"])


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of ``logits`` ``(B, T, V)`` on the positions whose label is not -100."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100, reduction=reduction)


def _capturing() -> bool:
    """Whether a CUDA graph is being captured (never on a CPU-only build)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


@register_task
class MaskedLM(Task):
    """Masked language modelling (BERT) on packed text."""

    name = "mlm"

    def build_data(self, config: Any, *, model_name: str) -> TaskData:
        from tensorslim.data import BatchStream, build_lm_data

        data = build_lm_data(
            config.data,
            tokenizer=config.tokenizer or model_tokenizer(model_name),
            vocab_size=config.vocab_size or 4096,
            seq_len=config.seq_len,
            max_val_blocks=config.eval_blocks,
            text_field=config.text_field,
        )
        own_mask = special_id(data.tokenizer, "[MASK]")
        mask_id = data.tokenizer.vocab_size if own_mask is None else own_mask
        vocab = padded_vocab(mask_id + 1) if own_mask is None else data.tokenizer.vocab_size
        blocks = BatchStream(data.train, batch_size=config.batch_size, seed=config.seed)
        generator = torch.Generator().manual_seed(config.seed - 1)  # a fixed masking of the held-out blocks
        validation = mask_tokens(data.validation, mask_id=mask_id, vocab=data.tokenizer.vocab_size, generator=generator)
        return TaskData(
            train=MaskedStream(blocks, mask_id=mask_id, vocab=data.tokenizer.vocab_size, seed=config.seed),
            validation=validation,
            tokenizer=data.tokenizer,
            model_overrides={"vocab_size": vocab, "max_seq_len": config.seq_len},
            tokens_per_batch=config.batch_size * config.seq_len,
        )

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, labels = batch
        # The head runs on the labelled positions only; not inside a CUDA-graph capture, where the data-dependent
        # number of positions (a host sync) cannot be recorded.
        if getattr(model, "predicts_positions", False) and not _capturing():
            chosen = labels != -100  # (B, T)
            logits = logits_of(model(inputs, positions=chosen))  # (N, V)
            return F.cross_entropy(logits.float(), labels[chosen])
        return mlm_loss(logits_of(model(inputs)), labels)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data: TaskData, *, batch_size: int, autocast: Autocast) -> dict[str, float]:
        inputs, labels = data.validation

        def summed(batch: torch.Tensor, batch_labels: torch.Tensor) -> tuple[torch.Tensor, int]:
            with autocast():
                logits = logits_of(model(batch))
            return mlm_loss(logits, batch_labels, reduction="sum"), int((batch_labels != -100).sum())

        loss = mean_over_batches(
            (inputs, labels), summed, batch_size=batch_size, device=next(model.parameters()).device
        )
        return {"val_loss": loss, "val_perplexity": math.exp(min(loss, 700.0))}
