"""Side-by-side timing of a few callables for the benchmark scripts: every case once per round, so that slow drifts
in machine load hit all of them alike (the ratios are what count on a shared machine)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def alternate(
    cases: dict[str, Callable[[], object]],
    *,
    repeats: int,
    warmup: int = 2,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Seconds per call of each case: ``warmup`` untimed rounds, then ``repeats`` timed rounds, cases in turn."""
    for _ in range(warmup):
        for step in cases.values():
            step()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, step in cases.items():
            start = clock()
            step()
            times[name].append(clock() - start)
    return times


def summarize_ms(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Median, min and max in milliseconds, and the number of timed calls, per case."""
    return {
        name: {"median_ms": 1e3 * statistics.median(t), "min_ms": 1e3 * min(t), "max_ms": 1e3 * max(t), "n": len(t)}
        for name, t in times.items()
    }
