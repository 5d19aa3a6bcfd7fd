"""COMQ against independent references: residual form, brute-force 1-D minimization and least squares."""

from __future__ import annotations

import itertools

import pytest
import torch

from tensorslim.quant import (
    COMQConfig,
    GPTQConfig,
    RTNConfig,
    comq_quantize,
    gptq_quantize,
    minmax_grid,
    rtn_quantize,
)
from tensorslim.quant.calibration import relative_output_error
from tensorslim.quant.comq import comq_sweep, coordinate_order, layer_objective, optimal_scale
from tensorslim.quant.quantizer import QuantResult, quantize_codes


def _data(n: int = 200, d: int = 20, out: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64) @ torch.randn(d, d, generator=g, dtype=torch.float64)
    x[:, 0] *= 5  # an outlier channel, as in real activations
    w = torch.randn(out, d, generator=g, dtype=torch.float64)
    return x, w


def _residual_form_comq(
    x: torch.Tensor,
    w: torch.Tensor,
    bits: int,
    sweeps: int,
    order: str = "greedy",
    *,
    start: QuantResult | None = None,
) -> torch.Tensor:
    """The release's loop (compress.md §1.2): explicit residual u = X(W − Q)ᵀ, one coordinate of one row at a time,
    fixed scale; from ``Q = W`` (the release) or from ``start``'s codes and grid."""
    grid = minmax_grid(w, bits=bits) if start is None else start.grid
    h = x.T @ x
    perm = coordinate_order(w, h, order)
    q = w.clone() if start is None else start.dequantize(dtype=torch.float64)
    u = x @ (w - q).T  # (n, out)
    for _ in range(sweeps):
        for t in range(w.shape[1]):
            for j in range(w.shape[0]):
                i = int(perm[j, t])
                u[:, j] -= x[:, i] * (w[j, i] - q[j, i])
                target = w[j, i] + x[:, i] @ u[:, j] / (x[:, i] @ x[:, i])
                code = torch.clamp(torch.round(target / grid.scale[j, 0]) + grid.zero[j, 0], 0, grid.maxq)
                q[j, i] = grid.scale[j, 0] * (code - grid.zero[j, 0])
                u[:, j] += x[:, i] * (w[j, i] - q[j, i])
    return q


def test_gram_form_equals_residual_form() -> None:
    x, w = _data()
    for sweeps in (1, 2):
        config = COMQConfig(bits=3, init="float", order="greedy", sweeps=sweeps, update_scale=False)  # the release
        got = comq_quantize(w, x.T @ x, config)
        ref = _residual_form_comq(x, w, 3, sweeps)
        assert torch.max(torch.abs(got.dequantize(dtype=torch.float64) - ref)) < 1e-10


def test_each_coordinate_step_is_the_brute_force_optimum() -> None:
    # after a full sweep the codes are a coordinate-wise minimum of a second sweep's first step: check by trying
    # every code of every coordinate of row 0 (the objective is separable over rows)
    x, w = _data(d=8, out=2)
    h = x.T @ x
    result = comq_quantize(w, h, COMQConfig(bits=2, sweeps=4, update_scale=False))
    q = result.dequantize(dtype=torch.float64)
    best = layer_objective(w, q, h)
    grid = result.grid
    for i, code in itertools.product(range(8), range(4)):
        trial = q.clone()
        trial[0, i] = grid.scale[0, 0] * (code - grid.zero[0, 0])
        assert layer_objective(w, trial, h) >= best - 1e-9


@pytest.mark.parametrize("order", ["greedy", "cyclic"])
@pytest.mark.parametrize("granularity", ["channel", "layer"])
def test_objective_never_increases_across_sweeps(order: str, granularity: str) -> None:
    x, w = _data(seed=3)
    h = x.T @ x
    for update_scale in (False, True):
        objectives = []
        for sweeps in range(1, 6):
            config = COMQConfig(bits=3, sweeps=sweeps, order=order, granularity=granularity, update_scale=update_scale)
            objectives.append(layer_objective(w, comq_quantize(w, h, config).dequantize(dtype=torch.float64), h))
        assert all(b <= a * (1 + 1e-12) for a, b in zip(objectives, objectives[1:], strict=False)), objectives


@pytest.mark.parametrize("granularity", ["channel", "layer"])
def test_scale_update_is_the_least_squares_optimum(granularity: str) -> None:
    x, w = _data(seed=4)
    h = x.T @ x
    grid = minmax_grid(w, bits=3, granularity=granularity)
    codes = quantize_codes(w, grid)
    c = codes.to(torch.float64) - grid.zero  # (out, d)
    scale = optimal_scale(w, codes, grid, h, granularity=granularity)
    if granularity == "channel":  # lstsq of X wᵀ ≈ (X cᵀ) δ per row
        for j in range(w.shape[0]):
            ref = torch.linalg.lstsq((x @ c[j])[:, None], x @ w[j]).solution
            assert torch.allclose(scale[j], ref, rtol=1e-9)
    else:  # one δ for all rows: stack the rows' systems
        a = (x @ c.T).T.reshape(-1, 1)
        ref = torch.linalg.lstsq(a, (x @ w.T).T.reshape(-1)).solution
        assert torch.allclose(scale, ref.expand_as(scale), rtol=1e-9)
    # and it never loses against the min/max scale
    before = layer_objective(w, grid.scale * c, h)
    assert layer_objective(w, scale * c, h) <= before


