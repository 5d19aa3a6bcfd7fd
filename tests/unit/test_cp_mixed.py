"""Mixed-precision block SGD for CP (tensorslim.decomp.cp_mixed) against tensorly ALS and exact tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tensorslim.decomp._lowprec import FORMATS, ScaledBuffer, get_format, round_to_format
from tensorslim.decomp.cp_mixed import (
    _disjoint_block_tuples,
    _gather,
    _gather_mask,
    _khatri_rao,
    _mode_gradient,
    cp_mixed_precision,
)

tl = pytest.importorskip("tensorly")
parafac = pytest.importorskip("tensorly.decomposition").parafac

SHAPE, RANK, NOISE = (20, 20, 20), 3, 0.01
FAST = {"n_blocks": 5, "sign_epochs": 5, "epochs": 25}


def _low_rank(noise: float, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    factors = [torch.randn(s, RANK, generator=g) for s in SHAPE]
    exact = torch.einsum("ir,jr,kr->ijk", *factors)
    e = torch.randn(exact.shape, generator=g)
    return exact, exact + noise * e * exact.norm() / e.norm()


def _without_scales(nbytes: int) -> int:
    return nbytes - 4 * len(SHAPE)  # one float32 scale per mode's buffer


def _rel(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


@pytest.fixture(scope="module")
def noisy() -> torch.Tensor:
    return _low_rank(NOISE)[1]


@pytest.fixture(scope="module")
def als_error(noisy: torch.Tensor) -> float:
    x = noisy.double().numpy()
    cp = parafac(x, RANK, init="svd", n_iter_max=500, tol=1e-12)
    return _rel(tl.cp_to_tensor(cp), x)


@pytest.fixture(scope="module")
def fp32_run(noisy: torch.Tensor):
    return cp_mixed_precision(noisy, RANK, precision="fp32", **FAST)


# ------------------------------------------------------------------------------------------------ rounding


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp8_e4m3"])
def test_nearest_rounding_matches_torch_cast(name: str) -> None:
    fmt = get_format(name)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=g) * torch.exp2(torch.randint(-12, 6, (4096,), generator=g).float())
    x = x.clamp(-fmt.max_value / 2, fmt.max_value / 2)
    ours = round_to_format(x, fmt, stochastic=False)
    assert torch.equal(ours, x.to(fmt.dtype).float())


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp8_e4m3"])
def test_stochastic_rounding_is_representable_and_unbiased(name: str) -> None:
    fmt = get_format(name)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(64, generator=g) * 3 + 0.5  # (64,)
    draws = round_to_format(x.expand(4000, 64).contiguous(), fmt, generator=g)  # (4000, 64)
    assert torch.equal(draws, draws.to(fmt.dtype).float())  # exactly representable
    ulp = torch.exp2(torch.floor(torch.log2(x)) - (fmt.significand_bits - 1))
    assert ((draws - x).abs() < ulp).all()  # only the two neighbours
    # Unbiased: the mean is within 5 standard errors of x (std of one draw <= ulp / 2).
    assert ((draws.mean(0) - x).abs() <= 5 * (ulp / 2) / 4000**0.5).all()
    off_grid = round_to_format(x, fmt, stochastic=False) != x
    both = (draws > x).any(0) & (draws < x).any(0)
    assert both[off_grid].all()  # both neighbours occur: not a deterministic rounding


def test_scaled_buffer_fp8_keeps_small_values_out_of_subnormals() -> None:
    fmt = get_format("fp8_e4m3")
    values = torch.full((8, 2), 1e-4)  # far below fp8's smallest subnormal 2^-9 ~ 2e-3
    buf = ScaledBuffer(values, fmt, generator=torch.Generator().manual_seed(0))
    assert buf.data.dtype == torch.float8_e4m3fn
    assert torch.allclose(buf.dequantize(), values, rtol=2**-3)
    old_scale = buf.scale
    buf.write(torch.tensor([0, 1]), torch.full((2, 2), 1e-2))  # 100x larger: forces a rescale of the buffer
    assert buf.scale < old_scale
    assert torch.allclose(buf.dequantize()[2:], values[2:], rtol=2**-3)
    assert torch.allclose(buf.dequantize()[:2], torch.full((2, 2), 1e-2), rtol=2**-3)
    assert buf.nbytes == 16 + 4  # one byte per entry plus the float32 scale


def test_compensated_add_keeps_updates_below_half_an_ulp() -> None:
    fmt = get_format("bf16")  # ulp of 1.0 is 2^-7; each update is 1/78 of it, so nearest rounding drops it
    gen = torch.Generator().manual_seed(0)
    plain, summed = (
        ScaledBuffer(torch.ones(4, 2), fmt, generator=gen),
        ScaledBuffer(torch.ones(4, 2), fmt, generator=gen),
    )
    compensation = ScaledBuffer(torch.zeros(4, 2), fmt, generator=gen)
    rows, delta = torch.tensor([0, 2]), torch.full((2, 2), 1e-4)
    for _ in range(1000):
        plain.write(rows, plain.read(rows) + delta, stochastic=False)
        summed.add_compensated(rows, delta, compensation)
    assert torch.equal(plain.dequantize(), torch.ones(4, 2))  # every update lost
    exact = torch.tensor([1.1, 1.0, 1.1, 1.0])[:, None].expand(4, 2)  # the float64 sum, rows 0 and 2 updated
    assert torch.allclose(summed.dequantize() - compensation.dequantize(), exact, atol=1e-3)  # 1 % of the sum
    assert torch.equal(summed.dequantize(), round_to_format(exact.float(), fmt, stochastic=False))


def test_compensated_operand_is_an_unbiased_rounding_of_the_running_sum() -> None:
    # what the products read in compensated mode: stochastic rounding of stored - compensation
    fmt = get_format("bf16")
    gen = torch.Generator().manual_seed(1)
    stored = round_to_format(torch.rand(64, generator=gen) * 0.9 + 1.05, fmt, stochastic=False)  # (64,)
    compensation = round_to_format((torch.rand(64, generator=gen) - 0.5) * 2**-7, fmt, stochastic=False)
    latent = stored - compensation  # off the bf16 grid
    draws = round_to_format(latent.expand(4000, 64).contiguous(), fmt, generator=gen)  # (4000, 64)
    ulp = 2**-7
    assert ((draws - latent).abs() <= ulp).all()
    assert ((draws.mean(0) - latent).abs() <= 5 * (ulp / 2) / 4000**0.5).all()


# ------------------------------------------------------------------------------------------------ pieces


def test_block_tuples_cover_grid_once_with_disjoint_steps() -> None:
    blocks, n = 4, 3
    seen = []
    for which in _disjoint_block_tuples(blocks, n, torch.Generator().manual_seed(0)):
        for mode in which:  # disjoint: each block of each mode appears once per step
            assert sorted(mode.tolist()) == list(range(blocks))
        seen.extend(zip(*[w.tolist() for w in which], strict=True))
    assert sorted(seen) == sorted(np.ndindex(*(blocks,) * n))


def test_mode_gradient_matches_autograd() -> None:
    g = torch.Generator().manual_seed(0)
    b, q, r = 2, (3, 4, 2), 3
    current = [torch.randn(b, qi, r, generator=g, dtype=torch.float64) for qi in q]
    sub = torch.randn(b, *q, generator=g, dtype=torch.float64)
    masks = [torch.rand(b, qi, generator=g) > 0.2 for qi in q]
    sub_mask = _gather_mask(masks)
    for j in range(3):
        leaf = current[j].clone().requires_grad_(True)
        factors = [leaf if k == j else current[k] for k in range(3)]
        model = torch.einsum("bir,bjr,bkr->bijk", *factors)
        sq = torch.where(sub_mask, model - sub, 0.0) ** 2  # (B, q1, q2, q3)
        per_row = sq.movedim(1 + j, 1).reshape(b, q[j], -1)
        p = sub_mask.movedim(1 + j, 1).reshape(b, q[j], -1).sum(-1).clamp(min=1)
        (per_row.sum(-1) / p).sum().backward()
        ours = _mode_gradient(current, j, sub, sub_mask, lambda t: t)
        torch.testing.assert_close(ours, leaf.grad, rtol=1e-10, atol=1e-10)


def test_gather_and_khatri_rao_match_direct_indexing() -> None:
    g = torch.Generator().manual_seed(0)
    data = torch.randn(5, 6, 7, generator=g)
    rows = [torch.tensor([[0, 2], [4, 1]]), torch.tensor([[5, 3], [0, 0]]), torch.tensor([[6, 1], [2, 3]])]
    sub = _gather(data, rows)  # (2, 2, 2, 2)
    for b in range(2):
        assert torch.equal(sub[b], data[rows[0][b]][:, rows[1][b]][:, :, rows[2][b]])
    f1, f2 = torch.randn(1, 3, 2, generator=g), torch.randn(1, 4, 2, generator=g)
    kr = _khatri_rao([f1, f2])[0]  # (12, 2)
    ref = torch.stack([torch.kron(f1[0, :, r], f2[0, :, r]) for r in range(2)], dim=1)
    assert torch.allclose(kr, ref)


# ------------------------------------------------------------------------------------------------ end to end


def test_exact_low_rank_recovered_to_fp32_floor() -> None:
    exact, _ = _low_rank(0.0)
    res = cp_mixed_precision(exact, RANK, precision="fp32", **FAST)
    assert res.rel_error < 1e-5
    assert res.log[0].rel_error > 0.5  # from a random start, not from the answer


def test_fp32_reaches_the_als_noise_floor(fp32_run, als_error: float) -> None:
    assert als_error == pytest.approx(NOISE, rel=0.05)  # the floor is the noise level
    assert fp32_run.rel_error <= 1.01 * als_error
    stages = [entry.stage for entry in fp32_run.log]
    assert stages == ["init"] + ["sign"] * 5 + ["sgd"] * 25


def test_fp16_error_close_to_fp32(noisy: torch.Tensor, fp32_run, als_error: float) -> None:
    res = cp_mixed_precision(noisy, RANK, precision="fp16", **FAST)
    assert res.rel_error <= 1.05 * fp32_run.rel_error
    assert res.rel_error <= 1.1 * als_error
    for key in ("factors", "gradients", "momentum"):
        assert _without_scales(res.memory[key]) * 2 == fp32_run.memory[key]


def test_bf16_with_master_factors_close_to_fp32(noisy: torch.Tensor, fp32_run) -> None:
    res = cp_mixed_precision(noisy, RANK, precision="bf16", master_factors=True, **FAST)
    assert res.rel_error <= 1.05 * fp32_run.rel_error
    assert res.memory["factors"] == fp32_run.memory["factors"]  # master copy costs fp32 memory
    assert _without_scales(res.memory["gradients"]) * 2 == fp32_run.memory["gradients"]


def test_bf16_compensated_close_to_fp32_with_bf16_factors(noisy: torch.Tensor, fp32_run) -> None:
    plain = cp_mixed_precision(noisy, RANK, precision="bf16", **FAST)
    res = cp_mixed_precision(noisy, RANK, precision="bf16", compensated=True, **FAST)
    assert res.rel_error <= 1.05 * fp32_run.rel_error < plain.rel_error
    # the error is that of the bf16 factors alone: the reported factors are the stored ones
    assert res.rel_error == pytest.approx(_rel(res.to_tensor().numpy(), noisy.numpy()), rel=1e-3)
    assert _without_scales(res.memory["factors"]) * 2 == fp32_run.memory["factors"]
    assert res.memory["compensation"] == res.memory["factors"]  # the price: a second bf16 buffer


def test_compensated_excludes_master_factors() -> None:
    with pytest.raises(ValueError, match="compensated=True needs master_factors=False"):
        cp_mixed_precision(torch.ones(3, 3, 3), 2, precision="bf16", compensated=True, master_factors=True)


def test_fp8_runs_with_quarter_memory(noisy: torch.Tensor, fp32_run) -> None:
    res = cp_mixed_precision(noisy, RANK, precision="fp8_e4m3", **FAST)
    # 3 mantissa bits in the stored factors cap the accuracy far above the noise (about 5-7 % here).
    assert res.rel_error < 0.12
    assert res.rel_error < 0.2 * res.log[5].rel_error  # stage 2 still makes progress under fp8
    for key in ("factors", "gradients", "momentum"):
        assert _without_scales(res.memory[key]) * 4 == fp32_run.memory[key]


def test_result_follows_tensorly_convention() -> None:
    exact, _ = _low_rank(0.0)
    x = exact.numpy()
    res = cp_mixed_precision(x, RANK, precision="fp32", **FAST)
    weights, factors = res  # unpacks like a tensorly CPTensor
    assert isinstance(weights, np.ndarray) and [f.shape for f in factors] == [(s, RANK) for s in SHAPE]
    for f in factors:
        assert np.allclose(np.linalg.norm(f, axis=0), 1.0, atol=1e-5)
    recon = tl.cp_to_tensor(res.cp_tensor)
    assert _rel(recon, x) == pytest.approx(res.rel_error, rel=1e-2, abs=1e-6)
    assert np.allclose(res.to_tensor().numpy(), recon, atol=1e-4)


def test_same_seed_same_result(noisy: torch.Tensor) -> None:
    kw = {"precision": "fp16", "n_blocks": 4, "sign_epochs": 1, "epochs": 1, "random_state": 3}
    a, b = cp_mixed_precision(noisy, RANK, **kw), cp_mixed_precision(noisy, RANK, **kw)
    assert [e.rel_error for e in a.log] == [e.rel_error for e in b.log]


def test_init_is_used(noisy: torch.Tensor, fp32_run) -> None:
    res = cp_mixed_precision(noisy, RANK, precision="fp32", init=fp32_run.cp_tensor, sign_epochs=0, epochs=1)
    assert res.log[0].rel_error == pytest.approx(fp32_run.rel_error, rel=1e-3)


# ------------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("rank", "error"), [(-1, ValueError), (0, ValueError), (2.5, TypeError), ("3", TypeError), (True, TypeError)]
)
def test_bad_rank(rank: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="rank"):
        cp_mixed_precision(torch.ones(3, 3, 3), rank)


def test_unknown_precision() -> None:
    with pytest.raises(ValueError, match="precision='int4'.*fp16"):
        cp_mixed_precision(torch.ones(3, 3, 3), 2, precision="int4")


@pytest.mark.parametrize(
    ("tensor", "error", "match"),
    [
        (torch.ones(5), ValueError, "order >= 2"),
        ([[1.0, 2.0], [3.0, 4.0]], TypeError, "numpy.ndarray or torch.Tensor"),
        (torch.full((3, 3), float("nan")), ValueError, "finite"),
        (torch.zeros(3, 3), ValueError, "zero"),
    ],
)
def test_bad_tensor(tensor: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        cp_mixed_precision(tensor, 2)


def test_bad_init_shapes() -> None:
    with pytest.raises(ValueError, match="init factors"):
        cp_mixed_precision(torch.ones(3, 4, 5), 2, init=(None, [np.ones((3, 2)), np.ones((4, 2))]))


def test_formats_table() -> None:
    assert {k: v.nbytes for k, v in FORMATS.items()} == {"fp32": 4, "fp16": 2, "bf16": 2, "fp8_e4m3": 1}
