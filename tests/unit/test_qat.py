"""LSQ quantizer for TT cores: STE gradients against finite differences, grid, init, layer wiring, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tensorslim.functional.tt import tt_linear
from tensorslim.layers.tt import TTConfig, TTLinear
from tensorslim.layers.tt_embedding import TTEmbedding, TTEmbeddingConfig
from tensorslim.quant.qat import (
    ActivationQuantTT,
    LearnedScaleQuantizer,
    QATConfig,
    lsq_quantize,
    prepare_qat_,
    qat_bits,
    qrange,
)


def _surrogate(x: torch.Tensor, s: torch.Tensor, *, frozen: torch.Tensor, bits: int) -> torch.Tensor:
    """The function whose exact derivative the STE claims to be: round(v) = v + (a frozen rounding residual)."""
    q_n, q_p = qrange(bits)
    return s * (torch.clamp(x / s, q_n, q_p) + frozen)


@pytest.mark.parametrize("bits", [3, 4, 8])
def test_ste_gradients_match_finite_differences(bits: int) -> None:
    g = torch.Generator().manual_seed(bits)
    q_n, q_p = qrange(bits)
    s0 = torch.tensor(0.37, dtype=torch.float64)
    # points inside the range (away from rounding ties) and outside on both sides (away from the clip edges)
    v = torch.cat(
        [
            torch.rand(20, generator=g, dtype=torch.float64) * (q_p - q_n - 1) + q_n + 0.5,
            torch.tensor([q_n - 3.3, q_p + 2.7], dtype=torch.float64),
        ]
    )
    v = torch.where((v - v.round()).abs() > 0.45, v + 0.1, v)
    x0 = v * s0
    weights = torch.randn(v.shape, generator=g, dtype=torch.float64)  # a random linear loss
    x = x0.clone().requires_grad_(True)
    s = s0.clone().requires_grad_(True)
    (lsq_quantize(x, s, bits=bits) * weights).sum().backward()

    inside = (v >= q_n) & (v <= q_p)
    frozen = torch.where(inside, v.round() - v, torch.zeros_like(v))
    eps = 1e-6

    def loss(xx: torch.Tensor, ss: torch.Tensor) -> float:
        return float((_surrogate(xx, ss, frozen=frozen, bits=bits) * weights).sum())

    fd_s = (loss(x0, s0 + eps) - loss(x0, s0 - eps)) / (2 * eps)
    assert s.grad is not None and math.isclose(float(s.grad), fd_s, rel_tol=1e-6, abs_tol=1e-8)
    for i in range(len(v)):
        e = torch.zeros_like(x0)
        e[i] = eps
        fd_x = (loss(x0 + e, s0) - loss(x0 - e, s0)) / (2 * eps)
        assert math.isclose(float(x.grad[i]), fd_x, rel_tol=1e-6, abs_tol=1e-8)


def test_lsq_gradient_scale_multiplies_the_scale_gradient() -> None:
    x = torch.randn(50, dtype=torch.float64)
    grads = []
    for flag in (False, True):
        s = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
        lsq_quantize(x, s, bits=4, grad_scale=flag).sum().backward()
        grads.append(float(s.grad))
    assert math.isclose(grads[1], grads[0] / math.sqrt(50 * 7), rel_tol=1e-12)


def test_values_on_the_symmetric_grid_and_init_from_max() -> None:
    core = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(0))
    quantizer = LearnedScaleQuantizer(bits=4, init=core)
    assert math.isclose(float(quantizer.scale.detach()), float(core.abs().max()) / 7, rel_tol=1e-6)
    codes = quantizer(core) / quantizer.scale
    assert torch.allclose(codes, codes.round(), atol=1e-5) and codes.min() >= -8 and codes.max() <= 7
    assert (quantizer(core) - core).abs().max() <= quantizer.scale / 2 + 1e-6  # max|G| lies on the grid


def _tt_model() -> nn.Module:
    torch.manual_seed(0)
    lin = nn.Linear(24, 30)
    return nn.Sequential(TTLinear.from_dense(lin, TTConfig(rank=4, n_cores=4)))


def test_weight_mode_forward_uses_quantized_cores() -> None:
    model = _tt_model()
    float_cores = [c.detach().clone() for c in model[0].cores]
    prepare_qat_(model, QATConfig(mode="weight", bits=4))
    x = torch.randn(5, 24)
    reference_cores = []
    for core in float_cores:  # independent fake quantization: nearest of the 16 levels
        s = core.abs().max() / 7
        levels = s * torch.arange(-8, 8, dtype=core.dtype)
        reference_cores.append(levels[(core[..., None] - levels).abs().argmin(-1)])
    expected = tt_linear(x, reference_cores, model[0].bias, n_in=model[0].n_in)
    assert torch.allclose(model(x), expected, atol=1e-5)
    model(x).square().sum().backward()
    scales = [m.scale for m in model.modules() if isinstance(m, LearnedScaleQuantizer)]
    assert len(scales) == 4 and all(s.grad is not None and s.grad != 0 for s in scales)


def test_weight_activation_mode_wraps_and_tracks_float_at_8_bits() -> None:
    model = _tt_model()
    x = torch.randn(64, 24, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y_float = model(x)
    prepare_qat_(model, QATConfig(mode="weight+activation", bits=8, bits_intermediate=8))
    assert isinstance(model[0], ActivationQuantTT)
    y = model(x)
    assert torch.linalg.norm(y - y_float) / torch.linalg.norm(y_float) < 0.05
    y.sum().backward()
    assert model[0].quant_input.scale.grad is not None and model[0].quant_intermediate.scale.grad is not None


def test_ttm_embedding_cores_are_quantized_and_bits_are_counted() -> None:
    torch.manual_seed(0)
    emb = TTEmbedding.from_dense(nn.Embedding(120, 16), TTEmbeddingConfig(rank=4, n_cores=2))
    model = nn.ModuleDict({"emb": emb})
    n_core = sum(c.numel() for c in emb.cores)
    prepare_qat_(model, QATConfig(bits=4))
    ids = torch.tensor([[0, 5, 119]])
    out = model["emb"](ids)
    for core in model["emb"].cores:  # the forward sees grid values
        s = float(core.detach().abs().max()) / 7
        assert torch.allclose(core / s, (core / s).round(), atol=1e-4)
    assert out.shape == (1, 3, 16)
    quantized, baseline = qat_bits(model)
    assert baseline == n_core * 32
    assert quantized == n_core * 4 + len(emb.cores) * 32


def test_bad_qat_input() -> None:
    with pytest.raises(ValueError, match="mode="):
        QATConfig(mode="activation")
    with pytest.raises(ValueError, match="bits=9"):
        QATConfig(bits=9)
    with pytest.raises(ValueError, match="no TTLinear"):
        prepare_qat_(nn.Sequential(nn.Linear(3, 3)), QATConfig())
