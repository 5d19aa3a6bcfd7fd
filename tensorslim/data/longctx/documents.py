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
# Needle keys and values: words that are one token of the stdlib BPE (vocabulary 4096) and never occur in BBC News,
# so that a key is unambiguous in the filler and its value (the next token) is recalled by matching that one token.
# fmt: off
NEEDLE_KEYS = (
    " tuple", " codecs", " parser", " socket", " widget", " turtle", " handler", " buffer", " timeout", " namespace",
    " logger", " kwargs", " callback", " charset", " traceback", " cookie", " pickle", " locale", " loader",
    " descriptor", " dispatch", " iterator", " opcode", " lambda", " wrapper", " operand", " selector", " coroutine",
    " mailbox", " debugger", " readline", " font",
)
NEEDLE_VALUES = (
    " header", " filename", " prefix", " thread", " variable", " debug", " integer", " indent", " strings", " codec",
    " lineno", " parameter", " newline", " subclass", " color", " hash", " compiler", " globals", " stdout",
    " iterable", " params", " datetime", " subprocess", " whitespace", " threading", " inspect", " syntax",
    " builtin", " stderr", " constructor", " python", " append",
)
# fmt: on
DEPTHS = (0.1, 0.3, 0.5, 0.7)
# The ``needles-recalled`` set: four needles early, each stated once more (recalled) in the middle, asked at the end.
RECALLED_DEPTHS, RECALLS = (0.05, 0.15, 0.25, 0.35), (0.45, 0.55, 0.65, 0.75)


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
    """Multi-key needle documents: facts ``" KEY VALUE."`` (two code words, e.g. ``" socket stdout."``) hidden in BBC
    filler at the given depths, then stated again at the end in shuffled order (where the value must be recalled).

    Attributes:
        ids: ``(N, L)`` tokens.
        answers: ``(N, L)`` boolean, True at the value tokens of the final restatements (what must be recalled).
        query_depth: ``(N, L)`` float, at answer tokens the depth (0..1) of the needle they recall, else -1.
    """

    ids: torch.Tensor
    answers: torch.Tensor
    query_depth: torch.Tensor


def _facts(tokenizer: TextTokenizer, count: int, generator: torch.Generator) -> list[tuple[list[int], list[int]]]:
    """``count`` facts with distinct random keys: ``(key tokens, value tokens + ".")`` each."""
    keys = [NEEDLE_KEYS[i] for i in torch.randperm(len(NEEDLE_KEYS), generator=generator)[:count]]
    values = [NEEDLE_VALUES[i] for i in torch.randperm(len(NEEDLE_VALUES), generator=generator)[:count]]
    period = tokenizer.encode_batch(["."])[0]
    return [(k, v + period) for k, v in zip(tokenizer.encode_batch(keys), tokenizer.encode_batch(values), strict=True)]


def _filler_text(tokenizer: TextTokenizer, split: str, body: int, generator: torch.Generator) -> list[int]:
    filler = _filler(tokenizer, split)
    start = int(torch.randint(0, len(filler) - body, (1,), generator=generator))
    return filler[start : start + body].tolist()


