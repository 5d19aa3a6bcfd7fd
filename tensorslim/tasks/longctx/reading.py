"""Training and answering with random-access reading (arXiv 2405.13216): the ``readlm`` and ``longqa`` tasks.

Both tasks take their training windows from a :class:`tensorslim.data.longctx.ReadingStream`: a reader walks long
documents, one window per lane and batch. The task's loss computes every token's loss once, feeds the window's
pooled, detached loss back to the reader (which picks the next skip from it: no extra forward pass) and returns the
mean. Their options are the reader's (:class:`tensorslim.data.longctx.ReaderConfig`), so ``tensorslim train --task
readlm --reader random-access --skip-k 16 --skip-alpha 2`` pre-trains with skipping; the window is ``--seq-len``.

- ``readlm``: causal LM pre-training on the documents of ``--data`` (each document read on its own; default: the
  standard library's source files). Validation: the loss of sequential windows (comparable across readers) and
  what the reader reads of the validation documents.
- ``longqa``: QA on the synthetic long documents of :mod:`tensorslim.data.longctx.qa`. Every window is fed as
  ``question · window · " Answer:"`` and the model predicts one token: the answer word when the window holds the
  asked fact, else eos ("not here"). The loss is the window's LM loss (what the skip reads) plus the answer's
  cross-entropy. :func:`read_and_answer` reads a document with any reader and answers from the window whose answer
  is most probable, one model call per window read. Answering this way (no memory of earlier windows) is ours.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tensorslim._checks import require_int
from tensorslim.data.longctx import Reader, ReaderConfig, ReadingLog, ReadingStream, Span, pool_losses
from tensorslim.options import option
from tensorslim.tasks.base import (
    Autocast,
    Task,
    TaskData,
    bbc_tokenizer,
    logits_of,
    mean_over_batches,
    model_tokenizer,
    register_task,
)


class _ReadingTask(Task):
    """A causal-LM task whose data a reader walks window by window (skipping ``skip_k``-token blocks)."""

    model_task = "lm"

    def build_data(self, config: Any, *, model_name: str) -> TaskData:
        window, k = config.seq_len, self.settings.skip_k
        if window % k:
            raise ValueError(f"seq_len={window} is invalid for reading; allowed: a multiple of skip_k={k}")
        return self._reading_data(config, model_name=model_name)

    def _reading_data(self, config: Any, *, model_name: str) -> TaskData:
        """The task's data, once its window has been checked."""
        raise NotImplementedError


