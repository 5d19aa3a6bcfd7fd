"""Long documents built from what ships offline: long standard-library files, concatenated BBC News articles of one
topic, and multi-key needle documents in BBC filler (nothing is downloaded).

Every set is deterministic: documents come in a fixed order from the held-out splits (the stdlib corpus's validation
split, the test split of :func:`~tensorslim.data.corpus.bbcnews_split`), and needle keys, values and filler offsets
come from a generator seeded with ``seed``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tensorslim.data.corpus import bbcnews_labelled, bbcnews_split, load_corpus
from tensorslim.data.tokenizer import TextTokenizer, load_tokenizer

TOPICS = ("business", "entertainment", "politics", "sport", "tech")
NEEDLE_KEYS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
]
DEPTHS = (0.1, 0.3, 0.5, 0.7)


def long_tokenizer(vocab_size: int = 4096) -> TextTokenizer:
    """The byte-level BPE of the stdlib corpus (cached), used for code and English alike."""
    return load_tokenizer(None, load_corpus("stdlib"), vocab_size=vocab_size)


def _stream(tokenizer: TextTokenizer, texts: list[str]) -> torch.Tensor:
    """The texts' tokens joined by eos, ``(N,)``."""
    ids: list[int] = []
    for tokens in tokenizer.encode_batch(texts):
        ids += [*tokens, tokenizer.eos_id]
    return torch.tensor(ids, dtype=torch.long)


_FILLER: dict[tuple[str, str], torch.Tensor] = {}


def _filler(tokenizer: TextTokenizer, split: str) -> torch.Tensor:
    """All BBC articles of ``split`` as one token stream, tokenized once per process and tokenizer."""
    key = (tokenizer.identity, split)
    if key not in _FILLER:
        _FILLER[key] = _stream(tokenizer, [text for topic in TOPICS for text in bbc_topic_text(topic, split=split)])
    return _FILLER[key]


def bbc_topic_text(topic: str, *, split: str = "test") -> list[str]:
    """The articles of one BBC News topic in file order, from the ``test`` or ``train`` split."""
    if topic not in TOPICS:
        raise ValueError(f"topic={topic!r} is unknown; allowed: {list(TOPICS)}")
    if split not in ("train", "test"):
        raise ValueError(f"split={split!r} is unknown; allowed: 'train' or 'test'")
    texts, labels, names = bbcnews_labelled()
    train, test = bbcnews_split()
    chosen = test if split == "test" else train
    return [texts[i] for i in chosen if names[labels[i]] == topic]


def bbc_topic_documents(tokenizer: TextTokenizer, *, topic: str, length: int, count: int) -> torch.Tensor:
    """``(count, length)`` token documents, each a run of consecutive held-out articles of one topic."""
    stream = _stream(tokenizer, bbc_topic_text(topic))
    return _cut(stream, length=length, count=count, what=f"BBC topic {topic!r}")


def stdlib_documents(tokenizer: TextTokenizer, *, length: int, count: int) -> torch.Tensor:
    """``(count, length)``: the first ``length`` tokens of held-out standard-library files of at least that many
    tokens (one file per document, in key order; the very largest files are mostly data tables, so none is
    preferred for its size)."""
    docs = [text for text in load_corpus("stdlib").validation if len(text) >= 3 * length]
    long = [tokens[:length] for tokens in tokenizer.encode_batch(docs[: 4 * count]) if len(tokens) >= length]
    if len(long) < count:
        raise ValueError(f"count={count} is too many stdlib files of >= {length} tokens; allowed: <= {len(long)}")
    return torch.tensor(long[:count], dtype=torch.long)


def _cut(stream: torch.Tensor, *, length: int, count: int, what: str) -> torch.Tensor:
    if len(stream) < length * count:
        raise ValueError(f"count={count} documents of {length} tokens exceed {what} ({len(stream)} tokens)")
    return stream[: length * count].view(count, length)


@dataclass(frozen=True)
class NeedleSet:
    """Multi-key needle documents: ``keys`` facts ``" The code of KEY is VALUE."`` hidden in BBC filler at the given
    depths, then asked again at the end in shuffled order.

    Attributes:
        ids: ``(N, L)`` tokens.
        answers: ``(N, L)`` boolean, True at the value tokens of the final restatements (what must be recalled).
        query_depth: ``(N, L)`` float, at answer tokens the depth (0..1) of the needle they recall, else -1.
    """

    ids: torch.Tensor
    answers: torch.Tensor
    query_depth: torch.Tensor


def needle_documents(
    tokenizer: TextTokenizer,
    *,
    length: int,
    count: int,
    depths: tuple[float, ...] = DEPTHS,
    split: str = "test",
    seed: int = 0,
) -> NeedleSet:
    """``count`` needle documents of ``length`` tokens (one key per depth), filler from the BBC ``split``."""
    if not depths or not all(0.0 <= d < 1.0 for d in depths):
        raise ValueError(f"depths={depths!r} is invalid; allowed: a non-empty tuple of numbers in [0, 1)")
    generator = torch.Generator().manual_seed(seed)
    filler = _filler(tokenizer, split)
    ids = torch.empty(count, length, dtype=torch.long)
    answers = torch.zeros(count, length, dtype=torch.bool)
    query_depth = torch.full((count, length), -1.0)
    for n in range(count):
        keys = [NEEDLE_KEYS[i] for i in torch.randperm(len(NEEDLE_KEYS), generator=generator)[: len(depths)]]
        values = [str(int(v)) for v in torch.randint(100, 1000, (len(depths),), generator=generator)]
        prefixes = tokenizer.encode_batch([f" The code of {key} is" for key in keys])
        suffixes = tokenizer.encode_batch([f" {value}." for value in values])
        facts = [p + s for p, s in zip(prefixes, suffixes, strict=True)]
        order = torch.randperm(len(depths), generator=generator).tolist()
        tail = sum((len(facts[i]) for i in order), 0)
        body = length - tail - sum(len(f) for f in facts)
        if body < len(depths):
            raise ValueError(f"length={length} is too short for {len(depths)} needles; allowed: a longer length")
        start = int(torch.randint(0, len(filler) - body, (1,), generator=generator))
        text, cut = filler[start : start + body].tolist(), 0
        doc: list[int] = []
        for depth, fact in zip(depths, facts, strict=True):
            at = int(depth * body)
            doc += text[cut:at] + fact
            cut = at
        doc += text[cut:]
        for i in order:
            begin = len(doc) + len(prefixes[i])
            doc += facts[i]
            answers[n, begin : begin + len(suffixes[i])] = True
            query_depth[n, begin : begin + len(suffixes[i])] = depths[i]
        ids[n] = torch.tensor(doc)
    return NeedleSet(ids=ids, answers=answers, query_depth=query_depth)


def needle_accuracy(logits: torch.Tensor, needles: NeedleSet) -> dict[str, float]:
    """Share of needles recalled: every value token of a restatement predicted (argmax) from its prefix. Overall and
    per depth. ``logits`` ``(N, L, V)``."""
    predicted = torch.zeros_like(needles.answers)
    predicted[:, 1:] = logits[:, :-1].argmax(-1) == needles.ids[:, 1:]
    result: dict[str, float] = {}
    hits_all: list[bool] = []
    for depth in sorted(set(needles.query_depth[needles.answers].tolist())):
        at = needles.query_depth == depth  # one needle per document at each depth
        hits = [bool(predicted[n][at[n]].all()) for n in range(len(needles.ids))]
        result[f"depth_{depth:g}"] = sum(hits) / len(hits)
        hits_all += hits
    result["accuracy"] = sum(hits_all) / len(hits_all)
    return result