def needle_documents(
    tokenizer: TextTokenizer,
    *,
    length: int,
    count: int,
    depths: tuple[float, ...] = DEPTHS,
    recalls: tuple[float, ...] = (),
    split: str = "test",
    seed: int = 0,
) -> NeedleSet:
    """``count`` needle documents of ``length`` tokens (one key per depth), filler from the BBC ``split``.

    With ``recalls`` (one depth per needle), needle ``i`` is also stated once more at depth ``recalls[i]`` of the
    body, before the final restatements: a recall on the way, which makes the needle attended again.
    """
    if not depths or not all(0.0 <= d < 1.0 for d in (*depths, *recalls)):
        raise ValueError(f"depths={depths!r} is invalid; allowed: a non-empty tuple of numbers in [0, 1)")
    if len(depths) > len(NEEDLE_VALUES):
        raise ValueError(f"depths={depths!r} asks for too many needles; allowed: at most {len(NEEDLE_VALUES)}")
    if recalls and len(recalls) != len(depths):
        raise ValueError(f"recalls={recalls!r} is invalid; allowed: () or one depth per needle ({len(depths)})")
    generator = torch.Generator().manual_seed(seed)
    ids = torch.empty(count, length, dtype=torch.long)
    answers = torch.zeros(count, length, dtype=torch.bool)
    query_depth = torch.full((count, length), -1.0)
    stated = sorted([(d, i) for i, d in enumerate(depths)] + [(d, i) for i, d in enumerate(recalls)])
    for n in range(count):
        facts = _facts(tokenizer, len(depths), generator)
        order = torch.randperm(len(depths), generator=generator).tolist()
        body = length - sum(len(facts[i][0]) + len(facts[i][1]) for i in [*order, *(i for _, i in stated)])
        if body < len(stated):
            raise ValueError(f"length={length} is too short for {len(depths)} needles; allowed: a longer length")
        text, cut = _filler_text(tokenizer, split, body, generator), 0
        doc: list[int] = []
        for depth, i in stated:
            at = int(depth * body)
            doc += text[cut:at] + facts[i][0] + facts[i][1]
            cut = at
        doc += text[cut:]
        for i in order:
            key, value = facts[i]
            begin = len(doc) + len(key)
            doc += key + value
            answers[n, begin : begin + len(value) - 1] = True  # the value's tokens, not the period
            query_depth[n, begin : begin + len(value) - 1] = depths[i]
        ids[n] = torch.tensor(doc)
    return NeedleSet(ids=ids, answers=answers, query_depth=query_depth)


def needle_training_documents(
    tokenizer: TextTokenizer, *, length: int, count: int, keys: int, mentions: int, split: str = "train", seed: int = 0
) -> torch.Tensor:
    """``(count, length)`` training documents: ``keys`` facts ``" KEY VALUE."``, each stated ``mentions`` times at
    uniformly random places in BBC filler, so that every statement after the first can be predicted only by recalling
    the first, from any distance (a dense retrieval signal next to the language modelling of the filler)."""
    if keys < 1 or mentions < 2 or keys > len(NEEDLE_VALUES):
        raise ValueError(f"keys={keys}, mentions={mentions} are invalid; allowed: 1..{len(NEEDLE_VALUES)} keys, >= 2")
    generator = torch.Generator().manual_seed(seed)
    docs = torch.empty(count, length, dtype=torch.long)
    for n in range(count):
        statements = [fact for fact in _facts(tokenizer, keys, generator) for _ in range(mentions)]
        body = length - sum(len(k) + len(v) for k, v in statements)
        if body < len(statements):
            raise ValueError(f"length={length} is too short for {keys} keys x {mentions} mentions")
        places = torch.randint(0, body, (len(statements),), generator=generator).tolist()
        order = torch.randperm(len(statements), generator=generator).tolist()  # which mention lands where
        text, cut, doc = _filler_text(tokenizer, split, body, generator), 0, []
        for at, i in zip(sorted(places), order, strict=True):
            doc += text[cut:at] + statements[i][0] + statements[i][1]
            cut = at
        docs[n] = torch.tensor(doc + text[cut:])
    return docs


def repeated_documents(
    tokenizer: TextTokenizer, *, length: int, count: int, split: str = "train", seed: int = 0
) -> torch.Tensor:
    """``(count, length)``: a random BBC passage of ``length // 2`` tokens read twice. Every token of the second
    reading is predicted by finding the same token in the first and copying its successor, the "induction head"
    mechanism (Olsson et al., arXiv 2209.11895) that needle recall needs; training on it grows that mechanism fast."""
    generator = torch.Generator().manual_seed(seed)
    half = (length + 1) // 2
    docs = [_filler_text(tokenizer, split, half, generator) for _ in range(count)]
    return torch.tensor([(doc + doc)[:length] for doc in docs], dtype=torch.long).view(count, length)


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
