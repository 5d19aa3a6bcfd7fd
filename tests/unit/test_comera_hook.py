"""The CoMERA trainer hook: stage lengths, stage losses against hand-computed values, resize on resume, the gate
freeze at the target; the package never imports the experiments."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import tensorslim
from tensorslim.layers.tt import TTLinear
from tensorslim.methods.comera import CoMERAConfig, truncate_
from tensorslim.methods.comera.gates import resize_ranks_
from tensorslim.methods.comera.train_hook import CoMERAHook, stage_steps


def _layer(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(TTLinear((4, 4), (4, 4), (1, 4, 8, 4, 1)))


@pytest.mark.parametrize(("steps", "fraction", "expected"), [(10, 0.3, (7, 3)), (9, 1 / 3, (6, 3)), (1, 0.5, (1, 0))])
def test_stage_steps(steps: int, fraction: float, expected: tuple[int, int]) -> None:
    assert stage_steps(steps, late_fraction=fraction) == expected


def test_stage_losses_match_the_paper_formulas() -> None:
    model = _layer()
    hook = CoMERAHook(4, late_fraction=0.5, config=CoMERAConfig(gamma=0.1, target_ratio=0.5), target_loss=2.0)
    optimizer = hook.build_optimizer(model, lr=1e-3, weight_decay=0.0)
    gates = model[0].gates
    with torch.no_grad():
        gates[1][:3] = 0.005  # dead (≤ 1e-2)
        gates[1][3:] = 0.5
    active = torch.cat([gates[0], gates[1][3:], gates[2]]).detach()
    task = torch.tensor(3.0)
    assert hook.loss(task, model=model, step=0).item() == pytest.approx(3.0 + 0.1 * float(active.mean()))
    hook.after_step(model, optimizer=optimizer, step=1)
    hook.after_step(model, optimizer=optimizer, step=2)  # end of the early stage: truncate, S* = 0.5 S
    assert model[0].ranks == (1, 4, 5, 4, 1)
    size = 4 * 4 + 4 * 4 * 5 + 5 * 4 * 4 + 4 * 4  # Σ n_k R_{k-1} R_k
    assert float(hook.objective.target_size) == pytest.approx(0.5 * size)
    # (L - L*)/L = 1/3 < (S - S*)/S = 1/2, so λ = 1: loss = 0.1 L + 0.01 R + R
    penalty = float(active.mean())
    assert hook.loss(task, model=model, step=2).item() == pytest.approx(0.1 * 3.0 + 0.01 * penalty + penalty, rel=1e-6)
    # (L - L*)/L = 0.9 > 1/2: λ = 0, loss = 0.1 L + 0.01 R + L
    big = torch.tensor(20.0)
    assert hook.loss(big, model=model, step=2).item() == pytest.approx(0.1 * 20 + 0.01 * penalty + 20, rel=1e-6)


def test_resize_ranks_rebuilds_a_truncated_layer() -> None:
    trained = _layer()
    with torch.no_grad():
        trained[0].enable_gates()
        trained[0].gates[1][[0, 2, 5]] = 0.0
    truncate_(trained)
    fresh = _layer(seed=1)
    fresh[0].enable_gates()
    resize_ranks_(fresh, {"0": list(trained[0].ranks)})
    fresh.load_state_dict(trained.state_dict())
    x = torch.randn(3, 16)
    torch.testing.assert_close(fresh(x), trained(x))
    with pytest.raises(ValueError, match="cannot resize '0'"):
        resize_ranks_(fresh, {"0": [1, 4, 9, 4, 1]})  # larger than the layer's rank
    with pytest.raises(ValueError, match="cannot resize 'nope'"):
        resize_ranks_(fresh, {"nope": [1, 1, 1]})


def test_gates_freeze_at_the_target_and_stay_frozen_on_resume() -> None:
    model = _layer()
    hook = CoMERAHook(4, late_fraction=0.5, config=CoMERAConfig(target_ratio=1.0), target_loss=2.0)
    optimizer = hook.build_optimizer(model, lr=1e-3, weight_decay=0.0)
    hook.after_step(model, optimizer=optimizer, step=1)
    assert all(gate.requires_grad for gate in model[0].gates)  # early stage: never frozen
    hook.after_step(model, optimizer=optimizer, step=2)  # the switch: S* = S
    hook.after_step(model, optimizer=optimizer, step=3)  # S ≤ S*: frozen
    assert hook.reports["frozen_at"]["step"] == 3
    assert all(not gate.requires_grad for gate in model[0].gates)
    state = hook.state_dict()
    assert state["frozen"] and state["target_loss"] == 2.0
    fresh = _layer(seed=1)
    resumed = CoMERAHook(4, late_fraction=0.5, config=CoMERAConfig(target_ratio=1.0))
    resumed.load_state_dict(state, model=fresh, optimizer=resumed.build_optimizer(fresh, lr=1e-3, weight_decay=0.0))
    assert resumed.frozen and resumed.objective.target_loss == 2.0
    assert all(not gate.requires_grad for gate in fresh[0].gates)


def test_the_package_never_imports_the_experiments() -> None:
    """``experiments/`` sits on the public API; nothing in ``tensorslim`` may import it."""
    root = Path(tensorslim.__file__).parent
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(name.split(".")[0] in ("experiments", "comera_bert") for name in names), path
