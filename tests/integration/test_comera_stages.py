"""CoMERA's two stages through the trainer hook on a synthetic low-rank teacher: the late stage reaches its size
target by the rank gates alone (nothing is pruned by force), λ follows the paper's switch, and ``L*`` has one rule.

The loop below is the trainer's order of calls (hook loss → backward → optimizer step → ``after_step``), on a model
small enough to train 300 steps in seconds.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator

import pytest
import torch

from tensorslim.layers.tt import TTLinear
from tensorslim.methods.comera import CoMERAConfig, CoMERAHook, model_size
from tensorslim.methods.comera.gates import tt_layers

STEPS = 300  # 150 early + 150 late


def _teacher_batches(teacher: TTLinear, *, batch: int, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randn(batch, teacher.in_features, generator=gen)
        with torch.no_grad():
            y = teacher(x)
        yield x, y  # outside no_grad: a generator suspended inside it would leak the mode to the caller


def _train(*, ratio: float, freeze: bool) -> tuple[CoMERAHook, torch.nn.Module, list[float], list[dict]]:
    torch.manual_seed(0)
    teacher = TTLinear((4, 4), (4, 4), (1, 3, 2, 3, 1), bias=False)
    model = torch.nn.Sequential(TTLinear((4, 4), (4, 4), (1, 4, 8, 4, 1), bias=False))
    config = CoMERAConfig(gamma=0.01, target_ratio=ratio)
    hook = CoMERAHook(STEPS, late_fraction=0.5, config=config, freeze_at_target=freeze)
    optimizer = hook.build_optimizer(model, lr=3e-3, weight_decay=0.0)
    batches = _teacher_batches(teacher, batch=64, seed=1)
    losses, records = [], []
    for step in range(STEPS):
        x, y = next(batches)
        task = ((model(x) - y) ** 2).mean() / (y**2).mean()  # relative MSE
        optimizer.zero_grad(set_to_none=True)
        hook.loss(task, model=model, step=step).backward()
        optimizer.step()
        with contextlib.redirect_stdout(io.StringIO()):  # the stage-end rank tables
            records.append(hook.after_step(model, optimizer=optimizer, step=step + 1))
        losses.append(task.item())
    return hook, model, losses, records


@pytest.fixture(scope="module")
def frozen_run() -> tuple[CoMERAHook, torch.nn.Module, list[float], list[dict]]:
    return _train(ratio=0.5, freeze=True)


def test_late_stage_lands_within_five_percent_of_the_target_by_the_gates_alone(frozen_run) -> None:
    hook, model, _, records = frozen_run
    report = hook.reports
    target = report["target_size"]
    assert target == pytest.approx(0.5 * report["after_early"]["size"])
    assert report["after_early"]["size"] <= report["start_size"]
    # No gate is ever zeroed by force on this path, so the size after the late stage is what the gates reached.
    late = report["after_late"]["size"]
    assert 0.95 * target <= late <= target
    assert report["frozen_at"]["size"] == late and 150 < report["frozen_at"]["step"] < STEPS
    assert all(not gate.requires_grad for _, layer in tt_layers(model) for gate in layer.gates)
    assert records[-1]["comera_size"] == late == float(model_size(model))
    assert model[0].ranks != (1, 4, 8, 4, 1)  # dead ranks were sliced out of the cores


def test_without_the_freeze_the_late_stage_overshoots() -> None:
    """Why the freeze exists: with the λ-switch alone, Adam's momentum keeps shrinking gates past the target."""
    hook, _, _, _ = _train(ratio=0.5, freeze=False)
    assert "frozen_at" not in hook.reports
    assert hook.reports["after_late"]["size"] < 0.95 * hook.reports["target_size"]


def test_lambda_follows_the_paper_switch_and_l_star_has_one_rule(frozen_run) -> None:
    hook, _, losses, records = frozen_run
    early = STEPS // 2
    # L* = the mean task loss of the last tenth of the early stage (no target_loss given).
    assert hook.reports["target_loss"] == pytest.approx(sum(losses[early - early // 10 : early]) / (early // 10))
    l_star, s_star = hook.reports["target_loss"], hook.reports["target_size"]
    assert all("comera_lambda" not in r for r in records[:early])
    switched = 0
    for k in range(early, STEPS):  # λ of step k+1 uses that step's loss and the size before it (after step k)
        size_before = records[k - 1]["comera_size"]
        loss_gap, size_gap = (losses[k] - l_star) / losses[k], (size_before - s_star) / size_before
        if abs(loss_gap - size_gap) > 1e-5:  # away from float32 ties
            assert records[k]["comera_lambda"] == float(loss_gap < size_gap), k
        switched += records[k]["comera_lambda"] == 1.0
    assert 0 < switched < STEPS - early  # both objectives were descended in the late stage
