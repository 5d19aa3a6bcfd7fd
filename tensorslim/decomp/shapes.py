"""Factorizing a dimension into tensor modes, with row padding for vocabularies.

A TT/TTM layer reshapes a ``d_in × d_out`` matrix into a tensor with modes ``n_1 … n_d`` (∏ n_k = d). CoMERA
(Yang et al., NeurIPS 2024, arXiv 2405.14377, Table "tensorization settings")
uses balanced modes, e.g. 768 → 12·8·8 and 3072 → 16·16·12, and pads the 30,522-row vocabulary to
16·20·10·10 = 32,000 rows (rows ≥ vocab are padding and never indexed).
"""

from __future__ import annotations

import math
from functools import lru_cache

from tensorslim._checks import require_int


def _check_positive_int(name: str, value: object) -> int:
    require_int(name, value)
    return value


@lru_cache(maxsize=1024)
def _balanced(n: int, parts: int, smallest: int) -> tuple[int, ...] | None:
    """The factorization of ``n`` into ``parts`` factors ≥ ``smallest`` (ascending) with the smallest maximum
    factor, ties broken by the largest minimum; None if there is none."""
    if parts == 1:
        return (n,) if n >= smallest else None
    best: tuple[int, ...] | None = None
    # The smallest factor is at most the parts-th root of n, so the search is tiny for layer sizes.
    for first in range(smallest, int(round(n ** (1 / parts))) + 2):
        if n % first:
            continue
        rest = _balanced(n // first, parts - 1, first)
        if rest is None:
            continue
        candidate = (first, *rest)
        if best is None or (max(candidate), -min(candidate)) < (max(best), -min(best)):
            best = candidate
    return best


def factorize(n: int, n_factors: int, *, order: str = "ascending") -> tuple[int, ...]:
    """Split ``n`` into ``n_factors`` integer factors > 1 that are as balanced as possible (∏ = n exactly).

    Args:
        n: the dimension, e.g. 768.
        n_factors: how many tensor modes.
        order: ``"ascending"`` or ``"descending"``. CoMERA orders input modes descending and output modes
            ascending (768×768 → [12,8,8 ‖ 8,8,12]) so that the outermost modes, which bound the first and last TT
            ranks, are the largest.

    Raises:
        ValueError: if ``n`` has fewer than ``n_factors`` prime factors (use :func:`pad_and_factorize`).
    """
    _check_positive_int("n", n)
    _check_positive_int("n_factors", n_factors)
    if order not in ("ascending", "descending"):
        raise ValueError(f"order={order!r} is invalid; allowed: 'ascending' or 'descending'")
    factors = (n,) if n_factors == 1 else _balanced(n, n_factors, 2)
    if factors is None:
        raise ValueError(
            f"n={n} cannot be split into {n_factors} factors > 1; allowed: pad it with pad_and_factorize() "
            "or choose fewer factors"
        )
    return tuple(sorted(factors, reverse=order == "descending"))


def pad_and_factorize(
    n: int, n_factors: int, *, max_padding: float = 0.1, order: str = "descending"
) -> tuple[int, ...]:
    """Factorize the smallest-maximum-factor size ``m ≥ n`` within ``n·(1+max_padding)`` (vocabulary rows).

    Among sizes in ``[n, n·(1+max_padding)]`` the one whose balanced factorization has the smallest largest
    factor wins, ties going to less padding: 30,522 rows in 4 modes → 14·13·13·13 = 30,758 (236 padding rows).
    CoMERA's own choice, 16·20·10·10 = 32,000, is a hand pick; pass it explicitly to reproduce the paper.

    Args:
        n: number of rows that must be addressable.
        n_factors: number of modes.
        max_padding: largest allowed relative padding, ≥ 0.
        order: see :func:`factorize`.
    """
    _check_positive_int("n", n)
    _check_positive_int("n_factors", n_factors)
    if not isinstance(max_padding, int | float) or max_padding < 0:
        raise ValueError(f"max_padding={max_padding!r} is invalid; allowed: a number >= 0")
    best: tuple[int, ...] | None = None
    for m in range(n, math.floor(n * (1 + max_padding)) + 1):
        factors = (m,) if n_factors == 1 else _balanced(m, n_factors, 2)
        if factors is not None and (best is None or max(factors) < max(best)):
            best = factors
    if best is None:
        raise ValueError(
            f"no size in [{n}, {math.floor(n * (1 + max_padding))}] splits into {n_factors} factors > 1; "
            "allowed: a larger max_padding or fewer factors"
        )
    return tuple(sorted(best, reverse=order == "descending"))


def check_factors(name: str, factors: tuple[int, ...] | list[int], *, at_least: int, exact: bool = True) -> None:
    """Raise a one-line ``ValueError`` unless ``factors`` are integers ≥ 1 whose product is ``at_least`` (or ≥ it
    when ``exact`` is False, for padded vocabularies)."""
    if not factors or any(isinstance(f, bool) or not isinstance(f, int) or f < 1 for f in factors):
        raise ValueError(f"{name}={factors!r} is invalid; allowed: a non-empty list of integers >= 1")
    product = math.prod(factors)
    if (exact and product != at_least) or product < at_least:
        relation = "equal" if exact else "be at least"
        raise ValueError(f"{name}={list(factors)} has product {product}; it must {relation} {at_least}")
