"""The synthetic long-document QA set and answering by reading (``longqa``): format, determinism, model calls."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from tensorslim.data import load_tokenizer
from tensorslim.data.corpus import Corpus
from tensorslim.data.longctx import Reader, ReaderConfig, Span, pool_losses, skip_length
from tensorslim.data.longctx.qa import NAMES, LongQASpec, build_longqa
from tensorslim.models.gpt2 import GPT2Config, GPT2ForCausalLM
from tensorslim.tasks.base import model_tokenizer
from tensorslim.tasks.longctx.reading import QAFormat, read_and_answer

SPEC = LongQASpec(
    train_docs=6, validation_docs=12, doc_tokens=512, passage_tokens=128, distractors=1, block=16, lead=32, seed=3
)


def words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


@pytest.fixture(scope="module")
def tokenizer():
    # MiniLM's own WordPiece tokenizer ships offline and loads in a moment (no BPE training in unit tests).
    empty = Corpus(name="none", train=[], validation=[], fingerprint="")
    return load_tokenizer(model_tokenizer("minilm"), empty)


@pytest.fixture(scope="module")
def qa(tokenizer):
    return build_longqa(SPEC, tokenizer)


def test_documents_hold_the_asked_fact_whole_block_aligned_inside_a_passage(qa, tokenizer) -> None:
    for doc in qa.train + qa.validation:
        assert len(doc.tokens) == SPEC.doc_tokens
        begin, end = doc.fact
        assert begin % SPEC.block == 0 and end - begin <= SPEC.block
        inside = [(b, e) for b, e in doc.passages if b <= begin and end <= e]
        assert len(inside) == 1 and begin - inside[0][0] >= SPEC.lead
        fact = tokenizer.decode(doc.tokens[begin:end].tolist())
        question = tokenizer.decode(doc.question)
        asked = next(name for name in NAMES if name.lower() in words(question))
        assert ["code", "word", "of", asked.lower(), "is", qa.answer_words[doc.answer]] == words(fact)[1:7]
        for b, e in doc.distractors:  # other names, so only the question tells the facts apart
            assert asked.lower() not in words(tokenizer.decode(doc.tokens[b:e].tolist()))


def test_development_documents_are_held_out_from_other_articles_than_the_validation_ones(qa, tokenizer) -> None:
    assert qa.dev == []  # none unless asked for
    with_dev = build_longqa(LongQASpec(**{**SPEC.__dict__, "dev_docs": 12}), tokenizer)
    assert len(with_dev.dev) == 12 and all(len(d.tokens) == SPEC.doc_tokens for d in with_dev.dev)
    # Asking for development documents changes neither the training nor the validation documents.
    for a, b in zip(qa.train + qa.validation, with_dev.train + with_dev.validation, strict=True):
        assert np.array_equal(a.tokens, b.tokens) and a.fact == b.fact

    # A passage opens with its article's first `lead` tokens: no opening is shared by the two held-out sets.
    def openings(docs):
        return {tuple(d.tokens[b : b + SPEC.lead].tolist()) for d in docs for b, _ in d.passages}

    assert openings(with_dev.dev) and not openings(with_dev.dev) & openings(with_dev.validation)
    with pytest.raises(ValueError, match="dev_docs=-1"):
        LongQASpec(**{**SPEC.__dict__, "dev_docs": -1})


def test_the_set_is_deterministic_by_seed(qa, tokenizer) -> None:
    again = build_longqa(SPEC, tokenizer)
    other = build_longqa(LongQASpec(**{**SPEC.__dict__, "seed": 4}), tokenizer)
    same = [
        np.array_equal(a.tokens, b.tokens) and a.answer == b.answer for a, b in zip(qa.train, again.train, strict=True)
    ]
    assert all(same)
    assert not all(np.array_equal(a.tokens, b.tokens) for a, b in zip(qa.train, other.train, strict=True))


def test_format_puts_the_question_before_the_window_and_targets_the_answer_only_where_the_fact_is(qa) -> None:
    fmt = QAFormat(qa, window=64)
    config = ReaderConfig(reader="sequential")
    reader = Reader([len(d.tokens) for d in qa.validation], window=64, config=config, lanes=4, seed=0, loop=False)
    positives = 0
    while not reader.done:
        spans = [s for s in reader.current() if s is not None]
        ids, mask = fmt.batch(qa.validation, spans)
        assert ids.shape == (len(spans), fmt.length) and mask.shape == (len(spans), fmt.length - 1)
        for row, span in enumerate(spans):
            doc = qa.validation[span.doc]
            window = doc.tokens[span.start : span.end]
            assert ids[row, 1:][mask[row]].tolist() == window.tolist()  # the targets the window mask picks
            prefix = ids[row, : int(mask[row].nonzero()[0]) + 1].tolist()
            assert prefix[-len(doc.question) :] == doc.question
            holds = span.start <= doc.fact[0] and doc.fact[1] <= span.end
            assert ids[row, -1] == (qa.answer_ids[doc.answer] if holds else qa.none_id)
            positives += holds
        reader.advance()
    assert positives == len(qa.validation)  # sequential reading finds every fact exactly once


def test_reading_costs_one_model_row_per_window_and_skips_follow_that_forwards_loss(qa) -> None:
    torch.manual_seed(0)
    fmt = QAFormat(qa, window=32)
    model = GPT2ForCausalLM(
        GPT2Config(d_model=32, n_layers=1, n_heads=2, d_ff=64, vocab_size=qa.tokenizer.vocab_size, max_seq_len=64)
    ).eval()
    config = ReaderConfig(reader="random-access", skip_k=16, skip_alpha=40.0, pooling="last")
    docs = qa.validation[:4]
    found = read_and_answer(model, qa, docs, config, window=32, lanes=3)
    assert found.model_rows == found.windows == sum(len(r.starts) for r in found.log.records)
    assert found.log.read_fraction < 1.0 and len(found.predictions) == len(docs)
    # Reference: each window's confidence from its own forward pass, then the paper's rule.
    for record in found.log.records:
        doc = docs[record.doc]
        for start, skip in zip(record.starts, record.skips, strict=True):
            span = Span(0, 0, start, min(start + 32, len(doc.tokens)))
            ids, mask = fmt.batch([doc], [span])
            with torch.no_grad():
                logits = model(ids[:, :-1])
            losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
            c = pool_losses(losses, mask, pooling="last").item()
            expected = skip_length(doc_len=len(doc.tokens), start=start, window=32, k=16, alpha=40.0, confidence=c)
            assert skip == expected
