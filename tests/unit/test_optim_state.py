"""AdamW with its moments in bf16 (``--optimizer-state bf16``) against PyTorch's fp32 AdamW on a tiny problem."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tensorslim.train.config import TrainConfig
from tensorslim.train.optim import LowPrecisionStateAdamW, build_optimizer

HYPER = {"lr": 1e-2, "weight_decay": 0.1}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> list[float]:
    generator = torch.Generator().manual_seed(1)
    teacher = torch.randn(6, 3, generator=torch.Generator().manual_seed(2))
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 6, generator=generator)
        loss = (model(x) - x @ teacher).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_fp32_state_equals_pytorch_adamw() -> None:
    ours, reference = _model(), _model()
    _train(ours, LowPrecisionStateAdamW(ours.parameters(), state_dtype=torch.float32, **HYPER), 10)
    _train(reference, torch.optim.AdamW(reference.parameters(), foreach=False, **HYPER), 10)
    torch.testing.assert_close(ours.state_dict(), reference.state_dict(), rtol=1e-6, atol=1e-7)


def test_bf16_state_follows_fp32_adamw_closely() -> None:
    ours, reference = _model(), _model()
    optimizer = build_optimizer(ours, state_dtype="bf16", **HYPER)
    assert isinstance(optimizer, LowPrecisionStateAdamW)
    first = _model()
    _train(first, LowPrecisionStateAdamW(first.parameters(), **HYPER), 1)
    reference_first = _model()
    _train(reference_first, torch.optim.AdamW(reference_first.parameters(), **HYPER), 1)
    torch.testing.assert_close(first.state_dict(), reference_first.state_dict())  # step 1 reads no rounded state
    losses = _train(ours, optimizer, 30)
    reference_losses = _train(reference, torch.optim.AdamW(reference.parameters(), **HYPER), 30)
    assert losses[-1] < 0.8 * losses[0]
    assert losses == pytest.approx(reference_losses, rel=2e-2)
    for name, value in ours.state_dict().items():
        drift = torch.linalg.vector_norm(value - reference.state_dict()[name])
        assert drift <= 2e-2 * torch.linalg.vector_norm(value), name
    state = next(iter(optimizer.state.values()))
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16


def test_state_dict_round_trip_keeps_bf16_and_continues_identically() -> None:
    model = _model()
    optimizer = LowPrecisionStateAdamW(model.parameters(), **HYPER)
    _train(model, optimizer, 3)
    twin = copy.deepcopy(model)
    twin_optimizer = LowPrecisionStateAdamW(twin.parameters(), **HYPER)
    twin_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    assert all(s["exp_avg_sq"].dtype == torch.bfloat16 for s in twin_optimizer.state.values())
    assert _train(model, optimizer, 3) == _train(twin, twin_optimizer, 3)
    torch.testing.assert_close(model.state_dict(), twin.state_dict(), rtol=0, atol=0)


def test_refusals() -> None:
    with pytest.raises(ValueError, match="optimizer_state='fp16' is invalid; allowed:"):
        TrainConfig(optimizer_state="fp16")
    with pytest.raises(ValueError, match="optimizer_state='bf16' needs the training loop's own AdamW"):
        TrainConfig(method="galore", optimizer_state="bf16")
    with pytest.raises(ValueError, match="state_dtype='bf16' is not supported with GaLore"):
        build_optimizer(_model(), lr=1e-3, weight_decay=0.0, galore_rank=2, state_dtype="bf16")
    assert TrainConfig(method="cola", optimizer_state="bf16").optimizer_state == "bf16"
