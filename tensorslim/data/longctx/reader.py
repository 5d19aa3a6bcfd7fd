"""A reader that walks long documents window by window, skipping after each window (arXiv 2405.13216, §3).

:class:`Reader` knows only the documents' lengths: it says which window each of its lanes reads next and, told the
pooled loss of those windows (:meth:`Reader.advance`), moves every lane past its window and the skip the policy
chose. The skip reuses the loss of the forward pass that read the window, so deciding it costs no model call. A lane
that finishes its document takes the next one. Each finished document leaves a :class:`DocumentRecord` in the
reader's :class:`ReadingLog`: where its windows started and how long each skip was.

The paper's "data server" feeds such windows to pre-training and fine-tuning; our :class:`ReadingStream` wraps a
reader as a resumable training stream of the Trainer (its state: epoch, next document, lanes, random state).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from tensorslim.data.longctx.reader_config import ReaderConfig
from tensorslim.data.longctx.skip import skip_length

KEPT_RECORDS = 256  # finished documents whose full record the log keeps (the totals count every one)


@dataclass
class DocumentRecord:
    """How one document was read.

    Attributes:
        doc: its index in the reader's documents.
        length: ``|X|`` in tokens.
        window: ``L``.
        starts: where each window read started, in order.
        skips: the skip after each window (``skips[i]`` tokens from ``starts[i] + L``); the last is 0.
    """

    doc: int
    length: int
    window: int
    starts: list[int] = field(default_factory=list)
    skips: list[int] = field(default_factory=list)

    @property
    def tokens_read(self) -> int:
        return sum(min(self.window, self.length - start) for start in self.starts)

    def skipped_spans(self) -> list[tuple[int, int]]:
        """``[(begin, end), ...]`` token ranges that were skipped (non-empty ones only)."""
        return [(s + self.window, s + self.window + d) for s, d in zip(self.starts, self.skips, strict=True) if d]


@dataclass
class ReadingLog:
    """What a reader read: totals over every finished document and the records of the last :data:`KEPT_RECORDS`."""

    documents: int = 0
    tokens_total: int = 0
    tokens_read: int = 0
    windows: int = 0
    skip_counts: Counter = field(default_factory=Counter)  # skip length (tokens) -> how many times
    records: list[DocumentRecord] = field(default_factory=list)

    def add(self, record: DocumentRecord) -> None:
        self.documents += 1
        self.tokens_total += record.length
        self.tokens_read += record.tokens_read
        self.windows += len(record.starts)
        # a window that reaches the document end has nothing to skip: no decision was taken there
        self.skip_counts.update(
            d for s, d in zip(record.starts, record.skips, strict=True) if s + record.window < record.length
        )
        self.records = [*self.records[-(KEPT_RECORDS - 1) :], record]

    @property
    def read_fraction(self) -> float:
        return self.tokens_read / max(self.tokens_total, 1)

    def skip_lengths(self) -> list[int]:
        """Every skip decision's length (zeros included), sorted: the distribution a random-skip baseline draws from."""
        return sorted(n for length, count in self.skip_counts.items() for n in [length] * count)

    def summary(self) -> dict[str, float]:
        skips = self.skip_lengths()
        return {
            "documents": self.documents,
            "windows": self.windows,
            "tokens_read": self.tokens_read,
            "tokens_total": self.tokens_total,
            "read_fraction": self.read_fraction,
            "mean_skip": float(np.mean(skips)) if skips else 0.0,
        }


@dataclass(frozen=True)
class Span:
    """The window a lane reads next: tokens ``[start, end)`` of document ``doc``."""

    lane: int
    doc: int
    start: int
    end: int


