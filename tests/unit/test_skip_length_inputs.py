"""``skip_length`` refuses what its formula cannot take with one clear line (the function is public, so it does not
rely on :class:`ReaderConfig`'s checks)."""

from __future__ import annotations

import pytest

from tensorslim.data.longctx import skip_length

GOOD = {"doc_len": 100, "start": 0, "window": 10, "k": 8, "alpha": 5.0, "confidence": 0.5}


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"k": 0}, "k=0 is invalid; allowed: an integer >= 1"),
        ({"k": -16}, "k=-16 is invalid"),
        ({"k": 2.0}, "k=2.0 is invalid"),
        ({"k": True}, "k=True is invalid"),
        ({"alpha": -4.0}, "alpha=-4.0 is invalid; allowed: a finite number >= 0"),
        ({"alpha": float("nan")}, "alpha=nan is invalid"),
        ({"alpha": float("inf")}, "alpha=inf is invalid"),
        ({"alpha": "2"}, "alpha='2' is invalid"),
        ({"confidence": -0.5}, "confidence=-0.5 is invalid"),
        ({"doc_len": -1}, "doc_len=-1 is invalid; allowed: an integer >= 0"),
        ({"start": -3}, "start=-3 is invalid"),
        ({"window": 1.5}, "window=1.5 is invalid"),
    ],
)
def test_skip_length_refuses_bad_arguments_in_one_line(bad: dict, message: str) -> None:
    with pytest.raises(ValueError) as error:
        skip_length(**{**GOOD, **bad})
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_skip_length_still_takes_its_edge_values() -> None:
    # the formula K·min(⌊(|X|−S−L)/K⌋, ⌊α/C⌋) at the edges the checks must let through
    assert skip_length(**GOOD) == 8 * min((100 - 10) // 8, 10)
    assert skip_length(**{**GOOD, "alpha": 0}) == 0
    assert skip_length(**{**GOOD, "confidence": float("inf")}) == 0
    assert skip_length(**{**GOOD, "confidence": float("nan")}) == 0
    assert skip_length(**{**GOOD, "k": 1, "alpha": 3, "confidence": 1.0}) == 3
