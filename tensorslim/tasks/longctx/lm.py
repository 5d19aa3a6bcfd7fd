"""``longctx``: causal language modelling for long-context evaluation, on stdlib code and BBC News documents with
multi-key needles (:mod:`tensorslim.data.longctx.documents`), so that one small model serves both the
streaming-perplexity and the needle-retrieval benchmarks of the bounded memory (:mod:`tensorslim.layers.memory`).

Training blocks: a share ``needles`` of needle documents (BBC train-split filler with ``needle_keys`` facts, each stated
``mentions`` times at random places, so every later statement is a recall from some distance), the rest stdlib
train-split blocks. Evaluation: the loss on held-out blocks of both kinds, and the share
of held-out needles recalled with full attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tensorslim._checks import check_fields, require_int
from tensorslim.options import option
from tensorslim.tasks.base import Autocast, Task, TaskData, logits_of, register_task
from tensorslim.tasks.lm import causal_lm_loss


@dataclass(frozen=True, kw_only=True)
class LongContextOptions:
    """The needle documents among the training blocks: their share, facts, restatements and loss weight."""

    needles: float = option(0.5, "share of training blocks that are needle documents, in [0, 1] (at most 4,000)")
    needle_keys: int = option(8, "facts per training needle document (fewer if the block is short)")
    mentions: int = option(3, "times each fact is stated in a training needle document (>= 2: the later are recalls)")
    repeats: float = option(0.0, "share of needle documents replaced by a BBC passage read twice, in [0, 1)")
    fact_share: float = option(
        0.375, "largest share of a training needle document taken by facts, in (0, 1) (the rest is BBC filler)"
    )
    key_weight: float = option(
        1.0, "loss weight of the token after a needle key (a fact's value), >= 1 (1: plain language modelling)"
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if isinstance(self.needles, bool) or not isinstance(self.needles, int | float) or not 0 <= self.needles <= 1:
            raise ValueError(f"needles={self.needles!r} is invalid; allowed: a share in [0, 1]")
        require_int("needle_keys", self.needle_keys)
        require_int("mentions", self.mentions, minimum=2)
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int | float) or not 0 <= self.repeats < 1:
            raise ValueError(f"repeats={self.repeats!r} is invalid; allowed: a share in [0, 1)")
        share = self.fact_share
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share < 1:
            raise ValueError(f"fact_share={share!r} is invalid; allowed: a share in (0, 1)")
        weight = self.key_weight
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not 1 <= weight < math.inf:
            raise ValueError(f"key_weight={weight!r} is invalid; allowed: a finite number >= 1")


def weighted_lm_loss(logits: torch.Tensor, ids: torch.Tensor, key_ids: torch.Tensor, weight: float) -> torch.Tensor:
    """Next-token cross-entropy, the prediction after every token in ``key_ids`` weighted ``weight`` (the rest 1):
    the weighted mean. Recalls are a minority of a block's targets; weighting them lets the key-value binding (an
    induction head), not the filler's language modelling, steer Adam's steps (with a low learning rate and facts
    restated often, it started recall on our CPU budget: docs/long_context.md). ``logits`` ``(B, T, V)``, ``ids``
    ``(B, T)``."""
    losses = causal_lm_loss(logits, ids, reduction="none").view(ids.shape)  # (B, T), 0 at the last position
    weights = torch.where(torch.isin(ids, key_ids.to(ids.device)), weight, 1.0)  # (B, T)
    weights[:, -1] = 0.0  # the last position has no target
    return (losses * weights).sum() / weights.sum()


@register_task
class LongContextLM(Task):
    """Causal LM on stdlib code and BBC News with multi-key needles (for tensorslim longeval)."""

    name = "longctx"
    options = LongContextOptions
    model_task = "lm"

    def build_data(self, config: Any, *, model_name: str) -> TaskData:
        from tensorslim.data import BatchStream, build_lm_data
        from tensorslim.data.longctx.documents import (
            DEPTHS,
            NEEDLE_KEYS,
            NEEDLE_VALUES,
            long_tokenizer,
            needle_documents,
            needle_training_documents,
            repeated_documents,
        )

        tokenizer = long_tokenizer(config.vocab_size or 4096)
        self._key_ids = torch.tensor([ids[0] for ids in tokenizer.encode_batch(list(NEEDLE_KEYS))])  # one token each
        keys = max(1, min(4, config.seq_len // 96))  # held-out needles per document: a short block holds fewer
        code = build_lm_data("stdlib", tokenizer=None, vocab_size=tokenizer.vocab_size, seq_len=config.seq_len)
        n_needles = round(len(code.train) * self.settings.needles / max(1e-9, 1 - self.settings.needles))
        n_needles = min(n_needles, 4000)
        needle_blocks = needle_training_documents(
            tokenizer,
            length=config.seq_len,
            count=n_needles,
            keys=max(1, min(self.settings.needle_keys, len(NEEDLE_VALUES), self._fact_room(config.seq_len))),
            mentions=self.settings.mentions,
            seed=config.seed,
        )
        n_repeats = round(n_needles * self.settings.repeats)
        repeated = repeated_documents(tokenizer, length=config.seq_len, count=n_repeats, seed=config.seed)
        train = torch.cat([code.train[: max(1, len(code.train) - n_needles)], needle_blocks[n_repeats:], repeated])
        held_out = needle_documents(
            tokenizer, length=config.seq_len, count=config.eval_blocks, depths=DEPTHS[:keys], seed=config.seed
        )
        return TaskData(
            train=BatchStream(train, batch_size=config.batch_size, seed=config.seed),
            validation={"code": code.validation[: config.eval_blocks], "needles": held_out},
            tokenizer=tokenizer,
            model_overrides={"vocab_size": tokenizer.vocab_size, "max_seq_len": config.seq_len},
            tokens_per_batch=config.batch_size * config.seq_len,
        )

    def _fact_room(self, seq_len: int) -> int:
        """Facts that fit in ``fact_share`` of a block: each statement is 3 tokens (key, value, period)."""
        return int(seq_len * self.settings.fact_share) // (3 * self.settings.mentions)

    def loss(self, model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        logits = logits_of(model(batch))  # (B, T, V)
        if self.settings.key_weight == 1:
            return causal_lm_loss(logits, batch)
        return weighted_lm_loss(logits, batch, self._key_ids, self.settings.key_weight)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data: TaskData, *, batch_size: int, autocast: Autocast) -> dict[str, float]:
        from tensorslim.data.longctx.documents import needle_accuracy

        device = next(model.parameters()).device
        needles = data.validation["needles"]
        total, count, logits_all = 0.0, 0, []
        for blocks in (data.validation["code"], needles.ids):
            for start in range(0, len(blocks), batch_size):
                batch = blocks[start : start + batch_size].to(device)
                with autocast():
                    logits = logits_of(model(batch)).float()
                total += causal_lm_loss(logits, batch, reduction="sum").item()
                count += batch.shape[0] * (batch.shape[1] - 1)
                if blocks is needles.ids:
                    logits_all.append(logits.cpu())
        loss = total / count
        recall = needle_accuracy(torch.cat(logits_all), needles)["accuracy"]
        return {"val_loss": loss, "val_perplexity": math.exp(min(loss, 700.0)), "needle_accuracy": recall}
