"""``lookahead``: a classification whose answer lies *after* the token that reads it, for Attendre's wait-to-attend
(arXiv 2401.04881, abstract and §3: a causal memory cannot serve a bidirectional model; queries that wait ``w``
later tokens can).

Each document is BBC News filler (train split for training, test split for validation) behind a ``[CLS]`` token;
one cue word, ``false`` (label 0) or ``true`` (label 1), is placed 1 to ``max_distance`` tokens after ``[CLS]``, and
the cue words are removed from the filler elsewhere. The label is read from ``[CLS]`` (the sequence-classification
head), so a model sees it only if ``[CLS]`` may attend at least that far ahead: full bidirectional attention does, a
causal memory (``wait = 0``) does not, and a memory whose queries wait ``w`` tokens does up to ``w`` tokens ahead per
layer (:mod:`tensorslim.layers.memory`). The task design is ours, not the paper's (its body was not available to us).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tensorslim._checks import check_fields, require_int
from tensorslim.options import option
from tensorslim.tasks.base import TaskData, bbc_tokenizer, register_task
from tensorslim.tasks.classify import Classification, ExampleStream, _special_ids

CUES = (" false", " true")


@dataclass(frozen=True, kw_only=True)
class LookaheadOptions:
    """How far after ``[CLS]`` the cue may lie, and how many training documents there are."""

    max_distance: int = option(32, "the cue lies 1..max_distance tokens after [CLS]")
    examples: int = option(2000, "training documents (validation: --eval-blocks documents)")

    def __post_init__(self) -> None:
        check_fields(self)
        require_int("max_distance", self.max_distance)
        require_int("examples", self.examples)


def lookahead_rows(
    tokenizer: Any, *, count: int, seq_len: int, max_distance: int, split: str, seed: int
) -> tuple[torch.Tensor, int]:
    """Rows ``[label, cls, tokens...]`` ``(count, 1 + seq_len)`` and the model's vocabulary size."""
    from tensorslim.data.longctx.documents import TOPICS, bbc_topic_text

    if max_distance >= seq_len:
        raise ValueError(f"max_distance={max_distance} does not fit seq_len={seq_len}; allowed: < seq_len")
    cls_id, _, vocab = _special_ids(tokenizer)
    cue_tokens = tokenizer.encode_batch(CUES)
    if any(len(tokens) != 1 for tokens in cue_tokens):
        raise ValueError(f"tokenizer {tokenizer.name} splits the cues {CUES}; allowed: one that keeps each one token")
    cue_ids = [tokens[0] for tokens in cue_tokens]
    neutral = tokenizer.encode_batch([" the"])[0][0]  # what a stray cue word in the filler becomes
    texts = [text for topic in TOPICS for text in bbc_topic_text(topic, split=split)]
    filler = torch.tensor([token for tokens in tokenizer.encode_batch(texts) for token in tokens])
    for cue in cue_ids:
        filler[filler == cue] = neutral
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(filler) - seq_len, (count,), generator=generator)
    distances = torch.randint(1, max_distance + 1, (count,), generator=generator)
    labels = torch.randint(0, len(CUES), (count,), generator=generator)
    rows = torch.empty(count, 1 + seq_len, dtype=torch.long)
    rows[:, 0], rows[:, 1] = labels, cls_id
    rows[:, 2:] = torch.stack([filler[s : s + seq_len - 1] for s in starts.tolist()])
    rows[torch.arange(count), 1 + distances] = torch.tensor(cue_ids)[labels]
    return rows, vocab


@register_task
class LookAhead(Classification):
    """Look-ahead classification: [CLS]'s label is a cue word up to --max-distance tokens after it."""

    name = "lookahead"
    options = LookaheadOptions

    def build_data(self, config: Any, *, model_name: str) -> TaskData:
        from tensorslim.data import BatchStream

        tokenizer = bbc_tokenizer(config, model_name=model_name)
        settings = self.settings
        (rows, vocab), (held_out, _) = (
            lookahead_rows(
                tokenizer,
                count=count,
                seq_len=config.seq_len,
                max_distance=settings.max_distance,
                split=split,
                seed=seed,
            )
            for count, split, seed in (
                (settings.examples, "train", config.seed),
                (config.eval_blocks, "test", config.seed + 1),
            )
        )
        pad_id = -1  # documents are never padded
        return TaskData(
            train=ExampleStream(BatchStream(rows, batch_size=config.batch_size, seed=config.seed), pad_id=pad_id),
            validation=(held_out, pad_id),
            tokenizer=tokenizer,
            model_overrides={"vocab_size": vocab, "max_seq_len": config.seq_len, "n_classes": len(CUES)},
            tokens_per_batch=config.batch_size * config.seq_len,
            labels=[cue.strip() for cue in CUES],
        )
