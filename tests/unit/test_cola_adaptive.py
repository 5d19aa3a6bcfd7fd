"""Rank-adaptive CoLA (``cola-adaptive``): CoMERA's rank gates (arXiv 2405.14377 §3) on CoLA's latent.

References are written out here: the gated latent ``B (thr(g) ⊙ σ(A x)) + b`` with ``thr(g) = g·1[g > 1e-2]``, the
size ``Σ R (d_in + d_out)``, and the truncated factors as index selections of the old ones.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.checkpoint import latest_checkpoint
from tensorslim.convert import convert_
from tensorslim.layers.cola_m import CoLAMConfig
from tensorslim.layers.lowrank import CoLAConfig, LowRankLinear
from tensorslim.methods.comera.gates import model_size, prune_to_size_, truncate_
from tensorslim.methods.comera.train_hook import CoMERAHook
from tensorslim.train.config import TrainConfig
from tensorslim.train.trainer import Trainer, train
from tests.helpers import train_until_interrupted

THRESHOLD = 1e-2  # CoMERA's pruning threshold


def _gated(d_in: int = 8, d_out: int = 6, rank: int = 5, *, bias: bool = True) -> LowRankLinear:
    torch.manual_seed(0)
    layer = LowRankLinear(d_in, d_out, rank, bias=bias, activation="silu", dtype=torch.float64)
    layer.enable_gates()
    return layer


def _stack() -> nn.Sequential:
    """Two gated CoLA layers, 8 -> 12 -> 8, converted from dense by ``convert_``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 12), nn.Linear(12, 8, bias=False)).double()
    convert_(model, CoLAConfig(rank=6, rank_gates=True, init="random"), allow_larger=True)
    return model


def test_gate_multiplies_the_latent() -> None:
    layer = _gated()
    with torch.no_grad():
        layer.gate.copy_(torch.tensor([1.5, 0.5, THRESHOLD, -0.3, 0.02], dtype=torch.float64))
    x = torch.randn(3, 4, 8, dtype=torch.float64)
    g = layer.gate.detach()
    thr = torch.where(g > THRESHOLD, g, torch.zeros_like(g))  # the gate at the threshold is dead too
    latent = F.silu(x @ layer.weight_a.T) * thr  # (3, 4, r)
    expected = latent @ layer.weight_b.T + layer.bias
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-12)
    # Dead gates get no gradient: they can never come back.
    layer(x).square().sum().backward()
    assert layer.gate.grad[2:4].eq(0).all() and layer.gate.grad[[0, 1, 4]].ne(0).all()
    assert layer.num_params() == sum(p.numel() for p in layer.parameters()) == 5 * (8 + 6) + 6 + 5


def test_gates_only_on_layers_that_apply_them() -> None:
    with pytest.raises(ValueError, match="rank_gates=True is not supported by CoLAMConfig"):
        CoLAMConfig(rank=4, rank_gates=True)
    layer = LowRankLinear(8, 6, 4)
    assert not layer.gated and "gates=False" in repr(layer)


def test_size_is_the_active_rank_count_times_the_dims() -> None:
    model = _stack()
    gates = [layer.gate for layer in model]
    with torch.no_grad():
        gates[0][[1, 4]] = 0.0
        gates[1][:] = torch.tensor([0.5, 0.005, 0.2, 0.0, 0.3, 0.4])
    assert float(model_size(model)) == 4 * (8 + 12) + 4 * (12 + 8)


def test_truncation_removes_exactly_the_dead_ranks_and_keeps_outputs() -> None:
    model = _stack()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(5, 8, dtype=torch.float64)
    model(x).square().sum().backward()
    optimizer.step()  # moments exist and must be sliced along
    dead = [[0, 3], [1, 2, 5]]
    with torch.no_grad():
        for layer, ranks in zip(model, dead, strict=True):
            layer.gate[ranks] = 0.005  # below the threshold: thresholded to exact zero
    old = [{name: p.detach().clone() for name, p in layer.named_parameters()} for layer in model]
    moments = [{name: optimizer.state[p]["exp_avg"].clone() for name, p in layer.named_parameters()} for layer in model]
    before = model(x).detach()
    ranks = truncate_(model, optimizer=optimizer)
    assert ranks == {"0": (1, 4, 1), "1": (1, 3, 1)}
    for layer, ranks_dead, params, avg in zip(model, dead, old, moments, strict=True):
        alive = [j for j in range(6) if j not in ranks_dead]
        assert layer.rank == len(alive) and layer.weight_a.shape == (len(alive), layer.in_features)
        torch.testing.assert_close(layer.weight_a, params["weight_a"][alive], rtol=0, atol=0)
        torch.testing.assert_close(layer.weight_b, params["weight_b"][:, alive], rtol=0, atol=0)
        torch.testing.assert_close(layer.gate, params["gate"][alive], rtol=0, atol=0)
        torch.testing.assert_close(optimizer.state[layer.weight_b]["exp_avg"], avg["weight_b"][:, alive])
        torch.testing.assert_close(optimizer.state[layer.gate]["exp_avg"], avg["gate"][alive])
    torch.testing.assert_close(model(x), before, rtol=1e-12, atol=1e-12)
    live = {id(p) for p in model.parameters()}
    assert all(id(p) in live for group in optimizer.param_groups for p in group["params"])
    model(x).square().sum().backward()
    optimizer.step()  # shapes of parameters, gradients and moments agree