def test_greedy_order_sorts_by_column_norm_times_weight() -> None:
    x, w = _data(d=6, out=3)
    h = x.T @ x
    perm = coordinate_order(w, h, "greedy")
    norms = torch.linalg.norm(x, dim=0)
    for j in range(3):
        assert perm[j].tolist() == torch.argsort(norms * w[j].abs(), descending=True).tolist()


def test_dead_inputs_are_harmless() -> None:
    x, w = _data()
    x[:, 5] = 0.0
    result = comq_quantize(w, x.T @ x, COMQConfig(bits=4, sweeps=2))
    assert torch.isfinite(result.grid.scale).all()
    assert result.dequantize(dtype=torch.float64)[:, 5].abs().max() <= result.grid.scale.max()


def test_eight_bits_is_near_lossless_and_four_bits_beats_rtn() -> None:
    x, w = _data(n=400, d=32, out=12, seed=7)
    h = x.T @ x
    err = {}
    for name, result in {
        "comq8": comq_quantize(w, h, COMQConfig(bits=8)),
        "comq4": comq_quantize(w, h, COMQConfig(bits=4, sweeps=3)),
        "rtn4": QuantResult(*_rtn(w)),
        "gptq4": gptq_quantize(w, h, GPTQConfig(bits=4)),
    }.items():
        err[name] = relative_output_error(w, result.dequantize(dtype=torch.float64), h)
    assert err["comq8"] < 0.01
    assert err["comq4"] < err["rtn4"]


def _rtn(w: torch.Tensor) -> tuple[torch.Tensor, object]:
    r = rtn_quantize(w, None, RTNConfig(bits=4))
    return r.codes, r.grid


def test_sweep_updates_in_place_consistently() -> None:
    x, w = _data(d=10, out=4)
    h = x.T @ x
    grid = minmax_grid(w, bits=3)
    residual = torch.zeros_like(w)
    codes = torch.zeros_like(w, dtype=torch.uint8)
    comq_sweep(w, h, residual, codes, grid, coordinate_order(w, h, "greedy"))
    assert torch.allclose(residual, w - grid.scale * (codes.to(torch.float64) - grid.zero))


@pytest.mark.parametrize("order", ["greedy", "cyclic"])
@pytest.mark.parametrize("block", [1, 3, 7, 64])
def test_blocked_sweep_equals_residual_form_for_any_block(block: int, order: str) -> None:
    x, w = _data(d=20)
    h = x.T @ x
    grid = minmax_grid(w, bits=3)
    perm = coordinate_order(w, h, order)
    residual = torch.zeros_like(w)
    codes = torch.zeros_like(w, dtype=torch.uint8)
    for _ in range(2):  # the second sweep starts from a nonzero residual
        comq_sweep(w, h, residual, codes, grid, perm, block=block)
    ref = _residual_form_comq(x, w, 3, 2, order)
    assert torch.max(torch.abs((w - residual) - ref)) < 1e-10


@pytest.mark.parametrize("order", ["greedy", "cyclic"])
def test_descent_from_gptq_equals_the_residual_loop_started_at_gptq(order: str) -> None:
    x, w = _data(seed=5)
    h = x.T @ x
    start = gptq_quantize(w, h, GPTQConfig(bits=3))
    got = comq_quantize(w, h, COMQConfig(bits=3, init="gptq", order=order, sweeps=2, update_scale=False))
    ref = _residual_form_comq(x, w, 3, 2, order, start=start)
    assert torch.max(torch.abs(got.dequantize(dtype=torch.float64) - ref)) < 1e-10


def test_default_is_one_cyclic_sweep_from_gptq_then_the_least_squares_scale() -> None:
    x, w = _data(seed=6)
    h = x.T @ x
    got = comq_quantize(w, h, COMQConfig(bits=4))
    q = _residual_form_comq(x, w, 4, 1, "cyclic", start=gptq_quantize(w, h, GPTQConfig(bits=4)))
    grid = gptq_quantize(w, h, GPTQConfig(bits=4)).grid
    c = torch.round(q / grid.scale)  # centred codes (code − zero) of the swept Q, (out, d)
    for j in range(w.shape[0]):  # the scale of each row: lstsq of X wᵀ ≈ (X cᵀ) δ
        delta = torch.linalg.lstsq((x @ c[j])[:, None], x @ w[j]).solution
        assert torch.allclose(got.dequantize(dtype=torch.float64)[j], delta * c[j], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("init", ["gptq", "rtn"])
@pytest.mark.parametrize("granularity", ["channel", "layer"])
def test_descent_never_ends_above_its_start(init: str, granularity: str) -> None:
    x, w = _data(n=300, d=24, out=8, seed=8)
    h = x.T @ x
    for bits in (2, 3, 4):
        common = {"bits": bits, "granularity": granularity}
        start = (
            gptq_quantize(w, h, GPTQConfig(**common)) if init == "gptq" else rtn_quantize(w, None, RTNConfig(**common))
        )
        before = layer_objective(w, start.dequantize(dtype=torch.float64), h)
        for order, update_scale in itertools.product(("greedy", "cyclic"), (False, True)):
            config = COMQConfig(bits=bits, granularity=granularity, init=init, order=order, update_scale=update_scale)
            after = layer_objective(w, comq_quantize(w, h, config).dequantize(dtype=torch.float64), h)
            assert after <= before * (1 + 1e-12), (bits, order, update_scale, after, before)
