"""Learning-rate schedule of GaLore (arXiv 2403.03507 §5) and CoLA (arXiv 2502.10940 §4): linear warm-up, then
cosine decay to a floor."""

from __future__ import annotations

import math
from dataclasses import dataclass


def warmup_cosine(step: int, *, total_steps: int, warmup_steps: int, min_ratio: float = 0.1) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based).

    Rises linearly from 1/warmup to 1 over ``warmup_steps`` steps, then follows a half cosine from 1 down to
    ``min_ratio`` at ``total_steps``. The schedule is a pure function of the step, so resuming needs no state.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass(frozen=True, kw_only=True)
class LRSchedule:
    """A run's learning rate: ``peak_lr`` times :func:`warmup_cosine` of the optimizer step."""

    peak_lr: float
    total_steps: int
    warmup_steps: int
    min_ratio: float = 0.1

    def factor(self, step: int) -> float:
        """The multiplier of :attr:`peak_lr` at optimizer step ``step`` (0-based)."""
        return warmup_cosine(
            step, total_steps=self.total_steps, warmup_steps=self.warmup_steps, min_ratio=self.min_ratio
        )
