"""How a reader walks a long document: the options of random-access reading (arXiv 2405.13216, §3).

The reader reads a window of ``L`` tokens, pools the window's token losses into a confidence ``C`` and skips
``D = K·min(⌊(|X|−S−L)/K⌋, ⌊α/C⌋)`` tokens before the next window. These options are also the reading flags of
``tensorslim train`` (``--reader random-access --skip-k K --skip-alpha A --pooling mean``): the reading tasks
(:mod:`tensorslim.tasks.longctx.reading`) take them as their options.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tensorslim._checks import check_fields, require_int
from tensorslim.options import option

READERS = ("sequential", "random-access", "random-skip")
POOLINGS = ("mean", "last")


@dataclass(frozen=True, kw_only=True)
class ReaderConfig:
    """A reader's policy.

    Attributes:
        reader: ``sequential`` (every window, no skip), ``random-access`` (the loss-driven skip rule) or
            ``random-skip`` (a baseline: each skip drawn at random from ``skip_lengths``, the same rounding to
            whole ``K`` blocks and the same stop at the document end; the confidence is ignored).
        skip_k: ``K``, the skip granularity in tokens: every skip is a multiple of it.
        skip_alpha: ``α``, tokens-per-confidence scale: a window of mean loss ``C`` buys ``⌊α/C⌋`` blocks of ``K``.
            ``α = 0`` reads sequentially.
        pooling: how the window's token losses become ``C``: their ``mean`` or the ``last`` token's loss.
        skip_lengths: the random-skip baseline's skip lengths in tokens, comma-separated (e.g. the lengths a
            random-access run logged, so that both share one skip-length distribution); drawn uniformly.
    """

    reader: str = option("random-access", f"how the reading tasks walk a document: {', '.join(READERS)}")
    skip_k: int = option(16, "random access: skip granularity K in tokens (skips are multiples of K)")
    skip_alpha: float = option(2.0, "random access: a window of pooled loss C skips K*floor(alpha/C) tokens")
    pooling: str = option("mean", f"random access: pooling of the window's token losses: {', '.join(POOLINGS)}")
    skip_lengths: str = option("", "random-skip: comma-separated skip lengths (tokens) to draw from")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.reader not in READERS:
            raise ValueError(f"reader={self.reader!r} is invalid; allowed: {list(READERS)}")
        require_int("skip_k", self.skip_k)
        if isinstance(self.skip_alpha, bool) or not isinstance(self.skip_alpha, int | float):
            raise ValueError(f"skip_alpha={self.skip_alpha!r} is invalid; allowed: a finite number >= 0")
        if not (math.isfinite(self.skip_alpha) and self.skip_alpha >= 0):
            raise ValueError(f"skip_alpha={self.skip_alpha!r} is invalid; allowed: a finite number >= 0")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling={self.pooling!r} is invalid; allowed: {list(POOLINGS)}")
        lengths = self.random_skips()
        if self.reader == "random-skip" and not lengths:
            raise ValueError("skip_lengths='' is invalid for reader='random-skip'; allowed: e.g. '0,32,64'")

    def random_skips(self) -> tuple[int, ...]:
        """:attr:`skip_lengths` as integers (checked: each a non-negative multiple of :attr:`skip_k`)."""
        text = self.skip_lengths.strip()
        if not text:
            return ()
        try:
            lengths = tuple(int(part) for part in text.split(","))
        except ValueError:
            lengths = ()
        if not lengths or any(n < 0 or n % self.skip_k for n in lengths):
            raise ValueError(
                f"skip_lengths={self.skip_lengths!r} is invalid; allowed: comma-separated integers >= 0 that are "
                f"multiples of skip_k={self.skip_k}"
            )
        return lengths
