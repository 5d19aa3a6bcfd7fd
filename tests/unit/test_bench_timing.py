"""tensorslim.bench.timing: cases run in turn, warm-up untimed, summaries from the recorded times."""

from __future__ import annotations

import itertools

from tensorslim.bench.timing import alternate, summarize_ms


def test_alternate_runs_cases_in_turn_and_times_only_the_repeats() -> None:
    calls: list[str] = []
    ticks = itertools.count()  # a clock that advances one second per reading
    cases = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    times = alternate(cases, repeats=3, warmup=1, clock=lambda: float(next(ticks)))
    assert calls == ["a", "b"] * 4  # one warm-up round, then three timed rounds, always alternating
    assert times == {"a": [1.0, 1.0, 1.0], "b": [1.0, 1.0, 1.0]}


def test_summarize_ms_reports_median_min_max_and_count() -> None:
    summary = summarize_ms({"x": [0.003, 0.001, 0.002]})
    assert summary == {"x": {"median_ms": 2.0, "min_ms": 1.0, "max_ms": 3.0, "n": 3}}