def test_a_fully_dead_layer_keeps_one_dead_rank() -> None:
    model = _stack()
    with torch.no_grad():
        model[1].gate[:] = torch.tensor([0.0, 0.003, 0.001, -0.2, 0.0, 0.0], dtype=torch.float64)
    x = torch.randn(5, 8, dtype=torch.float64)
    before = model(x).detach()
    assert truncate_(model)["1"] == (1, 1, 1)
    assert model[1].gate.tolist() == [0.003]  # the largest dead gate, still dead: the layer maps to exact zero
    torch.testing.assert_close(model(x), before, rtol=0, atol=0)
    assert float(model_size(model)) == 6 * (8 + 12)


def test_prune_to_size_kills_the_smallest_gates_first() -> None:
    model = _stack()
    with torch.no_grad():
        model[0].gate[:] = torch.tensor([0.9, 0.1, 0.8, 0.7, 0.2, 0.6])
        model[1].gate[:] = torch.tensor([0.15, 0.5, 0.4, 0.3, 0.95, 0.85])
    assert prune_to_size_(model, 9 * 20) == 3  # 12 ranks of 20 params each -> 9
    assert model[0].gate[[1, 4]].eq(0).all() and model[1].gate[0] == 0


def _config(corpus: Path, out: Path, **overrides: object) -> TrainConfig:
    base = TrainConfig(
        preset="tiny",
        method="cola-adaptive",
        steps=60,
        batch_size=4,
        seq_len=32,
        vocab_size=512,
        data=str(corpus),
        options={"rank": 16, "target_ratio": 0.5},
        eval_every=30,
        eval_blocks=4,
        checkpoint_every=10,
        out_dir=str(out),
        progress=False,
        tensorboard=False,
    )
    return replace(base, **overrides)


@pytest.fixture(scope="module")
def short_run(small_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[TrainConfig, object, Trainer]:
    config = _config(small_corpus, tmp_path_factory.mktemp("cola_adaptive") / "full")
    trainer = Trainer(config)
    return config, trainer.run(), trainer


def test_short_run_lands_within_five_percent_of_its_size_target(short_run) -> None:
    config, result, trainer = short_run
    assert isinstance(trainer.hook, CoMERAHook)
    report = json.loads((Path(config.run_dir) / "comera_ranks.json").read_text())
    layers = {name: m for name, m in trainer.model.named_modules() if isinstance(m, LowRankLinear)}
    assert len(layers) == 28 and all(m.gated for m in layers.values())
    start = sum(16 * (m.in_features + m.out_features) for m in layers.values())
    assert report["start_size"] == start
    target = report["target_size"]
    assert target == pytest.approx(0.5 * report["after_early"]["size"])
    alive = {name: int((m.gate > THRESHOLD).sum()) for name, m in layers.items()}
    # Truncated: every stored rank is alive, except the one dead rank a fully removed layer keeps.
    assert all(m.rank == max(alive[name], 1) for name, m in layers.items())
    size = sum(alive[name] * (m.in_features + m.out_features) for name, m in layers.items())
    assert report["after_late"]["size"] == size
    assert abs(size - target) <= 0.05 * target
    assert len({m.rank for m in layers.values()}) > 1  # the layers ended with ranks of their own
    assert result.params_total == sum(p.numel() for p in trainer.model.parameters())
    groups = {g["name"]: g for g in trainer.optimizer.param_groups}
    lr = groups["cores"]["lr"]
    assert groups["gates"]["lr"] == pytest.approx(10 * lr) and groups["other"]["lr"] == pytest.approx(lr)


@pytest.mark.parametrize("stop_after", [40])  # resume after the early stage's truncation (step 30)
def test_resume_is_exact_across_truncation(short_run, tmp_path: Path, stop_after: int) -> None:
    config, full, _ = short_run
    interrupted = replace(config, out_dir=str(tmp_path / "cut"))

    train_until_interrupted(interrupted, after_step=stop_after)
    state = json.loads((latest_checkpoint(tmp_path / "cut" / "checkpoints") / "state.json").read_text())
    assert any(ranks != [1, 16, 1] for ranks in state["method"]["ranks"].values())  # resumed from truncated layers
    resumed = train(replace(interrupted, resume=True))
    assert resumed.losses == pytest.approx(full.losses, rel=1e-6, abs=0)
    assert resumed.val_loss == pytest.approx(full.val_loss, rel=1e-6)
    full_report = json.loads((Path(config.run_dir) / "comera_ranks.json").read_text())
    assert json.loads((tmp_path / "cut" / "comera_ranks.json").read_text()) == full_report
