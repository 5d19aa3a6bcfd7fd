"""A synthetic long-document QA set built offline from BBC News: facts planted in BBC text inside long filler.

Each document is ``doc_tokens`` tokens: low-entropy filler (sentences from a few templates with small slot sets)
with ``passages`` BBC article openings of ``passage_tokens`` tokens each at random places. One passage holds the
fact "The code word of <name> is <answer>."; ``distractors`` others hold facts about other names. The question asks
for one name's code word, so the question, put in front of every window, says which fact counts. Facts start at a
multiple of ``block`` tokens and are at most ``block`` tokens long, so a reader whose windows and skips are whole
blocks (random access with ``K = block``) never cuts a fact in two; they sit at least ``lead`` tokens into their
passage (after an article's opening). Everything is deterministic by seed; the training documents use the
training articles of :func:`tensorslim.data.bbcnews_split`, the validation documents its test articles.

This is our construction for the long-document QA setting of random-access reading (arXiv 2405.13216, §4 fine-tunes
and evaluates on TriviaQA, which needs a download); the paper does not describe such a set.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorslim._checks import require_int

NAMES = ("John", "David", "James", "Peter", "Paul", "Mark", "Tom", "Simon", "Maria", "Anna", "Clara", "Sarah")
QUESTION = "Question: what is the code word of {name}?"
FACT = " The code word of {name} is {answer}."
ANSWER_PROMPT = " Answer:"
_FILLER = (
    " Notice {n}: the {room} room is open from {h} to {h2}.",
    " This page is part of the archive and has no changes.",
    " Item {n} of the list is kept for the record.",
    " The {room} room was cleaned on {day}.",
    " Please see page {n} for the {room} room schedule.",
)
_SLOTS = {
    "n": [str(i) for i in range(1, 10)],
    "room": ["north", "south", "east", "west"],
    "h": ["8", "9", "10"],
    "h2": ["4", "5", "6"],
    "day": ["Monday", "Tuesday", "Friday"],
}


@dataclass(frozen=True, kw_only=True)
class QADocument:
    """One long document and its question.

    Attributes:
        tokens: ``(|X|,)`` int64 token ids of the document.
        question: token ids of the question (put in front of every window).
        answer: index of the answer in :attr:`LongQASet.answer_ids` and :attr:`LongQASet.answer_words`.
        fact: ``(begin, end)`` tokens of the fact that answers the question.
        distractors: ``(begin, end)`` of each other fact.
        passages: ``(begin, end)`` of each BBC passage.
    """

    tokens: np.ndarray
    question: list[int]
    answer: int
    fact: tuple[int, int]
    distractors: list[tuple[int, int]]
    passages: list[tuple[int, int]]


@dataclass(frozen=True, kw_only=True)
class LongQASet:
    """Training and validation documents and the ids the QA format needs.

    Attributes:
        train, validation: the documents.
        dev: development documents (empty unless asked for): held out like the validation ones, from other articles;
            for choosing a reader's settings without looking at the validation documents.
        tokenizer: the tokenizer that made them.
        answer_words: the possible answers: the tokenizer's rarest whole-word tokens in the training articles.
        answer_ids: the token id of each answer word.
        none_id: the target of a window that does not hold the asked fact (the tokenizer's eos, also the padding).
        prompt: token ids of " Answer:", after every window.
        question_len: the longest question, in tokens.
    """

    train: list[QADocument]
    validation: list[QADocument]
    dev: list[QADocument]
    tokenizer: Any
    answer_words: list[str]
    answer_ids: list[int]
    none_id: int
    prompt: list[int]
    question_len: int


@dataclass(frozen=True, kw_only=True)
class LongQASpec:
    """The shape of the set (see the module docstring)."""

    train_docs: int = 800
    validation_docs: int = 200
    dev_docs: int = 0
    doc_tokens: int = 2048
    passage_tokens: int = 256
    passages: int = 2
    distractors: int = 0
    block: int = 16
    lead: int = 128
    answers: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("train_docs", "validation_docs", "doc_tokens", "passage_tokens", "passages", "block", "answers"):
            require_int(name, getattr(self, name))
        require_int("lead", self.lead, minimum=0)
        require_int("dev_docs", self.dev_docs, minimum=0)
        require_int("distractors", self.distractors, minimum=0)
        if self.distractors >= self.passages:
            raise ValueError(f"distractors={self.distractors} is invalid; allowed: < passages={self.passages}")
        require_int("seed", self.seed, minimum=0)
        if self.doc_tokens % self.block or self.passage_tokens % self.block or self.lead % self.block:
            raise ValueError(
                f"doc_tokens={self.doc_tokens}, passage_tokens={self.passage_tokens}, lead={self.lead} are invalid; "
                f"allowed: multiples of block={self.block}"
            )
        if self.lead + self.block > self.passage_tokens:
            raise ValueError(f"lead={self.lead} is invalid; allowed: <= passage_tokens - block")
        if self.passages * self.passage_tokens > self.doc_tokens:
            raise ValueError(f"passages={self.passages} x passage_tokens={self.passage_tokens} exceed doc_tokens")
        if self.passages > len(NAMES):
            raise ValueError(f"passages={self.passages} is invalid; allowed: <= {len(NAMES)}")


def build_longqa(spec: LongQASpec, tokenizer: Any) -> LongQASet:
    """The set of ``spec``, tokenized with ``tokenizer`` (a :class:`tensorslim.data.TextTokenizer`).

    Raises:
        ValueError: too few articles of ``spec.passage_tokens`` tokens, or a fact longer than ``spec.block``.
    """
    from tensorslim.data import bbcnews_labelled, bbcnews_split

    texts, _, _ = bbcnews_labelled()
    train_articles, test_articles = bbcnews_split()
    held_out = np.random.default_rng([spec.seed, 3]).permutation(test_articles)
    half = len(held_out) // 2  # validation and development documents never share an article
    pools = {}
    for split, indices, count, offset in (
        ("train", train_articles, spec.train_docs, 0),
        ("validation", held_out[:half], spec.validation_docs, 1),
        ("dev", held_out[half:], spec.dev_docs, 2),
    ):
        if count == 0:
            continue
        rng = np.random.default_rng([spec.seed, offset])
        # A random pool of articles, a few per passage needed: tokenizing every article would dominate small sets.
        pool = rng.permutation(indices)[: max(4 * count * spec.passages, 64)]
        articles = _article_tokens([texts[i] for i in pool], tokenizer, minimum=spec.passage_tokens)
        if len(articles) < spec.passages:
            raise ValueError(f"passage_tokens={spec.passage_tokens} is invalid: too few BBC articles are that long")
        pools[split] = (rng, articles, count)
    words, _ = _answers(tokenizer, pools["train"][1], spec.answers)
    made = {
        split: [_document(spec, tokenizer, articles, words, rng) for _ in range(count)]
        for split, (rng, articles, count) in pools.items()
    }
    answering = answering_set(tokenizer, words)  # _answers keeps words that are one token with a leading space
    return dataclasses.replace(answering, train=made["train"], validation=made["validation"], dev=made.get("dev", []))


def answering_set(tokenizer: Any, answer_words: list[str]) -> LongQASet:
    """A set without documents that answers with ``answer_words``: the ids the QA format needs to ask a trained model
    about new documents (the question's room, the prompt, each answer word's token, eos as "not here").

    Raises:
        ValueError: an answer word that is not one token with a leading space.
    """
    encoded = tokenizer.encode_batch([f" {word}" for word in answer_words])
    if any(len(ids) != 1 for ids in encoded):
        raise ValueError(f"answer words {answer_words} are not one token each for tokenizer {tokenizer.name}")
    questions = tokenizer.encode_batch([QUESTION.format(name=name) for name in NAMES])
    return LongQASet(
        train=[],
        validation=[],
        dev=[],
        tokenizer=tokenizer,
        answer_words=list(answer_words),
        answer_ids=[ids[0] for ids in encoded],
        none_id=tokenizer.eos_id,
        prompt=tokenizer.encode_batch([ANSWER_PROMPT])[0],
        question_len=max(len(q) for q in questions),
    )


def _answers(tokenizer: Any, articles: list[list[int]], count: int) -> tuple[list[str], list[int]]:
    """The ``count`` whole-word tokens (lowercase letters, 4 or more, one token with a leading space) that the
    training articles use least: an answer word then rarely appears in a window without its fact."""
    counts = np.bincount(np.concatenate([np.asarray(a) for a in articles]), minlength=tokenizer.vocab_size)
    words = {i: tokenizer.decode([i]).strip() for i in range(tokenizer.vocab_size)}
    candidates = sorted(i for i, w in words.items() if len(w) >= 4 and w.isascii() and w.isalpha() and w.islower())
    encoded = tokenizer.encode_batch([f" {words[i]}" for i in candidates])
    whole = [i for i, ids in zip(candidates, encoded, strict=True) if ids == [i]]
    if len(whole) < count:
        raise ValueError(f"answers={count} is invalid for tokenizer {tokenizer.name}; allowed: <= {len(whole)}")
    chosen = sorted(whole, key=lambda i: (counts[i], i))[:count]
    return [words[i] for i in chosen], chosen


def _article_tokens(texts: list[str], tokenizer: Any, *, minimum: int) -> list[list[int]]:
    """Token ids of the articles at least ``minimum`` tokens long (line breaks as spaces)."""
    encoded = tokenizer.encode_batch([" ".join(text.split()) for text in texts])
    return [ids for ids in encoded if len(ids) >= minimum]


def _filler(tokenizer: Any, rng: np.random.Generator, count: int) -> list[int]:
    """``count`` filler tokens: template sentences with random slots, cut at ``count``."""
    sentences = []
    for _ in range(count // 6 + 8):  # a sentence is >= 6 tokens, so this always covers ``count``
        template = _FILLER[rng.integers(len(_FILLER))]
        slots = {key: values[rng.integers(len(values))] for key, values in _SLOTS.items()}
        sentences.append(template.format(**slots))
    return tokenizer.encode_batch(["".join(sentences)])[0][:count]


def _document(
    spec: LongQASpec, tokenizer: Any, articles: list[list[int]], words: list[str], rng: np.random.Generator
) -> QADocument:
    names = rng.choice(len(NAMES), size=spec.passages, replace=False)
    answers = rng.integers(len(words), size=spec.passages)
    with_fact = set(rng.choice(spec.passages, size=1 + spec.distractors, replace=False).tolist())
    chosen = rng.choice(len(articles), size=spec.passages, replace=False)
    # Passage places: the filler blocks are cut into passages + 1 gaps at random block boundaries.
    filler_blocks = (spec.doc_tokens - spec.passages * spec.passage_tokens) // spec.block
    cuts = np.sort(rng.integers(0, filler_blocks + 1, size=spec.passages))
    gaps = np.diff(np.concatenate([[0], cuts, [filler_blocks]])) * spec.block  # (passages + 1,) tokens
    filler = _filler(tokenizer, rng, spec.doc_tokens)
    tokens: list[int] = []
    passages, facts = [], []
    for i in range(spec.passages):
        tokens += filler[len(tokens) - sum(p[1] - p[0] for p in passages) :][: gaps[i]]
        fact = tokenizer.encode_batch([FACT.format(name=NAMES[names[i]], answer=words[answers[i]])])[0]
        if i not in with_fact:
            fact = []
        elif len(fact) > spec.block:
            raise ValueError(f"block={spec.block} is invalid: a fact takes {len(fact)} tokens; allowed: >= {len(fact)}")
        at = spec.block * rng.integers(spec.lead // spec.block, spec.passage_tokens // spec.block)  # within passage
        body = articles[chosen[i]]
        passage = (body[:at] + fact + body[at:])[: spec.passage_tokens]
        start = len(tokens)
        passages.append((start, start + spec.passage_tokens))
        facts.append((start + at, start + at + len(fact)) if fact else None)
        tokens += passage
    used = sum(p[1] - p[0] for p in passages)
    tokens += filler[len(tokens) - used :][: gaps[-1]]
    asked = int(rng.choice(sorted(with_fact)))
    return QADocument(
        tokens=np.asarray(tokens, dtype=np.int64),
        question=tokenizer.encode_batch([QUESTION.format(name=NAMES[names[asked]])])[0],
        answer=int(answers[asked]),
        fact=(int(facts[asked][0]), int(facts[asked][1])),
        distractors=[(int(f[0]), int(f[1])) for i, f in enumerate(facts) if f is not None and i != asked],
        passages=[(int(b), int(e)) for b, e in passages],
    )
