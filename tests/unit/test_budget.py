"""Ranks by budget: water-filling against a brute-force optimum, the layers' own books against the budget, uniform
ranks for training from scratch, and one-line errors for bad budgets."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from tensorslim.budget import Budget, RankChoices, uniform_ranks, water_fill
from tensorslim.convert import convert_, plan
from tensorslim.decomp.tt import tt_matrix_svd, tt_to_full
from tensorslim.layers.cola_m import CoLAMConfig
from tensorslim.layers.lax import LaXCoLAConfig
from tensorslim.layers.lowrank import CoLAConfig, LowRankLinear, SVDConfig
from tensorslim.layers.tt import TTConfig, TTLinear
from tensorslim.models.llama import LlamaForCausalLM
from tests.helpers import TINY_LLAMA


def _linear_with_spectrum(d_in: int, d_out: int, spectrum: list[float], *, seed: int) -> nn.Linear:
    """A bias-free linear layer whose weight has exactly the singular values ``spectrum``."""
    gen = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(d_out, len(spectrum), generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(d_in, len(spectrum), generator=gen, dtype=torch.float64))
    layer = nn.Linear(d_in, d_out, bias=False, dtype=torch.float64)
    with torch.no_grad():
        layer.weight.copy_(u @ torch.diag(torch.tensor(spectrum, dtype=torch.float64)) @ v.T)
    return layer


def _toy(shapes: list[tuple[int, int]], seed: int) -> tuple[nn.Sequential, list[list[float]]]:
    gen = torch.Generator().manual_seed(seed)
    spectra = []
    for d_in, d_out in shapes:
        values = torch.rand(min(d_in, d_out), generator=gen, dtype=torch.float64) * 4 + 0.1
        spectra.append(sorted(values.tolist(), reverse=True))
    layers = [
        _linear_with_spectrum(d_in, d_out, s, seed=seed + i)
        for i, ((d_in, d_out), s) in enumerate(zip(shapes, spectra, strict=True))
    ]
    return nn.Sequential(*layers), spectra


def _brute_force_error(shapes: list[tuple[int, int]], spectra: list[list[float]], limit: float) -> float:
    """The least summed squared error ``Σ_i Σ_{j>r_i} σ_ij²`` over every rank tuple whose parameters fit ``limit``."""
    best = math.inf
    for ranks in itertools.product(*(range(1, min(shape) + 1) for shape in shapes)):
        cost = sum(
            LowRankLinear.count_params(d_in, d_out, r, bias=False)
            for (d_in, d_out), r in zip(shapes, ranks, strict=True)
        )
        if cost <= limit:
            best = min(best, sum(sum(v * v for v in s[r:]) for s, r in zip(spectra, ranks, strict=True)))
    return best


def _converted_error(dense: nn.Sequential, converted: nn.Sequential) -> float:
    """The measured squared Frobenius error of the converted layers against the dense weights."""
    return sum(
        (new.to_dense().weight - old.weight).pow(2).sum().item() for old, new in zip(dense, converted, strict=True)
    )


def test_water_filling_equals_brute_force_for_equal_step_costs() -> None:
    # d_in + d_out = 10 for every layer: each rank step costs the same, so the greedy is optimal at every budget.
    shapes = [(4, 6), (5, 5), (3, 7)]
    model, spectra = _toy(shapes, seed=1)
    floor, full = 30, 10 * sum(min(shape) for shape in shapes)
    for limit in range(floor, full + 1, 5):
        converted = _copy(model)
        report = convert_(converted, SVDConfig(budget=Budget(params=limit)))
        assert report.budget.used <= limit
        assert _converted_error(model, converted) == pytest.approx(_brute_force_error(shapes, spectra, limit), abs=1e-9)


def _copy(model: nn.Sequential) -> nn.Sequential:
    copied = nn.Sequential(*(nn.Linear(m.in_features, m.out_features, bias=False, dtype=torch.float64) for m in model))
    copied.load_state_dict(model.state_dict())
    return copied


def test_water_filling_is_optimal_for_what_it_spends_with_mixed_step_costs() -> None:
    shapes = [(4, 8), (6, 6), (3, 5)]
    model, spectra = _toy(shapes, seed=2)
    for limit in range(40, 150, 7):
        converted = _copy(model)
        report = convert_(converted, SVDConfig(budget=Budget(params=limit)))
        used = report.budget.used
        assert used <= limit
        assert limit - used < max(d_in + d_out for d_in, d_out in shapes)  # stops at most one step short
        assert _converted_error(model, converted) == pytest.approx(_brute_force_error(shapes, spectra, used), abs=1e-9)


def test_budget_fraction_or_absolute_count() -> None:
    assert Budget(params=0.25).limit(1000) == 250
    assert Budget(params=1).limit(1000) == 1000  # 1 is the whole dense cost
    assert Budget(params=5e6).limit(1000) == Budget(params=5_000_000).limit(1000) == 5_000_000


def test_water_fill_and_uniform_on_known_tables() -> None:
    flat = RankChoices(costs=[10, 20, 30], dense=30, gains=[1.0, 1.0])
    steep = RankChoices(costs=[10, 20, 30], dense=30, gains=[9.0, 0.0])
    assert water_fill([flat, steep], 35) == [1, 2]  # the big σ₂² first; the next step would need 40
    assert water_fill([flat, steep], 50) == [3, 2]  # a zero gain comes last
    assert uniform_ranks([flat, steep], 45) == [2, 2]
    assert uniform_ranks([flat, RankChoices(costs=[5], dense=5)], 100) == [3, 1]  # clipped to each layer's range


def _layers(model: nn.Module, kind: type) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, kind)]


@pytest.mark.parametrize("fraction", [0.3, 0.6])
@pytest.mark.parametrize("config_type", [SVDConfig, CoLAConfig])
def test_low_rank_budget_is_respected_by_the_layers_books(config_type: type, fraction: float) -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(TINY_LLAMA)
    dense = plan(model, config_type(rank=1))
    dense_params = dense.params_before
    report = convert_(model, config_type(budget=Budget(params=fraction)))
    built = _layers(model, LowRankLinear)
    used = sum(layer.num_params() for layer in built)
    assert report.budget.limit == pytest.approx(fraction * dense_params)
    assert used == report.budget.used == report.params_after <= fraction * dense_params
    assert fraction * dense_params - used < max(layer.in_features + layer.out_features for layer in built)
    assert len({layer.rank for layer in built}) > 1  # the spectra differ, so the ranks do
    assert "budget (params, spectrum ranks)" in report.table()


@pytest.mark.parametrize("tokens", [1, 64])
def test_flop_budget_is_respected_by_the_layers_books(tokens: int) -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(TINY_LLAMA)
    budget = Budget(flops=0.4, tokens=tokens)
    report = convert_(model, SVDConfig(budget=budget))
    built = _layers(model, LowRankLinear)
    dense_flops = sum(2 * layer.old_shape[0] * layer.old_shape[1] for layer in report.layers)
    used = sum(layer.flops(tokens) for layer in built) / tokens
    assert report.budget.dense == dense_flops
    assert used == report.budget.used <= 0.4 * dense_flops
    assert used > 0.4 * dense_flops - max(2 * (layer.in_features + layer.out_features) for layer in built)


@pytest.mark.parametrize("kind", ["params", "flops"])
def test_tt_budget_is_respected_by_the_layers_books(kind: str) -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(TINY_LLAMA)
    budget = Budget(**{kind: 0.5}, tokens=16)
    report = convert_(model, TTConfig(n_cores=4, rank_gates=True, budget=budget))
    built = _layers(model, TTLinear)
    books = [layer.num_params() if kind == "params" else layer.flops(16) / 16 for layer in built]
    assert sum(books) == pytest.approx(report.budget.used)
    assert report.budget.used <= report.budget.limit
    assert report.budget.used > 0.9 * report.budget.limit
    assert len({layer.ranks for layer in built}) > 1


def test_tt_spectrum_gives_an_exact_low_tt_rank_layer_no_more_than_its_rank() -> None:
    torch.manual_seed(0)
    in_factors, out_factors = (4, 4), (4, 4)
    low = nn.Linear(16, 16, bias=False, dtype=torch.float64)
    cores = tt_matrix_svd(torch.randn(16, 16, dtype=torch.float64), in_factors, out_factors, (2, 2, 2))
    with torch.no_grad():
        low.weight.copy_(tt_to_full(cores).reshape(16, 16).T)  # TT ranks (1, 2, 2, 2, 1)
    model = nn.Sequential(low, nn.Linear(16, 16, bias=False, dtype=torch.float64))
    dense = _copy(model)
    report = convert_(model, TTConfig(n_cores=4, budget=Budget(params=0.9)))
    assert [layer.rank for layer in report.layers][0] == 2
    assert torch.allclose(model[0].to_dense().weight, dense[0].weight, atol=1e-10)
    assert report.layers[1].rank > 2


def test_spectrum_beats_uniform_at_equal_parameters() -> None:
    fast = _linear_with_spectrum(8, 8, [2.0**-k for k in range(8)], seed=3)
    flat = _linear_with_spectrum(8, 8, [1.0] * 8, seed=4)
    dense = nn.Sequential(fast, flat)
    errors = {}
    for allocation in ("spectrum", "uniform"):
        model = _copy(dense)
        convert_(model, SVDConfig(budget=Budget(params=0.5, allocation=allocation)))
        errors[allocation] = _converted_error(dense, model)
    # The budget buys 4 ranks in all: uniform gives 2 and 2; the spectrum gives the flat layer 3 (gain 1 a step) and
    # the fast-decaying one 1 (its σ₂² is 1/4): squared errors 1/3 + 5 ≈ 5.33 against 1/12 + 6 ≈ 6.08.
    assert errors["spectrum"] == pytest.approx(sum(4.0**-k for k in range(1, 8)) + 5)
    assert errors["uniform"] == pytest.approx(sum(4.0**-k for k in range(2, 8)) + 6)


@pytest.mark.parametrize(
    ("config", "meta"),
    [(SVDConfig(init="random", budget=Budget(params=0.5)), False), (SVDConfig(budget=Budget(params=0.5)), True)],
)
def test_random_init_or_meta_weights_get_one_uniform_rank(config: SVDConfig, meta: bool) -> None:
    with torch.device("meta" if meta else "cpu"):
        model = LlamaForCausalLM(TINY_LLAMA)
    report = plan(model, config)
    ranks = {layer.rank for layer in report.layers}
    assert len(ranks) == 1 and report.budget.allocation == "uniform"
    (rank,) = ranks
    grown = sum(
        LowRankLinear.count_params(*layer.old_shape, rank + 1, bias=False) for layer in report.layers
    )  # one rank more would not fit
    assert report.budget.used <= report.budget.limit < grown


def test_tt_random_init_gets_one_uniform_max_rank() -> None:
    model = LlamaForCausalLM(TINY_LLAMA)
    report = plan(model, TTConfig(n_cores=4, init="random", budget=Budget(params=0.3)))
    assert len({layer.rank for layer in report.layers}) == 1
    assert report.budget.allocation == "uniform"


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Budget(), "exactly one"),
        (lambda: Budget(params=0.5, flops=0.5), "exactly one"),
        (lambda: Budget(params=0), "params=0 is invalid"),
        (lambda: Budget(flops=-2), "flops=-2 is invalid"),
        (lambda: Budget(params=True), "params=True is invalid"),
        (lambda: Budget(params="half"), "params='half' is invalid"),
        (lambda: Budget(params=float("nan")), "params=nan is invalid"),
        (lambda: Budget(params=1.2), "params=1.2 is invalid"),
        (lambda: Budget(flops=float("inf")), "flops=inf is invalid"),
        (lambda: Budget(params=0.5, allocation="best"), "allocation='best' is invalid"),
        (lambda: Budget(params=0.5, tokens=0), "tokens=0 is invalid"),
        (lambda: SVDConfig(budget=0.5), "budget=0.5 is invalid"),
        (lambda: SVDConfig(rank=8, budget=Budget(params=0.5)), "both given"),
        (lambda: TTConfig(rank=8, budget=Budget(params=0.5)), "both given"),
    ],
)
def test_bad_budgets_are_one_line_errors(make, match: str) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=match) as error:
        make()
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("config", "meta", "match"),
    [
        (SVDConfig(budget=Budget(params=10)), False, "below"),
        (CoLAMConfig(budget=Budget(params=0.5)), False, "not supported for CoLAMConfig"),
        (LaXCoLAConfig(budget=Budget(params=0.5)), False, "not supported for LaXCoLAConfig"),
        (SVDConfig(budget=Budget(params=0.5, allocation="spectrum")), True, "needs real weights"),
    ],
)
def test_budgets_that_cannot_be_met_are_one_line_errors(config: object, meta: bool, match: str) -> None:
    with torch.device("meta" if meta else "cpu"):
        model = LlamaForCausalLM(TINY_LLAMA)
    with pytest.raises(ValueError, match=match) as error:
        plan(model, config)
    assert "\n" not in str(error.value)


def test_from_dense_refuses_a_budget() -> None:
    with pytest.raises(ValueError, match="convert_/plan"):
        LowRankLinear.from_dense(nn.Linear(8, 8), SVDConfig(budget=Budget(params=0.5)))