class Reader:
    """Walks documents with ``lanes`` windows at a time.

    Args:
        lengths: every document's length in tokens (each ``>= 1``).
        window: ``L``; the last window of a document may be shorter.
        config: the policy.
        lanes: documents read side by side (a training batch has one window of each).
        seed: seeds the document order (per epoch: ``seed + epoch``) and the random-skip draws.
        loop: go on forever through shuffled epochs (training); False: read documents ``0..n-1`` once, in order,
            and leave a lane empty (None) once none is left (inference).
    """

    def __init__(
        self, lengths: Sequence[int], *, window: int, config: ReaderConfig, lanes: int, seed: int, loop: bool = True
    ) -> None:
        if not lengths or min(lengths) < 1:
            raise ValueError(f"lengths={list(lengths)[:8]} is invalid; allowed: one or more documents of >= 1 token")
        if window < 1 or lanes < 1:
            raise ValueError(f"window={window}, lanes={lanes} are invalid; allowed: integers >= 1")
        self.lengths = list(lengths)
        self.window = window
        self.config = config
        self.seed = seed
        self.loop = loop
        self.log = ReadingLog()
        self._random_skips = config.random_skips()
        self._rng = np.random.default_rng(seed)
        self._epoch, self._cursor = 0, 0
        self._order = self._epoch_order()
        self._lanes: list[DocumentRecord | None] = [self._next_document() for _ in range(lanes)]

    def current(self) -> list[Span | None]:
        """The window each lane reads next (None: the lane has no document left)."""
        spans: list[Span | None] = []
        for lane, record in enumerate(self._lanes):
            if record is None:
                spans.append(None)
                continue
            start = record.starts[-1]
            spans.append(Span(lane, record.doc, start, min(start + self.window, record.length)))
        return spans

    def advance(self, confidences: Sequence[float | None] | None = None) -> None:
        """Move every lane past its window and the skip chosen from its window's pooled loss ``C``.

        ``confidences[lane]`` None (or no list at all) means no loss was fed back: random access then does not skip.
        """
        for lane, record in enumerate(self._lanes):
            if record is None:
                continue
            confidence = None if confidences is None else confidences[lane]
            start = record.starts[-1]
            skip = self._skip(record.length, start, confidence)
            record.skips.append(skip)
            following = start + self.window + skip
            if following < record.length:
                record.starts.append(following)
            else:
                self.log.add(record)
                self._lanes[lane] = self._next_document()

    @property
    def done(self) -> bool:
        return all(record is None for record in self._lanes)

    def state_dict(self) -> dict[str, Any]:
        """The position (epoch, next document, each lane's document so far) and the random state; JSON-ready."""
        return {
            "seed": self.seed,
            "documents": len(self.lengths),
            "epoch": self._epoch,
            "cursor": self._cursor,
            "lanes": [None if r is None else asdict(r) for r in self._lanes],
            "rng": self._rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Moves to a position saved by :meth:`state_dict` (of a reader over the same documents and seed)."""
        for key, expected in (("seed", self.seed), ("documents", len(self.lengths))):
            if int(state[key]) != expected:
                raise ValueError(f"reader state has {key}={state[key]}, but this reader has {key}={expected}")
        if len(state["lanes"]) != len(self._lanes):
            raise ValueError(f"reader state has {len(state['lanes'])} lanes, but this reader has {len(self._lanes)}")
        self._epoch, self._cursor = int(state["epoch"]), int(state["cursor"])
        self._order = self._epoch_order()
        self._lanes = [None if r is None else DocumentRecord(**r) for r in state["lanes"]]
        self._rng.bit_generator.state = state["rng"]

    def _skip(self, length: int, start: int, confidence: float | None) -> int:
        config, k = self.config, self.config.skip_k
        if config.reader == "sequential":
            return 0
        if config.reader == "random-skip":
            drawn = int(self._random_skips[self._rng.integers(len(self._random_skips))])
            room = max(length - start - self.window, 0) // k
            return min(drawn, k * room)  # the same stop at the document end as random access
        if confidence is None:
            return 0
        return skip_length(
            doc_len=length, start=start, window=self.window, k=k, alpha=config.skip_alpha, confidence=confidence
        )

    def _epoch_order(self) -> list[int]:
        if not self.loop:
            return list(range(len(self.lengths)))
        return np.random.default_rng(self.seed + self._epoch).permutation(len(self.lengths)).tolist()

    def _next_document(self) -> DocumentRecord | None:
        if self._cursor == len(self._order):
            if not self.loop:
                return None
            self._epoch, self._cursor = self._epoch + 1, 0
            self._order = self._epoch_order()
        doc = self._order[self._cursor]
        self._cursor += 1
        return DocumentRecord(doc=doc, length=self.lengths[doc], window=self.window, starts=[0])


class ReadingStream:
    """A :class:`Reader` as a resumable training stream: each batch holds one window of every lane.

    The task that consumes the batches calls :meth:`feedback` with the pooled, detached losses of the batch it just
    computed; a batch that got none is followed without a skip.

    Args:
        reader: a looping reader.
        make_batch: turns the lanes' spans into the batch (e.g. padded token windows with a question in front).
    """

    def __init__(self, reader: Reader, make_batch: Callable[[list[Span]], Any]) -> None:
        if not reader.loop:
            raise ValueError("a training stream needs a looping reader (loop=True)")
        self.reader = reader
        self.make_batch = make_batch
        self._outstanding = False  # a batch went out and its feedback has not come back

    def next_batch(self) -> Any:
        if self._outstanding:
            self.reader.advance(None)
        self._outstanding = True
        return self.make_batch([span for span in self.reader.current() if span is not None])

    def feedback(self, confidences: torch.Tensor) -> None:
        """The pooled losses ``C`` ``(B,)`` of the last batch (detached), one per lane in order."""
        self.reader.advance(confidences.detach().float().cpu().tolist())
        self._outstanding = False

    def state_dict(self) -> dict[str, Any]:
        return {"reader": self.reader.state_dict(), "outstanding": self._outstanding}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reader.load_state_dict(state["reader"])
        self._outstanding = bool(state["outstanding"])
