"""CoMERA's tensor-train linear layer.

CoMERA: Yang, Liu, Choudhary, Xie, Gao, Kunzmann, Zhang, "CoMERA: Computing- and Memory-Efficient Training via
Rank-Adaptive Tensor Optimization", NeurIPS 2024, arXiv 2405.14377: tensor-compressed layers and the table of
tensorization settings (paper p.16) and its official code (``layers.py``, ``MNLI_trainer.py``), which we followed line
by line.

Layout (as the official code): ``y = x W + b`` with ``W ∈ R^{d_in×d_out}`` (the transpose of ``nn.Linear.weight``),
reshaped row-major to ``[n_1..n_d ‖ n_{d+1}..n_{2d}]`` (input modes, then output modes) and stored as 3-way cores
``G_k ∈ R^{r_{k-1}×n_k×r_k}``, ``r_0 = r_{2d} = 1``. Any number of cores works (the official layer: 6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from tensorslim._checks import check_fields, require_int
from tensorslim.budget import Budget, RankChoices, dense_linear_flops
from tensorslim.decomp.shapes import check_factors, factorize
from tensorslim.decomp.svd import squared_singular_values
from tensorslim.decomp.tt import full_rank_bounds, tt_matrix_svd
from tensorslim.functional.tt import (
    apply_gates,
    factored_linear,
    tt_factors_many,
    tt_linear_factors,
    tt_linear_flops,
)
from tensorslim.layers._source import (
    allocate_ranks,
    dense_linear,
    factored_like,
    is_dense_linear,
    linear_shape,
    linear_weight,
    replacement_report,
    require_weights,
    resolve_for,
    uniform_bias_,
)
from tensorslim.registry import Allocation, LayerReport, Transform, register_transform

Init = Literal["tt_svd", "random"]
GATE_THRESHOLD = 1e-2  # CoMERA prunes a rank when its gate falls to ≤ 1e-2 (``MNLI_trainer.py``)
DEFAULT_RANK = 30  # CoMERA ``--max-rank`` in ``run_MNLI.sh``
# Core contractions of more FLOPs than this run at the intra-op thread count (tt_factors): CoMERA's 30,522-wide MLM
# head contracts its cores in 57 MFLOP, 3.8 ms forward + backward of the main thread's CPU time at two threads against
# 5.4 ms at one; a 768 × 3072 layer's 7.2 MFLOP took 0.76 ms at two and 0.63 ms at one.
ONE_THREAD_MAX_FLOPS = 1 << 24


def check_tt_rank(rank: object) -> None:
    """Raise ``ValueError`` unless ``rank`` is an integer >= 1 (every internal bond) or a full rank list."""
    if isinstance(rank, bool) or not isinstance(rank, int | tuple | list) or (isinstance(rank, int) and rank < 1):
        raise ValueError(f"rank={rank!r} is invalid; allowed: an integer >= 1 or a full rank list")


def check_tt_config(config: Any, *, decomposed: str) -> None:
    """The checks every TT config shares: its fields' types, ``rank`` (:func:`check_tt_rank`), ``n_cores >= 2``
    and ``init``: the decomposition ``decomposed`` (``"tt_svd"``, ``"ttm_svd"``) or ``"random"``."""
    check_fields(config)
    check_tt_rank(config.rank)
    require_int("n_cores", config.n_cores, minimum=2)
    if config.init not in (decomposed, "random"):
        raise ValueError(f"init={config.init!r} is invalid; allowed: {decomposed!r} or 'random'")


def resolve_ranks(rank: int | tuple[int, ...], dims: tuple[int, ...]) -> tuple[int, ...]:
    """Full rank list ``(1, r_1, …, r_{k-1}, 1)`` for cores with mode sizes ``dims``.

    An integer is a maximum for every internal bond, clipped to the full-rank bound ``min(∏ left, ∏ right)`` (so
    r=30 over ``[12,8,8 ‖ 8,8,12]`` gives CoMERA's ``[1,12,30,30,30,12,1]``). A tuple is taken as is; it must have
    ``len(dims)+1`` entries with boundary 1s and internal entries in ``1..bound``.
    """
    bounds = full_rank_bounds(dims)
    if isinstance(rank, int) and not isinstance(rank, bool):
        if rank < 1:
            raise ValueError(f"rank={rank} is invalid; allowed: an integer >= 1 or a full rank list")
        return (1, *(min(rank, bound) for bound in bounds), 1)
    ranks = tuple(rank)
    if len(ranks) != len(dims) + 1:
        raise ValueError(
            f"rank={list(ranks)} has {len(ranks)} entries; {len(dims)} cores need {len(dims) + 1} (with 1 at both ends)"
        )
    if any(isinstance(r, bool) or not isinstance(r, int) for r in ranks) or ranks[0] != 1 or ranks[-1] != 1:
        raise ValueError(f"rank={list(ranks)} is invalid; allowed: integers with 1 at both ends")
    for k, (r, bound) in enumerate(zip(ranks[1:-1], bounds, strict=True), start=1):
        if not 1 <= r <= bound:
            raise ValueError(f"rank={list(ranks)}: bond {k} has rank {r}; allowed 1..{bound} for modes {list(dims)}")
    return ranks


@dataclass(frozen=True, kw_only=True)
class TTConfig:
    """How ``convert_`` turns a dense linear layer into a :class:`TTLinear`.

    Attributes:
        rank: maximum internal TT rank (CoMERA ``--max-rank``, 30 in ``run_MNLI.sh``), or a full list with boundary
            1s for explicit control.
        n_cores: number of cores when the factors are chosen automatically; half carry input modes (CoMERA: 6).
        in_factors: explicit input modes (∏ = d_in); default: balanced, descending (768 → 12·8·8).
        out_factors: explicit output modes (∏ = d_out); default: balanced, ascending (768 → 8·8·12).
        init: ``"tt_svd"`` decomposes the dense weight (pretrained models); ``"random"`` is CoMERA's Gaussian init
            (official ``layers.py``) for training from scratch.
        rank_gates: attach CoMERA's diagonal rank gates (§2.1) at construction.
        budget: a :class:`~tensorslim.budget.Budget` from which ``convert_``/``plan`` choose each layer's maximum
            rank (by the TT-SVD error bound of the weight's unfoldings for ``init="tt_svd"``, else one uniform
            maximum rank); ``rank`` must then stay at its default.
    """

    rank: int | tuple[int, ...] = DEFAULT_RANK
    n_cores: int = 6
    in_factors: tuple[int, ...] | None = None
    out_factors: tuple[int, ...] | None = None
    init: Init = "tt_svd"
    rank_gates: bool = False
    budget: Budget | None = None

    def __post_init__(self) -> None:
        check_tt_config(self, decomposed="tt_svd")
        if self.budget is not None and not isinstance(self.budget, Budget):
            raise ValueError(f"budget={self.budget!r} is invalid; allowed: None or a Budget, e.g. Budget(params=0.5)")
        if self.budget is not None and self.rank != DEFAULT_RANK:
            raise ValueError(f"rank={self.rank} and budget={self.budget} both given; allowed: one of them")

    def resolve_factors(self, d_in: int, d_out: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Input and output modes for a ``d_in → d_out`` layer."""
        n_in = len(self.in_factors) if self.in_factors else self.n_cores // 2
        n_out = len(self.out_factors) if self.out_factors else self.n_cores - n_in
        if n_out < 1:
            raise ValueError(f"in_factors={self.in_factors} leaves no core for the output modes; allowed: fewer")
        in_factors = tuple(self.in_factors) if self.in_factors else factorize(d_in, n_in, order="descending")
        out_factors = tuple(self.out_factors) if self.out_factors else factorize(d_out, n_out, order="ascending")
        check_factors("in_factors", in_factors, at_least=d_in)
        check_factors("out_factors", out_factors, at_least=d_out)
        return in_factors, out_factors

    def resolve(self, d_in: int, d_out: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """``(in_factors, out_factors, ranks)`` for a ``d_in → d_out`` layer; raises a one-line ``ValueError``."""
        if self.budget is not None:
            raise ValueError("a budget chooses ranks across a model's layers; allowed: convert_/plan, or rank=")
        in_factors, out_factors = self.resolve_factors(d_in, d_out)
        return in_factors, out_factors, resolve_ranks(self.rank, in_factors + out_factors)


class GatedCores(nn.Module):
    """TT cores (``cores``, the bond on each core's last axis) with CoMERA's optional rank gates (``gates``, one
    vector per internal bond, §2.1): shared by :class:`TTLinear` and the TT embedding, which create both."""

    cores: nn.ParameterList
    gates: nn.ParameterList
    gate_threshold: float

    def enable_gates(self, *, threshold: float = GATE_THRESHOLD) -> None:
        """Attach one all-ones gate vector per internal bond (CoMERA's rank controls, §2.1); idempotent."""
        self.gate_threshold = threshold
        if len(self.gates) == 0:
            for core in self.cores[:-1]:
                self.gates.append(nn.Parameter(torch.ones(core.shape[-1], device=core.device, dtype=core.dtype)))

    def effective_cores(self) -> list[torch.Tensor]:
        """Cores with the gate masks folded in (identical to the cores when no gates are attached)."""
        return apply_gates(list(self.cores), list(self.gates), threshold=self.gate_threshold)


class TTLinear(GatedCores):
    """``y = x W + b`` with ``W`` in CoMERA's TT format; the forward never forms ``W`` (CoMERA §3, contraction
    paths).

    Args:
        in_factors: input modes ``n_1..n_d`` (∏ = in_features).
        out_factors: output modes (∏ = out_features).
        ranks: full rank list ``(1, r_1, …, 1)`` of length ``len(in_factors)+len(out_factors)+1``.
        bias: learn an additive bias (CoMERA: ``U(-1/√d_out, 1/√d_out)`` init).

    Attributes:
        cores: ``nn.ParameterList`` of ``(r_{k-1}, n_k, r_k)`` cores.
        gates: ``nn.ParameterList`` of one rank-gate vector per internal bond, empty until
            :meth:`enable_gates` (CoMERA's "diagonal rank controls", §2.1).
    """

    def __init__(
        self,
        in_factors: tuple[int, ...],
        out_factors: tuple[int, ...],
        ranks: tuple[int, ...],
        *,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.in_factors, self.out_factors = tuple(in_factors), tuple(out_factors)
        dims = self.in_factors + self.out_factors
        self.in_features, self.out_features = math.prod(self.in_factors), math.prod(self.out_factors)
        ranks = resolve_ranks(tuple(ranks), dims)
        factory = {"device": device, "dtype": dtype}
        self.cores = nn.ParameterList(
            nn.Parameter(torch.empty(r0, n, r1, **factory))
            for r0, n, r1 in zip(ranks[:-1], dims, ranks[1:], strict=True)
        )
        self.gates = nn.ParameterList()
        self.gate_threshold = GATE_THRESHOLD
        self.bias = nn.Parameter(torch.empty(self.out_features, **factory)) if bias else None
        self.reset_parameters()

    @property
    def ranks(self) -> tuple[int, ...]:
        """Current (possibly truncated) rank list with boundary 1s."""
        return (1, *(core.shape[-1] for core in self.cores))

    @property
    def n_in(self) -> int:
        return len(self.in_factors)

    def reset_parameters(self) -> None:
        """CoMERA init (``TensorTrain.build_factors_Gaussian``, ``layers.py`` L247-265):
        ``G_k ~ N(0,1)/√r_k · σ^{1/order}`` with ``σ = √(1/(d_in+d_out))``, bias ``U(±1/√d_out)``."""
        target_sdv = (1.0 / (self.in_features + self.out_features)) ** 0.5
        scale = target_sdv ** (1.0 / len(self.cores))
        with torch.no_grad():
            for core in self.cores:
                core.normal_().mul_(scale / math.sqrt(core.shape[-1]))
        uniform_bias_(self.bias, self.out_features)

    def factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``L (d_in, r_mid)`` and ``R (r_mid, d_out)`` of ``W = L R`` from the gated cores (:func:`tt_factors`)."""
        return tt_factors((self,))[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return factored_linear(x, [self.factors()], [self.bias])[0]  # (..., d_out), as tt_linear

    @staticmethod
    def apply_many(x: torch.Tensor, layers: tuple[TTLinear, ...]) -> list[torch.Tensor]:
        """``[layer(x) for layer in layers]`` for TT layers that read the same ``x`` (attention's q, k and v).

        Layers of one input width run as one factored product: one GEMM reads ``x`` for all their latents and one
        forms ``∂x`` (:func:`~tensorslim.functional.tt.factored_linear`). The result equals the layers applied one by
        one, up to float rounding; forward hooks of the layers do not run then.
        """
        if len({layer.in_features for layer in layers}) > 1:
            return [layer(x) for layer in layers]
        return factored_linear(x, tt_factors(layers), [layer.bias for layer in layers])

    @classmethod
    def from_dense(cls, module: nn.Module, config: TTConfig | None = None) -> TTLinear:
        """Build from an ``nn.Linear`` or GPT-2 ``Conv1D``: TT-SVD of the weight (``init="tt_svd"``) or CoMERA's
        random init. At full ranks the TT-SVD reproduces the dense layer exactly; the bias is copied."""
        config = config or TTConfig()
        layer, (in_factors, out_factors, ranks), weight = factored_like(cls, module, config)  # weight: (d_out, d_in)
        if config.init == "tt_svd":
            require_weights(weight, config.init)
            cores = tt_matrix_svd(weight.t(), in_factors, out_factors, ranks[1:-1])
            with torch.no_grad():
                for param, core in zip(layer.cores, cores, strict=True):
                    param.copy_(core)
                if module.bias is not None:
                    layer.bias.copy_(module.bias)
        if config.rank_gates:
            layer.enable_gates()
        return layer

    def weight_matrix(self) -> torch.Tensor:
        """``W = L R`` of shape ``(d_in, d_out)`` (debug/export only; the forward never calls it)."""
        left, right = tt_linear_factors(self.effective_cores(), n_in=self.n_in)
        return left @ right

    def to_dense(self) -> nn.Linear:
        """The equivalent ``nn.Linear`` (gates folded in)."""
        with torch.no_grad():
            return dense_linear(self.weight_matrix().t(), self.bias)

    @staticmethod
    def count_params(dims: tuple[int, ...], ranks: tuple[int, ...], *, bias: int = 0) -> int:
        """Core parameters ``Σ r_{k-1} n_k r_k`` plus ``bias`` (pass ``d_out`` for a biased layer)."""
        return sum(r0 * n * r1 for r0, n, r1 in zip(ranks[:-1], dims, ranks[1:], strict=True)) + bias

    def num_params(self) -> int:
        """Parameters of cores, gates and bias, i.e. ``sum(p.numel() for p in self.parameters())``."""
        gates = sum(gate.numel() for gate in self.gates)
        bias = self.out_features if self.bias is not None else 0
        return self.count_params(self.in_factors + self.out_factors, self.ranks, bias=bias) + gates

    def flops(self, tokens: int) -> int:
        """Forward matmul FLOPs for ``tokens`` rows as ``torch.utils.flop_counter`` counts them: the two planned
        half-chains (token-independent) plus ``2·tokens·r_mid·(d_in+d_out)``."""
        return tt_linear_flops(self.in_factors, self.out_factors, self.ranks, tokens=tokens)

    def extra_repr(self) -> str:
        return (
            f"in_factors={list(self.in_factors)}, out_factors={list(self.out_factors)}, ranks={list(self.ranks)}, "
            f"bias={self.bias is not None}, gates={len(self.gates) > 0}"
        )


def tt_factors(layers: tuple[TTLinear, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(L, R)`` of each layer (:func:`~tensorslim.functional.tt.tt_linear_factors` of its gated cores).

    On CPU the contractions run with a written-out backward (:func:`~tensorslim.functional.tt.tt_factors_many`):
    autograd would record and replay dozens of tiny ops per layer. Up to :data:`ONE_THREAD_MAX_FLOPS` they also run
    on one thread in forward and in backward, because at more threads each tiny GEMM would open OpenMP parallel
    regions that cost more than the GEMM. While ``torch.compile`` traces, and on other
    devices, autograd records the contractions as they are.
    """
    if torch.compiler.is_compiling() or any(layer.cores[0].device.type != "cpu" for layer in layers):
        return [tt_linear_factors(layer.effective_cores(), n_in=layer.n_in) for layer in layers]
    single = sum(layer.flops(0) for layer in layers) <= ONE_THREAD_MAX_FLOPS
    return tt_factors_many([(layer.effective_cores(), layer.n_in) for layer in layers], single_thread=single)


def plan_tt_linear(name: str, module: nn.Module, config: TTConfig) -> LayerReport:
    """The ``convert_`` report row for replacing ``module`` by a :class:`TTLinear` (nothing is built)."""
    in_factors, out_factors, ranks = resolve_for(name, module, config.resolve)
    bias = linear_shape(module)[1] if module.bias is not None else 0  # d_out
    gates = sum(ranks[1:-1]) if config.rank_gates else 0
    return replacement_report(
        name,
        module,
        new_shape=f"TT {list(in_factors)}|{list(out_factors)} r={list(ranks)}",
        rank=max(ranks),
        params_after=TTLinear.count_params(in_factors + out_factors, ranks, bias=bias) + gates,
    )


def tt_unfolding_gains(weight: torch.Tensor, dims: tuple[int, ...]) -> list[float]:
    """``gains[r-1]``: how much raising every bond's maximum rank from r to r+1 lowers the TT-SVD error bound.

    TT-SVD's error obeys ``‖W − TT‖² ≤ Σ_k ε_k²`` (Oseledets 2011, "Tensor-Train Decomposition", Thm 2.2), where
    ``ε_k²`` is the squared tail of the k-th unfolding's spectrum past rank ``r_k``; a step of the maximum rank adds
    ``σ_{r+1}²`` of every unfolding whose bond still grows.

    Args:
        weight: ``(d_in, d_out)`` (the transpose of ``nn.Linear.weight``), reshaped row-major to ``dims``.
        dims: input then output modes.
    """
    bounds = full_rank_bounds(dims)
    gains = torch.zeros(max(bounds) - 1, dtype=torch.float64)
    for k, bound in enumerate(bounds, start=1):
        spectrum = squared_singular_values(weight.reshape(math.prod(dims[:k]), -1))  # (bound,)
        gains[: bound - 1] += spectrum[1:bound]
    return gains.tolist()


def tt_choices(module: nn.Module, config: TTConfig, *, spectrum: bool) -> RankChoices:
    """A dense linear layer's cost as a :class:`TTLinear` at each maximum rank 1..max bond bound (its own books,
    gates included), and the gain of each step (:func:`tt_unfolding_gains`) when ``spectrum``."""
    budget = config.budget
    if budget.kind == "bytes":
        raise ValueError("Budget(bytes=...) is not supported by TTConfig; allowed: params or flops")
    d_in, d_out = linear_shape(module)
    in_factors, out_factors = config.resolve_factors(d_in, d_out)
    dims = in_factors + out_factors
    bias = d_out if module.bias is not None else 0
    costs = []
    for r in range(1, max(full_rank_bounds(dims)) + 1):
        ranks = resolve_ranks(r, dims)
        if budget.kind == "params":
            gates = sum(ranks[1:-1]) if config.rank_gates else 0
            costs.append(TTLinear.count_params(dims, ranks, bias=bias) + gates)
        else:
            costs.append(tt_linear_flops(in_factors, out_factors, ranks, tokens=budget.tokens) / budget.tokens)
    dense = d_in * d_out + bias if budget.kind == "params" else dense_linear_flops(d_in, d_out)
    gains = tt_unfolding_gains(linear_weight(module)[0].t(), dims) if spectrum else None
    return RankChoices(costs, dense, gains)


def allocate_tt(model: nn.Module, candidates: list[tuple[str, nn.Module]], config: TTConfig) -> Allocation:
    """One maximum TT rank per candidate layer under ``config.budget`` (see :mod:`tensorslim.budget`): water-filling
    of the TT-SVD error bound for ``init="tt_svd"`` on real weights, else the one uniform maximum rank that fits."""
    return allocate_ranks(
        candidates,
        config,
        decomposing_init="tt_svd",
        choices=lambda _name, module, spectrum: tt_choices(module, config, spectrum=spectrum),
    )


def tt_fields(layer: TTLinear) -> dict[str, Any]:
    """The :class:`TTConfig` fields that rebuild the built ``layer`` (shared by LaX-TT)."""
    return {
        "rank": tuple(layer.ranks),  # the current ranks, CoMERA-truncated or not
        "n_cores": len(layer.cores),
        "in_factors": tuple(layer.in_factors),
        "out_factors": tuple(layer.out_factors),
        "init": "random",
        "rank_gates": len(layer.gates) > 0,
    }


def describe_tt(model: nn.Module, name: str, layer: TTLinear) -> tuple[TTConfig, dict[str, Any]]:
    """The config that rebuilds ``layer`` with its current ranks, and its rank-gate threshold."""
    return TTConfig(**tt_fields(layer)), {"gate_threshold": layer.gate_threshold}


def restore_tt(layer: TTLinear, state: dict[str, Any]) -> None:
    """Set the rank-gate threshold :func:`describe_tt` recorded."""
    layer.gate_threshold = state["gate_threshold"]


register_transform(
    TTConfig,
    Transform(
        is_dense_linear,
        plan_tt_linear,
        TTLinear.from_dense,
        allocate=allocate_tt,
        layer_type=TTLinear,
        describe=describe_tt,
        restore=restore_tt,
    ),
)