def _token_losses(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """``(B, T-1)`` next-token losses of ``ids`` ``(B, T)`` (position t predicts token t+1), in float32."""
    logits = logits_of(model(ids[:, :-1])).float()  # (B, T-1, V)
    return F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")


# --- readlm --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ReadLMOptions(ReaderConfig):
    """The reader's options (see :class:`tensorslim.data.longctx.ReaderConfig`)."""


def _documents(stream: torch.Tensor, eos_id: int) -> list[np.ndarray]:
    """The documents of an eos-joined token stream (each with at least two tokens, so it has a loss)."""
    ids = stream.numpy()
    cuts = np.flatnonzero(ids == eos_id)
    pieces = np.split(ids, cuts + 1)
    return [piece[:-1] if len(piece) and piece[-1] == eos_id else piece for piece in pieces if len(piece) > 2]


def _lm_windows(docs: Sequence[np.ndarray], spans: Sequence[Span], *, window: int, pad_id: int) -> torch.Tensor:
    """``(B, window)`` windows, right-padded with ``pad_id`` (padding never precedes a real token)."""
    ids = torch.full((len(spans), window), pad_id, dtype=torch.long)
    for row, span in enumerate(spans):
        ids[row, : span.end - span.start] = torch.from_numpy(docs[span.doc][span.start : span.end])
    return ids


@register_task
class ReadLM(_ReadingTask):
    """Causal LM pre-training that reads each document with a reader (--reader, random access: skips)."""

    name = "readlm"
    options = ReadLMOptions

    def _reading_data(self, config: Any, *, model_name: str) -> TaskData:
        from tensorslim.data import build_lm_data
        from tensorslim.models.registry import get_model

        data = build_lm_data(
            config.data,
            tokenizer=config.tokenizer or model_tokenizer(model_name),
            vocab_size=config.vocab_size or get_model(model_name).config.vocab_size,
            seq_len=1,  # (N, 1) blocks: the whole eos-joined stream, cut into documents below
            text_field=config.text_field,
        )
        eos, window = data.tokenizer.eos_id, config.seq_len
        train = _documents(data.train.flatten(), eos)
        validation = _documents(data.validation.flatten(), eos)
        if not train or not validation:
            raise ValueError(f"data {config.data!r} has no document of 3 tokens or more in one of its splits")
        self.pad_id = eos
        reader = Reader(
            [len(d) for d in train], window=window, config=self.settings, lanes=config.batch_size, seed=config.seed
        )
        self.stream = ReadingStream(reader, lambda spans: self._batch(train, spans, window))
        return TaskData(
            train=self.stream,
            validation=_fixed_validation(validation, window=window, blocks=config.eval_blocks),
            tokenizer=data.tokenizer,
            model_overrides={"vocab_size": data.tokenizer.vocab_size, "max_seq_len": window},
            tokens_per_batch=config.batch_size * window,
        )

    def _batch(
        self, docs: Sequence[np.ndarray], spans: Sequence[Span], window: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = torch.tensor([span.end - span.start for span in spans])
        return _lm_windows(docs, spans, window=window, pad_id=self.pad_id), lengths

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        ids, lengths = batch
        losses = _token_losses(model, ids)  # (B, L-1)
        mask = torch.arange(losses.shape[1], device=ids.device)[None, :] < (lengths[:, None] - 1)  # real targets
        self.stream.feedback(pool_losses(losses.detach(), mask, pooling=self.settings.pooling))
        return (losses * mask).sum() / mask.sum().clamp(min=1)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data: TaskData, *, batch_size: int, autocast: Autocast) -> dict[str, float]:
        docs, blocks = data.validation

        def summed(ids: torch.Tensor) -> tuple[torch.Tensor, int]:
            with autocast():
                return _token_losses(model, ids).sum(), ids.shape[0] * (ids.shape[1] - 1)

        loss = mean_over_batches((blocks,), summed, batch_size=batch_size, device=next(model.parameters()).device)
        read = self._read(model, docs, window=blocks.shape[1], batch_size=batch_size, autocast=autocast)
        return {"val_loss": loss, **{f"val_{k}": v for k, v in read.items()}}

    def _read(
        self, model: nn.Module, docs: list[np.ndarray], *, window: int, batch_size: int, autocast: Autocast
    ) -> dict[str, float]:
        """Read ``docs`` once with the task's reader: the fraction read, the mean skip and the loss of what was read."""
        device = next(model.parameters()).device
        reader = Reader(
            [len(d) for d in docs], window=window, config=self.settings, lanes=batch_size, seed=0, loop=False
        )
        total, count = 0.0, 0
        while not reader.done:
            spans = reader.current()
            live = [span for span in spans if span is not None]
            ids = _lm_windows(docs, live, window=window, pad_id=self.pad_id).to(device)
            lengths = torch.tensor([span.end - span.start for span in live], device=device)
            with autocast():
                losses = _token_losses(model, ids)
            mask = torch.arange(losses.shape[1], device=device)[None, :] < (lengths[:, None] - 1)
            pooled = pool_losses(losses, mask, pooling=self.settings.pooling).tolist()
            total, count = total + (losses * mask).sum().item(), count + int(mask.sum())
            confidences: list[float | None] = [None] * len(spans)
            for span, value in zip(live, pooled, strict=True):
                confidences[span.lane] = value
            reader.advance(confidences)
        summary = reader.log.summary()
        return {
            "read_fraction": summary["read_fraction"],
            "mean_skip": summary["mean_skip"],
            "read_loss": total / max(count, 1),
        }


def _fixed_validation(docs: list[np.ndarray], *, window: int, blocks: int) -> tuple[list[np.ndarray], torch.Tensor]:
    """The fixed validation windows ``(blocks, window)``: consecutive windows of the first validation documents, and
    the text they cover as documents (the last one cut after its last window), for the reader to read."""
    kept, rows = [], []
    for doc in docs:
        need = blocks - len(rows)
        taken = [doc[s : s + window] for s in range(0, len(doc) - window + 1, window)][:need]
        if taken:
            rows += taken
            kept.append(doc if len(rows) < blocks else doc[: len(taken) * window])
        if len(rows) == blocks:
            break
    if not rows:
        raise ValueError(f"no validation document holds a window of seq_len={window} tokens; use a smaller seq_len")
    return kept, torch.from_numpy(np.stack(rows)).long()


# --- longqa --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LongQAOptions(ReaderConfig):
    """The reader's options and the shape of the synthetic QA set (:class:`tensorslim.data.longctx.qa.LongQASpec`).

    ``α`` defaults to 4: the value chosen on the development documents by ``experiments/reading_qa.py`` (the most
    accurate that reads at most half of the tokens; mean pooling). It depends on the model's loss on easy text.
    """

    skip_alpha: float = option(4.0, "random access: a window of pooled loss C skips K*floor(alpha/C) tokens")

    qa_docs: int = option(800, "longqa: training documents (validation: --eval-blocks documents)")
    dev_docs: int = option(0, "longqa: development documents, from other held-out articles (for choosing alpha)")
    doc_tokens: int = option(2048, "longqa: tokens per document")
    passage_tokens: int = option(256, "longqa: tokens per BBC passage (two per document, one holds the fact)")
    fact_lead: int = option(128, "longqa: a fact sits at least this many tokens into its passage")
    distractors: int = option(0, "longqa: passages holding a fact about another name (0 or 1)")
    answer_weight: float = option(1.0, "longqa: weight of the answer's cross-entropy next to the window's LM loss")

    def __post_init__(self) -> None:
        super().__post_init__()
        # The ranges under the flags' names (LongQASpec checks them again, with the cross-field rules, as
        # train_docs and lead).
        for name in ("qa_docs", "doc_tokens", "passage_tokens"):
            require_int(name, getattr(self, name))
        for name in ("dev_docs", "fact_lead", "distractors"):
            require_int(name, getattr(self, name), minimum=0)
        if not self.answer_weight >= 0:
            raise ValueError(f"answer_weight={self.answer_weight!r} is invalid; allowed: a number >= 0")


@dataclass(frozen=True)
class QAFormat:
    """How a window is fed: ``pad… · question · window · prompt · target``, left-padded to :attr:`length`."""

    qa: Any  # the LongQASet
    window: int

    @property
    def length(self) -> int:
        return self.qa.question_len + self.window + len(self.qa.prompt) + 1

    def batch(self, docs: Sequence[Any], spans: Sequence[Span]) -> tuple[torch.Tensor, torch.Tensor]:
        """``ids`` ``(B, length)`` (the last column is the answer target, never an input) and ``window_mask``
        ``(B, length - 1)``: True at the positions whose next-token target is a window token."""
        qa, length = self.qa, self.length
        ids = torch.full((len(spans), length), qa.none_id, dtype=torch.long)
        mask = torch.zeros((len(spans), length - 1), dtype=torch.bool)
        end = length - 1 - len(qa.prompt)  # where the window ends in every row
        for row, span in enumerate(spans):
            doc = docs[span.doc]
            window = doc.tokens[span.start : span.end].tolist()
            holds = span.start <= doc.fact[0] and doc.fact[1] <= span.end
            target = qa.answer_ids[doc.answer] if holds else qa.none_id
            body = [*doc.question, *window, *qa.prompt, target]
            ids[row, length - len(body) :] = torch.tensor(body)
            mask[row, end - len(window) - 1 : end - 1] = True
        return ids, mask


@dataclass
class QAResult:
    """What :func:`read_and_answer` found.

    Attributes:
        predictions: the answer index chosen for each document.
        accuracy: the share of documents answered right.
        log: what the reader read.
        windows: windows read (over all documents).
        model_rows: rows the model processed, counted by a forward hook: equal to ``windows`` when the skips cost no
            extra model call.
        model_calls: forward calls (each reads one window of several documents side by side).
        answer_loss: mean cross-entropy of the per-window answer targets over the windows read.
    """

    predictions: list[int]
    accuracy: float
    log: ReadingLog
    windows: int
    model_rows: int
    model_calls: int
    answer_loss: float
    scores: list[list[float]] = field(default_factory=list)


@torch.no_grad()
def read_and_answer(
    model: nn.Module,
    qa: Any,
    docs: Sequence[Any],
    config: ReaderConfig,
    *,
    window: int,
    lanes: int = 32,
    seed: int = 0,
    autocast: Autocast | None = None,
) -> QAResult:
    """Read each document with ``config``'s reader (question in front of every window) and answer its question.

    One forward pass per batch of windows gives both the window's token losses (pooled into the skip) and the answer
    distribution at the end of the window. A document's answer is the answer word with the highest probability in
    any window read (eos, "not here", does not compete).

    Args:
        model: a causal LM trained by the ``longqa`` task.
        qa: the :class:`tensorslim.data.longctx.qa.LongQASet` the documents belong to.
        docs: the documents (e.g. ``qa.validation``).
        config: the reader.
        window: ``L``, tokens per window (the run's ``seq_len``).
        lanes: documents read side by side.
        seed: seeds the random-skip draws.
        autocast: the run's autocast context (default: none).
    """
    fmt = QAFormat(qa, window)
    device = next(model.parameters()).device
    reader = Reader([len(d.tokens) for d in docs], window=window, config=config, lanes=lanes, seed=seed, loop=False)
    answers = torch.tensor(qa.answer_ids, device=device)
    best = torch.zeros((len(docs), len(qa.answer_ids)))
    counted = {"rows": 0, "calls": 0}

    def count(_module: nn.Module, inputs: tuple[torch.Tensor, ...], _output: Any) -> None:
        counted["rows"] += inputs[0].shape[0]
        counted["calls"] += 1

    handle = model.register_forward_hook(count)
    answer_total = 0.0
    try:
        while not reader.done:
            spans = reader.current()
            live = [span for span in spans if span is not None]
            ids, mask = (t.to(device) for t in fmt.batch(docs, live))
            with autocast() if autocast is not None else nullcontext():
                logits = logits_of(model(ids[:, :-1])).float()  # (B, T-1, V)
            losses = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")  # (B, T-1)
            answer_total += losses[:, -1].sum().item()
            probs = logits[:, -1].softmax(-1)[:, answers].cpu()  # (B, answers)
            pooled = pool_losses(losses, mask, pooling=config.pooling).tolist()
            confidences: list[float | None] = [None] * len(spans)
            for row, span in enumerate(live):
                best[span.doc] = torch.maximum(best[span.doc], probs[row])
                confidences[span.lane] = pooled[row]
            reader.advance(confidences)
    finally:
        handle.remove()
    predictions = best.argmax(1).tolist()
    right = sum(int(p == d.answer) for p, d in zip(predictions, docs, strict=True))
    return QAResult(
        predictions=predictions,
        accuracy=right / len(docs),
        log=reader.log,
        windows=reader.log.windows,
        model_rows=counted["rows"],
        model_calls=counted["calls"],
        answer_loss=answer_total / max(reader.log.windows, 1),
        scores=best.tolist(),
    )


@dataclass(frozen=True, kw_only=True)
class AskedDocument:
    """A new document to answer a question about (:func:`answer_documents`). Its answer is unknown: every window's
    answer target is "not here", and no prediction counts as right in :attr:`QAResult.accuracy`."""

    tokens: np.ndarray
    question: list[int]
    answer: int = -1
    fact: tuple[int, int] = (-1, -1)


def answer_documents(
    model: nn.Module,
    qa: Any,
    documents: Sequence[str],
    question: str,
    config: ReaderConfig,
    *,
    window: int,
    lanes: int = 8,
) -> QAResult:
    """Answer ``question`` about each of ``documents`` (texts) as :func:`read_and_answer` answers the task's own.

    Args:
        model: a causal LM trained by the ``longqa`` task.
        qa: the run's answering set (:func:`tensorslim.data.longctx.qa.answering_set`): its tokenizer and answer words.
        documents: the texts to read.
        question: asked in front of every window, as the task asks (``"Question: what is the code word of John?"``).
        config: the run's reader.
        window: the run's ``seq_len``.
        lanes: documents read side by side.

    Raises:
        ValueError: an empty document, or a question longer than the task's questions.
    """
    asked = qa.tokenizer.encode_batch([question])[0]
    if not asked or len(asked) > qa.question_len:
        raise ValueError(
            f"question {question!r} is {len(asked)} tokens; allowed: 1 to {qa.question_len} (the task's longest)"
        )
    encoded = qa.tokenizer.encode_batch(list(documents))
    if any(not ids for ids in encoded):
        raise ValueError("an empty document; allowed: documents of one token or more")
    docs = [AskedDocument(tokens=np.asarray(ids, dtype=np.int64), question=asked) for ids in encoded]
    return read_and_answer(model, qa, docs, config, window=window, lanes=lanes)


def build_qa_set(config: Any, options: LongQAOptions, *, model_name: str, validation_docs: int) -> Any:
    """The :class:`tensorslim.data.longctx.qa.LongQASet` of a run (BPE trained on BBC News unless ``--tokenizer``)."""
    from tensorslim.data.longctx.qa import LongQASpec, build_longqa

    spec = LongQASpec(
        train_docs=options.qa_docs,
        validation_docs=validation_docs,
        dev_docs=options.dev_docs,
        doc_tokens=options.doc_tokens,
        passage_tokens=options.passage_tokens,
        block=options.skip_k,
        lead=options.fact_lead,
        distractors=options.distractors,
        seed=config.seed,
    )
    tokenizer = bbc_tokenizer(config, model_name=model_name)
    return build_longqa(spec, tokenizer)


@register_task
class LongQA(_ReadingTask):
    """QA over long synthetic documents (facts in BBC text), read window by window with a reader (--reader)."""

    name = "longqa"
    options = LongQAOptions

    def _reading_data(self, config: Any, *, model_name: str) -> TaskData:
        qa = build_qa_set(config, self.settings, model_name=model_name, validation_docs=config.eval_blocks)
        fmt = QAFormat(qa, config.seq_len)
        reader = Reader(
            [len(d.tokens) for d in qa.train],
            window=config.seq_len,
            config=self.settings,
            lanes=config.batch_size,
            seed=config.seed,
        )
        self.stream = ReadingStream(reader, lambda spans: fmt.batch(qa.train, spans))
        self.window = config.seq_len
        return TaskData(
            train=self.stream,
            validation=qa,
            tokenizer=qa.tokenizer,
            model_overrides={"vocab_size": qa.tokenizer.vocab_size, "max_seq_len": fmt.length},
            tokens_per_batch=config.batch_size * fmt.length,
            labels=list(qa.answer_words),  # what the model answers with: a run's folder keeps them for predicting
        )

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        ids, mask = batch
        losses = _token_losses(model, ids)  # (B, T-1); the last column is the answer's
        self.stream.feedback(pool_losses(losses.detach(), mask, pooling=self.settings.pooling))
        lm = (losses * mask).sum() / mask.sum().clamp(min=1)
        return lm + self.settings.answer_weight * losses[:, -1].mean()

    def evaluate(self, model: nn.Module, data: TaskData, *, batch_size: int, autocast: Autocast) -> dict[str, float]:
        qa = data.validation
        found = read_and_answer(
            model, qa, qa.validation, self.settings, window=self.window, lanes=batch_size, autocast=autocast
        )
        summary = found.log.summary()
        return {
            "val_loss": found.answer_loss,
            "val_accuracy": found.accuracy,
            "val_read_fraction": summary["read_fraction"],
            "val_mean_skip": summary["mean_skip"],
        }
