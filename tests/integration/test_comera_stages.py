"""Two-stage CoMERA training on a synthetic low-rank teacher: ranks shrink and the late stage hits its target."""

from __future__ import annotations

import itertools

import pytest
import torch

from tensorslim.comera import CoMERAConfig, build_optimizer, enable_gates, model_size
from tensorslim.comera.loop import train_two_stage
from tensorslim.layers.tt import TTLinear


def _teacher_batches(teacher: TTLinear, *, batch: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randn(batch, teacher.in_features, generator=gen)
        with torch.no_grad():
            y = teacher(x)
        yield x, y  # outside no_grad: a generator suspended inside it would leak the mode to the caller


def _relative_mse(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).mean() / (y**2).mean()


@pytest.mark.parametrize("ratio,stop", [(0.5, False), (0.2, False), (0.5, True)])
def test_late_stage_reaches_target_size(ratio, stop):
    torch.manual_seed(0)
    teacher = TTLinear((4, 4), (4, 4), (1, 3, 2, 3, 1), bias=False)
    student = TTLinear((4, 4), (4, 4), (1, 4, 8, 4, 1), bias=False)
    enable_gates(student)
    optimizer = build_optimizer(student, lr_cores=1e-2, lr_gates=1e-2)
    config = CoMERAConfig(gamma=1.0, target_ratio=ratio, target_loss=0.05)
    log = train_two_stage(
        student,
        _teacher_batches(teacher, batch=64, seed=1),
        _relative_mse,
        optimizer=optimizer,
        early_steps=150,
        late_steps=150,
        config=config,
        enforce_target=True,
        stop_at_target=stop,
        truncate_every=50,
    )
    assert log.size_after_early <= log.size_start
    assert log.target_size == pytest.approx(ratio * log.size_after_early)
    assert log.size_after_late <= log.target_size * 1.05
    assert float(model_size(student)) == log.size_after_late  # truncation keeps the accounting
    assert sum(student.ranks) < sum((1, 4, 8, 4, 1))  # cores were physically sliced
    assert any(lam == 1.0 for lam in log.lambdas[150:])  # the late stage did switch to the size objective
    assert all(isinstance(loss, float) for loss in itertools.islice(log.losses, 0, None))
    if stop:  # the size reached the target during the late stage, then the gates froze: it stays on the target
        assert log.pruned_to_target == 0 and all(not gate.requires_grad for gate in student.gates)
        assert log.size_after_late >= 0.95 * log.target_size
