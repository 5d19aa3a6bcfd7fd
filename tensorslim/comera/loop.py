"""A minimal two-stage CoMERA training loop (early scalarization, then the λ-switched late stage).

CoMERA (arXiv 2405.14377), multi-objective rank-adaptive training; the official ``MNLI_trainer.py`` trains
20 early + 10 late epochs (digest §2.2-2.3).
Here the stages are counted in steps; dead ranks are sliced out of the cores at the end of each stage (and every
``truncate_every`` steps) so later steps really are cheaper. Works eagerly on CPU and GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from tensorslim.comera.gates import RankRow, model_size, prune_to_size_, rank_report, truncate_, tt_layers
from tensorslim.comera.objective import CoMERAConfig, CoMERAObjective

LossFn = Callable[[nn.Module, object], torch.Tensor]


@dataclass
class StageLog:
    """What happened in the two stages: losses, sizes and per-layer ranks after each stage."""

    losses: list[float] = field(default_factory=list)
    lambdas: list[float] = field(default_factory=list)
    size_start: float = 0.0
    size_after_early: float = 0.0
    target_size: float = 0.0
    size_after_late: float = 0.0
    pruned_to_target: int = 0
    ranks_after_early: list[RankRow] = field(default_factory=list)
    ranks_after_late: list[RankRow] = field(default_factory=list)


def _freeze_gates(model: nn.Module) -> None:
    for _, layer in tt_layers(model):
        for gate in layer.gates:
            gate.requires_grad_(False)
            gate.grad = None


def train_two_stage(
    model: nn.Module,
    batches: Iterator[object],
    loss_fn: LossFn,
    *,
    optimizer: torch.optim.Optimizer,
    early_steps: int,
    late_steps: int,
    config: CoMERAConfig | None = None,
    truncate_every: int | None = None,
    enforce_target: bool = False,
    stop_at_target: bool = False,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> StageLog:
    """Train ``model`` (which must carry rank gates) for ``early_steps`` + ``late_steps`` optimizer steps.

    Args:
        model: a model whose TT/TTM layers have gates (:func:`tensorslim.comera.enable_gates`).
        batches: yields whatever ``loss_fn`` takes.
        loss_fn: ``(model, batch) -> task loss`` (scalar tensor).
        optimizer: e.g. :func:`tensorslim.comera.build_optimizer`; its state is sliced on truncation.
        early_steps / late_steps: stage lengths; ``late_steps=0`` skips the late stage.
        config: objective hyperparameters.
        truncate_every: also slice dead ranks out every this many steps.
        enforce_target: after the late stage, kill the smallest gates until ``S ≤ S*`` (not in CoMERA).
        stop_at_target: freeze the gates once ``S ≤ S*`` in the late stage (not in CoMERA: there the λ-switch turns
            the size objective off, but Adam's momentum keeps shrinking gates, so the size overshoots the target).
            Costs one host sync per late step.
    """
    objective = CoMERAObjective(config)
    log = StageLog(size_start=float(model_size(model)))
    for step in range(early_steps + late_steps):
        if step == early_steps:
            log.size_after_early = float(model_size(model))
            truncate_(model, optimizer=optimizer)
            log.ranks_after_early = rank_report(model)
            log.target_size = objective.start_late(model)
        task = loss_fn(model, next(batches))
        loss, info = objective.early(task, model) if step < early_steps else objective.late(task, model)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        log.losses.append(float(info["task"]))
        log.lambdas.append(float(info.get("lambda", torch.zeros(()))))
        if stop_at_target and step >= early_steps and float(model_size(model)) <= log.target_size:
            _freeze_gates(model)
        if on_step is not None:
            on_step(step, {k: float(v) for k, v in info.items()})
        if truncate_every and (step + 1) % truncate_every == 0:
            truncate_(model, optimizer=optimizer)
    if late_steps == 0:
        log.size_after_early = float(model_size(model))
        truncate_(model, optimizer=optimizer)
        log.ranks_after_early = rank_report(model)
        return log
    if enforce_target:
        log.pruned_to_target = prune_to_size_(model, log.target_size)
    log.size_after_late = float(model_size(model))
    truncate_(model, optimizer=optimizer)
    log.ranks_after_late = rank_report(model)
    return log
