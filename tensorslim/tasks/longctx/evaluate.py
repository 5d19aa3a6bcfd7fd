"""Long-document evaluation of a model with a bounded memory: streaming perplexity and needle recall, with the peak
memory entries and the time per token (the harness of ``tensorslim longeval`` and the memory benchmarks)."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch
from torch import nn

from tensorslim.layers.memory.config import MemoryConfig
from tensorslim.layers.memory.equip import equip_memory_, memory_stores
from tensorslim.tasks.longctx.streaming import stream_logits, stream_nll

DATA = (
    "stdlib",
    "needles",
    "needles-recalled",
    *(f"bbc-{topic}" for topic in ("business", "entertainment", "politics", "sport", "tech")),
)


def full_attention(length: int, *, chunk: int) -> MemoryConfig:
    """The no-eviction baseline: a memory that holds the whole document (equal to full attention, see the tests)."""
    return MemoryConfig(capacity=max(length, chunk), policy="fifo", chunk=chunk)


def documents(data: str, tokenizer: object, *, length: int, count: int, seed: int = 0) -> object:
    """``(count, length)`` token ids for ``stdlib`` / ``bbc-<topic>``, or a needle set for ``needles`` (stated once,
    asked at the end) / ``needles-recalled`` (stated early, once more in the middle, asked at the end)."""
    from tensorslim.data.longctx import documents as longdocs

    if data == "stdlib":
        return longdocs.stdlib_documents(tokenizer, length=length, count=count)
    if data == "needles":
        return longdocs.needle_documents(tokenizer, length=length, count=count, seed=seed)
    if data == "needles-recalled":
        depths, recalls = longdocs.RECALLED_DEPTHS, longdocs.RECALLS
        return longdocs.needle_documents(
            tokenizer, length=length, count=count, depths=depths, recalls=recalls, seed=seed
        )
    if data.startswith("bbc-"):
        return longdocs.bbc_topic_documents(tokenizer, topic=data[4:], length=length, count=count)
    raise ValueError(f"data={data!r} is unknown; allowed: {list(DATA)}")


@dataclass(frozen=True)
class LongEvalResult:
    """One model + memory on one document set.

    Attributes:
        memory: the memory's description.
        metrics: ``perplexity`` (plain documents) or ``accuracy`` and ``depth_<d>`` (needles).
        peak_entries: the most entries one attention step attended (per layer and head).
        tokens: tokens read.
        seconds_per_token: wall time per token read (shared machine: noisy).
    """

    memory: str
    metrics: dict[str, float]
    peak_entries: int
    tokens: int
    seconds_per_token: float

    def row(self) -> dict[str, object]:
        return {
            "memory": self.memory,
            **self.metrics,
            "peak_entries": self.peak_entries,
            "tokens": self.tokens,
            "ms_per_token": 1e3 * self.seconds_per_token,
        }


def describe(config: MemoryConfig, *, length: int) -> str:
    if config.capacity >= length and config.policy == "fifo" and not config.sinks:
        return "full attention"
    sinks = f"+{config.sinks} sinks" if config.sinks else ""
    return f"{config.policy}{sinks} @ {config.capacity}"


@torch.no_grad()
def evaluate(model: nn.Module, docs: object, config: MemoryConfig, *, batch_size: int = 8) -> LongEvalResult:
    """Read every document through a copy of ``model`` equipped with ``config``."""
    from tensorslim.data.longctx.documents import NeedleSet, needle_accuracy

    model = copy.deepcopy(model).eval()
    if equip_memory_(model, config).kind != "causal":
        raise ValueError(f"model {type(model).__name__} is bidirectional; allowed: a causal language model")
    ids = docs.ids if isinstance(docs, NeedleSet) else docs
    start, nll, logits, peak = time.perf_counter(), [], [], 0
    for first in range(0, len(ids), batch_size):
        batch = ids[first : first + batch_size]
        if isinstance(docs, NeedleSet):
            logits.append(stream_logits(model, batch))
        else:
            nll.append(stream_nll(model, batch).nll)
        peak = max(peak, *(s.peak for s in memory_stores(model)))
    seconds = time.perf_counter() - start
    if isinstance(docs, NeedleSet):
        metrics = needle_accuracy(torch.cat(logits), docs)
    else:
        metrics = {"perplexity": float(torch.cat(nll).mean().exp())}
    return LongEvalResult(
        memory=describe(config, length=ids.shape[1]),
        metrics=metrics,
        peak_entries=peak,
        tokens=ids.numel(),
        seconds_per_token=seconds / ids.numel(),
    )
