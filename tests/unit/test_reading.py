"""Random-access reading (arXiv 2405.13216): the skip rule, the reader, its stream and its bad inputs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from tensorslim.data.longctx import Reader, ReaderConfig, ReadingStream, pool_losses, skip_length


def paper_skip(doc_len: int, start: int, window: int, k: int, alpha: float, c: float) -> int:
    """The paper's formula written out directly: D = K·min(⌊(|X|−S−L)/K⌋, ⌊α/C⌋) (for C > 0, |X| >= S + L)."""
    return k * min((doc_len - start - window) // k, math.floor(alpha / c))


def test_skip_length_is_the_formula_and_a_multiple_of_k_that_stays_in_the_document() -> None:
    rng = np.random.default_rng(0)
    for _ in range(2000):
        k, window = int(rng.integers(1, 40)), int(rng.integers(1, 200))
        doc_len = int(rng.integers(window, 5000))
        start = int(rng.integers(0, doc_len - window + 1))
        alpha, c = float(rng.uniform(0, 50)), float(rng.uniform(0.01, 10))
        d = skip_length(doc_len=doc_len, start=start, window=window, k=k, alpha=alpha, confidence=c)
        assert d == paper_skip(doc_len, start, window, k, alpha, c)
        assert d % k == 0 and d >= 0 and start + window + d <= doc_len


def test_skip_length_edge_cases() -> None:
    # C = 0 skips to the last whole block; alpha = 0 never skips; a window past the end skips nothing.
    assert skip_length(doc_len=100, start=0, window=10, k=8, alpha=1.0, confidence=0.0) == 88
    assert skip_length(doc_len=100, start=0, window=10, k=8, alpha=0.0, confidence=0.0) == 0
    assert skip_length(doc_len=100, start=95, window=10, k=8, alpha=5.0, confidence=0.1) == 0
    assert skip_length(doc_len=100, start=0, window=10, k=8, alpha=5.0, confidence=float("nan")) == 0


def test_pool_losses_mean_and_last_against_a_loop() -> None:
    losses = torch.rand(5, 9)
    mask = torch.zeros(5, 9, dtype=torch.bool)
    for row, (a, b) in enumerate([(0, 9), (2, 5), (4, 5), (0, 1), (3, 8)]):
        mask[row, a:b] = True
    mean = pool_losses(losses, mask, pooling="mean")
    last = pool_losses(losses, mask, pooling="last")
    for row in range(5):
        real = losses[row][mask[row]]
        torch.testing.assert_close(mean[row], real.mean())
        torch.testing.assert_close(last[row], real[-1])


def read_all(config: ReaderConfig, lengths: list[int], *, window: int, seed: int = 0, confidences=None) -> Reader:
    """Read every document once; ``confidences(span)`` gives each window's C (default: random in [0, 3))."""
    rng = np.random.default_rng(seed)
    reader = Reader(lengths, window=window, config=config, lanes=3, seed=seed, loop=False)
    while not reader.done:
        spans = reader.current()
        reader.advance([None if s is None else (confidences(s) if confidences else 3 * rng.random()) for s in spans])
    return reader


def test_reader_windows_and_skips_are_whole_blocks_and_never_pass_the_end() -> None:
    lengths = [1, 15, 16, 17, 200, 333, 1024, 2048]
    config = ReaderConfig(reader="random-access", skip_k=8, skip_alpha=6.0)
    reader = read_all(config, lengths, window=32)
    records = sorted(reader.log.records, key=lambda r: r.doc)
    assert [r.doc for r in records] == list(range(len(lengths)))
    assert sum(reader.log.skip_counts.values()) > 0 and any(d > 0 for r in records for d in r.skips)
    for record in records:
        covered = np.zeros(record.length, dtype=bool)
        for start, skip in zip(record.starts, record.skips, strict=True):
            assert start % 8 == 0 and start < record.length and skip % 8 == 0
            assert start + 32 + skip <= record.length or skip == 0
            assert not covered[start : start + 32].any()  # windows never overlap
            covered[start : start + 32] = True
        for begin, end in record.skipped_spans():  # what was skipped is exactly what was not read
            assert not covered[begin:end].any()
        assert covered.sum() == record.tokens_read
        assert covered.sum() + sum(e - b for b, e in record.skipped_spans()) == record.length
    assert reader.log.tokens_read == sum(r.tokens_read for r in records)
    assert reader.log.tokens_total == sum(lengths)


@pytest.mark.parametrize("alpha", [0.0, 1e-9])
def test_alpha_to_zero_reads_sequentially(alpha: float) -> None:
    lengths = [40, 100, 257, 512]
    sequential = read_all(ReaderConfig(reader="sequential"), lengths, window=16)
    random_access = read_all(
        ReaderConfig(reader="random-access", skip_k=4, skip_alpha=alpha),
        lengths,
        window=16,
        confidences=lambda span: 0.5,
    )
    for record in sequential.log.records:
        assert record.starts == list(range(0, record.length, 16)) and set(record.skips) == {0}
    assert [(r.doc, r.starts) for r in random_access.log.records] == [(r.doc, r.starts) for r in sequential.log.records]
    assert random_access.log.read_fraction == 1.0


def test_low_loss_skips_more_than_high_loss() -> None:
    config = ReaderConfig(reader="random-access", skip_k=8, skip_alpha=4.0)
    easy = read_all(config, [4096], window=32, confidences=lambda span: 0.5)  # ⌊4/0.5⌋ = 8 blocks = 64 tokens
    hard = read_all(config, [4096], window=32, confidences=lambda span: 5.0)  # ⌊4/5⌋ = 0
    assert easy.log.records[0].starts[:3] == [0, 96, 192]
    assert hard.log.read_fraction == 1.0 and easy.log.read_fraction == pytest.approx(32 / 96, abs=0.01)


def test_random_skip_draws_from_the_given_lengths_and_is_deterministic_by_seed() -> None:
    config = ReaderConfig(reader="random-skip", skip_k=8, skip_lengths="0,16,64")
    lengths = [3000] * 5
    first = read_all(config, lengths, window=32, seed=1)
    again = read_all(config, lengths, window=32, seed=1)
    other = read_all(config, lengths, window=32, seed=2)
    runs = [[(r.doc, r.starts) for r in reader.log.records] for reader in (first, again, other)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    for record in first.log.records:
        for start, skip in zip(record.starts, record.skips, strict=True):
            assert skip in {0, 16, 64} or skip == 8 * (max(record.length - start - 32, 0) // 8)  # clipped at the end
    assert {0, 16, 64} <= set(first.log.skip_counts)


def make_stream(seed: int) -> ReadingStream:
    config = ReaderConfig(reader="random-access", skip_k=4, skip_alpha=3.0)
    docs = [np.arange(n) for n in (50, 120, 77, 300, 64, 9)]
    reader = Reader([len(d) for d in docs], window=8, config=config, lanes=2, seed=seed)
    return ReadingStream(
        reader, lambda spans: torch.stack([torch.from_numpy(np.resize(docs[s.doc][s.start : s.end], 8)) for s in spans])
    )


def drive(stream: ReadingStream, steps: int) -> list[torch.Tensor]:
    """Batches of ``steps`` steps, each fed back a confidence computed from the batch (as a task's loss would)."""
    batches = []
    for _ in range(steps):
        batch = stream.next_batch()
        batches.append(batch)
        stream.feedback((batch.float().mean(1) % 7) / 2)
    return batches


def test_stream_resumes_exactly_and_is_deterministic_by_seed() -> None:
    whole = make_stream(0)
    straight = drive(whole, 40)
    assert whole.reader.log.documents > 6  # it looped over the documents more than once
    assert any(not torch.equal(a, b) for a, b in zip(straight, drive(make_stream(1), 40), strict=True))
    first = make_stream(0)
    head = drive(first, 17)
    state = json.loads(json.dumps(first.state_dict()))  # checkpoints store it as JSON
    resumed = make_stream(0)
    resumed.load_state_dict(state)
    tail = drive(resumed, 23)
    for a, b in zip(straight, head + tail, strict=True):
        assert torch.equal(a, b)


def test_batch_without_feedback_is_followed_without_a_skip() -> None:
    stream = make_stream(0)
    first = stream.reader.current()[0]
    stream.next_batch()
    stream.next_batch()  # no feedback in between
    second = stream.reader.current()[0]
    assert (second.doc, second.start) == (first.doc, first.start + 8)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"skip_k": 0}, "skip_k=0"),
        ({"skip_k": -3}, "skip_k=-3"),
        ({"skip_alpha": -0.5}, "skip_alpha=-0.5"),
        ({"skip_alpha": float("inf")}, "skip_alpha=inf"),
        ({"pooling": "max"}, "pooling='max'"),
        ({"reader": "skim"}, "reader='skim'"),
        ({"reader": "random-skip"}, "skip_lengths=''"),
        ({"reader": "random-skip", "skip_k": 8, "skip_lengths": "0,12"}, "skip_lengths='0,12'"),
    ],
)
def test_bad_reader_options_fail_in_one_line_naming_the_value(kwargs: dict, named: str) -> None:
    with pytest.raises(ValueError, match="allowed") as error:
        ReaderConfig(**kwargs)
    assert named in str(error.value) and "\n" not in str(error.value)
