"""Ranks by budget: one rank per layer so that the converted layers fit a parameter or FLOP budget.

Pretrained weights get ranks by water-filling their singular-value spectra: by Eckart–Young (Eckart & Young 1936),
raising a layer's rank from r to r+1 removes exactly ``σ_{r+1}²`` of its squared Frobenius error, so the greedy
gives the next rank step to the layer whose step removes the most squared error per parameter (or FLOP) spent,
until the budget is used. Because each layer's gains fall with the rank, the greedy allocation is optimal for the
cost it spends (a Lagrangian argument: it maximizes ``removed error − λ·cost`` for the ratio λ of its last step).
Training from scratch has no spectrum, so every layer gets the one rank that fits.

The papers this package follows fix one rank for all layers (CoLA, arXiv 2502.10940 §3: r = d/4; CoMERA,
arXiv 2405.14377: one maximum TT rank); choosing ranks per layer by budget is our addition. This module is a leaf:
it knows budgets and the allocation algorithms; each layer family supplies its own books (costs per rank) and
spectra through its ``Transform.allocate``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from tensorslim._checks import check_fields, require_int
from tensorslim.registry import BudgetUse

AllocationMode = Literal["auto", "spectrum", "uniform"]
ALLOCATIONS = ("auto", "spectrum", "uniform")


@dataclass(frozen=True, kw_only=True)
class Budget:
    """A parameter or FLOP budget for the converted layers, e.g. ``SVDConfig(budget=Budget(params=0.5))``.

    Attributes:
        params: a number in (0, 1] is a fraction of the candidate layers' dense parameters (bias included); a
            whole number > 1 (``5_000_000`` or ``5e6``) is an absolute parameter count.
        flops: the same for forward FLOPs per token of the converted layers (as ``torch.utils.flop_counter``
            counts them).
        bytes: the same for the bytes of the converted layers' weights (what :func:`tensorslim.compression.compress`
            spends on a mix of low rank and quantized layers).
        allocation: ``"spectrum"`` water-fills the singular-value spectra of the dense weights; ``"uniform"``
            gives every layer the one rank that fits; ``"auto"`` takes ``"spectrum"`` when the layers are
            initialized from real weights (``init="svd"``/``"tt_svd"``) and ``"uniform"`` otherwise
            (``init="random"`` or meta-device weights).
        tokens: the rows per forward that FLOPs are counted at (matters only for layers with a token-independent
            part, such as TT's planned half-chains).
    """

    params: float | None = None
    flops: float | None = None
    bytes: float | None = None
    allocation: AllocationMode = "auto"
    tokens: int = 1024

    def __post_init__(self) -> None:
        check_fields(self)
        given = [kind for kind in ("params", "flops", "bytes") if getattr(self, kind) is not None]
        if len(given) != 1:
            raise ValueError(
                f"Budget(params={self.params!r}, flops={self.flops!r}, bytes={self.bytes!r}) is invalid; allowed: "
                "exactly one of them"
            )
        value = self.value
        number = not isinstance(value, bool) and isinstance(value, int | float) and 0 < value < float("inf")
        if not number or (value > 1 and not float(value).is_integer()):
            raise ValueError(
                f"{self.kind}={value!r} is invalid; allowed: a fraction in (0, 1] of the dense layers or a whole "
                "number > 1 (an absolute count)"
            )
        if self.allocation not in ALLOCATIONS:
            raise ValueError(f"allocation={self.allocation!r} is invalid; allowed: {list(ALLOCATIONS)}")
        require_int("tokens", self.tokens)

    @property
    def kind(self) -> str:
        """``"params"``, ``"flops"`` or ``"bytes"``."""
        return next(kind for kind in ("params", "flops", "bytes") if getattr(self, kind) is not None)

    @property
    def value(self) -> float:
        """The number given for :attr:`kind`."""
        return getattr(self, self.kind)

    def limit(self, dense: float) -> float:
        """The budget in absolute units, for converted layers whose dense cost is ``dense``."""
        return self.value * dense if self.value <= 1 else float(self.value)

    def use_spectrum(self, *, from_weights: bool, real_weights: bool) -> bool:
        """Whether ranks follow the spectra (else one uniform rank).

        Args:
            from_weights: the config initializes the layers from the dense weights.
            real_weights: every candidate has real (not meta-device) weights.
        """
        if self.allocation == "spectrum" and not real_weights:
            raise ValueError("allocation='spectrum' needs real weights, got meta-device ones; allowed: 'uniform'")
        if self.allocation == "auto":
            return from_weights and real_weights
        return self.allocation == "spectrum"


@dataclass(frozen=True)
class RankChoices:
    """One layer's options, from its own books.

    Attributes:
        costs: ``costs[r-1]`` is the layer's cost at rank r, for r = 1..len(costs); strictly increasing.
        dense: the cost of the layer as it is.
        gains: ``gains[r-1]`` is the squared error removed by raising the rank from r to r+1 (len(costs)-1
            entries), or None when the layer has no spectrum.
    """

    costs: Sequence[float]
    dense: float
    gains: Sequence[float] | None = None


def _rank_one_cost(choices: Sequence[RankChoices], limit: float) -> float:
    floor = sum(choice.costs[0] for choice in choices)
    if floor > limit:
        raise ValueError(f"budget of {limit:,.0f} is below {floor:,.0f}, the cost of rank 1 in every layer")
    return floor


def water_fill(choices: Sequence[RankChoices], limit: float) -> list[int]:
    """Greedy water-filling: from rank 1 everywhere, repeatedly raise the rank of the layer whose next step removes
    the most squared error per unit of cost, until the next best step no longer fits ``limit``.

    Raises:
        ValueError: rank 1 in every layer already costs more than ``limit``, or a layer has no gains.
    """
    if any(choice.gains is None for choice in choices):
        raise ValueError("water_fill needs every layer's gains; allowed: RankChoices with gains")
    used = _rank_one_cost(choices, limit)
    ranks = [1] * len(choices)

    def entry(i: int) -> tuple[float, int]:
        costs, r = choices[i].costs, ranks[i]
        return -choices[i].gains[r - 1] / (costs[r] - costs[r - 1]), i  # the heap pops the best ratio first

    heap = [entry(i) for i, choice in enumerate(choices) if len(choice.costs) > 1]
    heapq.heapify(heap)
    while heap:
        _, i = heapq.heappop(heap)
        costs, r = choices[i].costs, ranks[i]
        step = costs[r] - costs[r - 1]
        if used + step > limit:
            break  # stopping here (not skipping to cheaper steps) keeps the allocation optimal for what it spends
        ranks[i], used = r + 1, used + step
        if ranks[i] < len(costs):
            heapq.heappush(heap, entry(i))
    return ranks


def uniform_ranks(choices: Sequence[RankChoices], limit: float) -> list[int]:
    """The largest single rank r (clipped to each layer's range) whose total cost fits ``limit``.

    Raises:
        ValueError: rank 1 in every layer already costs more than ``limit``.
    """
    _rank_one_cost(choices, limit)

    def total(r: int) -> float:
        return sum(choice.costs[min(r, len(choice.costs)) - 1] for choice in choices)

    low, high = 1, max(len(choice.costs) for choice in choices)
    while low < high:  # the largest r with total(r) <= limit; total grows with r
        mid = (low + high + 1) // 2
        low, high = (mid, high) if total(mid) <= limit else (low, mid - 1)
    return [min(low, len(choice.costs)) for choice in choices]


def choose_ranks(choices: Sequence[RankChoices], budget: Budget, *, spectrum: bool) -> tuple[list[int], BudgetUse]:
    """Ranks for the layers of ``choices`` under ``budget`` and the books of what they spend.

    Args:
        choices: one entry per candidate layer.
        budget: the budget; a fraction is taken of the summed dense costs.
        spectrum: water-fill the gains (else one uniform rank).
    """
    dense = sum(choice.dense for choice in choices)
    limit = budget.limit(dense)
    ranks = water_fill(choices, limit) if spectrum else uniform_ranks(choices, limit)
    used = sum(choice.costs[r - 1] for choice, r in zip(choices, ranks, strict=True))
    allocation = "spectrum" if spectrum else "uniform"
    return ranks, BudgetUse(kind=budget.kind, allocation=allocation, dense=dense, limit=limit, used=used)


def dense_linear_flops(d_in: int, d_out: int) -> int:
    """Forward FLOPs per token of a dense ``d_in → d_out`` linear layer, as ``torch.utils.flop_counter`` counts
    them (2 per multiply-add; the bias add is not counted)."""
    return 2 * d_in * d_out
