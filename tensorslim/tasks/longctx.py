"""``longctx``: causal language modelling for long-context evaluation, on stdlib code and BBC News documents with
multi-key needles (:mod:`tensorslim.data.longdocs`), so that one small model serves both the streaming-perplexity and
the needle-retrieval benchmarks of the bounded memory (:mod:`tensorslim.memory`).

Training blocks: a share ``needles`` of needle documents (BBC train-split filler, facts at shifted depths, restated at
the end), the rest stdlib train-split blocks. Evaluation: the loss on held-out blocks of both kinds, and the share
of held-out needles recalled with full attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tensorslim.options import option
from tensorslim.tasks.base import Autocast, Task, TaskData, logits_of, register_task
from tensorslim.tasks.lm import causal_lm_loss

# Needle depths of the training documents: four sets, shifted so that no depth is seen only at one offset.
_TRAIN_DEPTHS = tuple(tuple(round(d + shift, 2) for d in (0.05, 0.25, 0.45, 0.65)) for shift in (0.0, 0.05, 0.1, 0.15))


@dataclass(frozen=True, kw_only=True)
class LongContextOptions:
    needles: float = option(0.5, "share of training blocks that are needle documents, in [0, 1] (at most 4,000)")

    def __post_init__(self) -> None:
        if isinstance(self.needles, bool) or not isinstance(self.needles, int | float) or not 0 <= self.needles <= 1:
            raise ValueError(f"needles={self.needles!r} is invalid; allowed: a share in [0, 1]")


@register_task
class LongContextLM(Task):
    name = "longctx"
    help = "causal LM on stdlib code and BBC News with multi-key needles (for tensorslim longeval)"
    options = LongContextOptions
    model_task = "lm"

    def build_data(self, config: Any, *, model_name: str) -> TaskData:
        from tensorslim.data import BatchStream, build_lm_data
        from tensorslim.data.longdocs import DEPTHS, long_tokenizer, needle_documents

        tokenizer = long_tokenizer(config.vocab_size or 4096)
        keys = max(1, min(4, config.seq_len // 96))  # needles per document: a short block holds fewer
        code = build_lm_data("stdlib", tokenizer=None, vocab_size=tokenizer.vocab_size, seq_len=config.seq_len)
        n_needles = round(len(code.train) * self.settings.needles / max(1e-9, 1 - self.settings.needles))
        n_needles = min(n_needles, 4000)
        per_set = max(1, n_needles // len(_TRAIN_DEPTHS)) if n_needles else 0
        needle_blocks = [
            needle_documents(
                tokenizer,
                length=config.seq_len,
                count=per_set,
                depths=depths[:keys],
                split="train",
                seed=config.seed + i,
            ).ids
            for i, depths in enumerate(_TRAIN_DEPTHS)
            if per_set
        ]
        train = torch.cat([code.train[: max(1, len(code.train) - n_needles)], *needle_blocks])
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

    def loss(self, model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        return causal_lm_loss(logits_of(model(batch)), batch)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data: TaskData, *, batch_size: int, autocast: Autocast) -> dict[str, float]:
        from tensorslim.data.longdocs import needle_accuracy

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
