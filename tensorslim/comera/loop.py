"""A minimal two-stage CoMERA training loop (early scalarization, then the λ-switched late stage).

CoMERA (arXiv 2405.14377), multi-objective rank-adaptive training; the official ``MNLI_trainer.py`` trains
20 early + 10 late epochs (digest §2.2-2.3).
Here the stages are counted in steps; dead ranks are sliced out of the cores at the end of each stage (and every
``truncate_every`` steps) so later steps really are cheaper. Works eagerly on CPU and GPU, and, as the official
CUDA-graph path does (``MNLI_trainer.py`` L434-668, digest §3.1), can run every step as one captured static-shape step
(:class:`~tensorslim.train.cuda_graph.GraphedStep`), recaptured at the stage switch and after every truncation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from tensorslim._checks import require_int
from tensorslim.comera.gates import RankRow, model_size, prune_to_size_, rank_report, truncate_, tt_layers
from tensorslim.comera.objective import CoMERAConfig, CoMERAObjective
from tensorslim.layers.tt_embedding import TTEmbedding
from tensorslim.train.cuda_graph import GraphedStep, StepLoss

LossFn = Callable[[nn.Module, object], torch.Tensor]
OnStep = Callable[[int, dict[str, float]], None]


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


def stage_loss(objective: CoMERAObjective, loss_fn: LossFn, *, late: bool) -> StepLoss:
    """The early (``L + γ·R``) or late (λ-switched) CoMERA objective as a ``(model, batch) -> (loss, info)`` step
    loss; both are tensor ops only, so the official code captures them in its graph (digest §3.1)."""

    def loss(model: nn.Module, batch: object) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        task = loss_fn(model, batch)
        return objective.late(task, model) if late else objective.early(task, model)

    return loss


class GateFreeze:
    """``stop_at_target`` without a host sync: an update that leaves the gates unchanged once ``S(D) ≤ S*``.

    ``frozen`` is a device-side boolean. :meth:`step` copies the gates, runs the optimizer, puts the copies back where
    ``frozen`` is set (``torch.where``), then sets ``frozen`` if the size has reached the target. The eager loop
    instead reads the size on the host and turns the gates' ``requires_grad`` off; both leave every parameter with the
    same values (gates do not feed the other parameters' gradients, and Adam updates each parameter on its own). Here
    the frozen gates' Adam moments keep moving, unused. Not in CoMERA (see :func:`train_two_stage`).
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, objective: CoMERAObjective) -> None:
        self.model, self.optimizer, self.objective = model, optimizer, objective
        self.frozen = torch.zeros((), dtype=torch.bool, device=next(model.parameters()).device)

    def step(self) -> None:
        """``optimizer.step()``, then gates restored where frozen and the flag updated (all on the device)."""
        if self.objective.target_size is None:
            raise ValueError("GateFreeze.step() called before objective.start_late(model); S* is not set")
        gates = [gate for _, layer in tt_layers(self.model) for gate in layer.gates]
        before = [gate.detach().clone() for gate in gates]
        self.optimizer.step()
        with torch.no_grad():
            for gate, old in zip(gates, before, strict=True):
                gate.copy_(torch.where(self.frozen, old, gate))
            self.frozen.logical_or_(model_size(self.model) <= self.objective.target_size)


@contextlib.contextmanager
def static_lookups(model: nn.Module) -> Iterator[None]:
    """TTM embeddings look rows up per id without ``torch.unique`` (whose output size depends on the data), with
    the ``"chain"`` lookup (the ``"halves"`` lookup reads its group sizes on the host) and without the host-side
    id range check (out-of-range ids are then not caught: the data pipeline must keep them in range); restored on
    exit.

    The official CoMERA embedding dedupes ids (``use_unique=True``, digest §1.5) even inside its graph, which fixes
    the number of distinct ids at capture time; we compute every id instead (same rows, more FLOPs).
    """
    layers = [layer for _, layer in tt_layers(model) if isinstance(layer, TTEmbedding)]
    saved = [(layer.unique, layer.lookup, layer.check_ids) for layer in layers]
    for layer in layers:
        layer.unique, layer.lookup, layer.check_ids = False, "chain", False
    try:
        yield
    finally:
        for layer, (unique, lookup, check_ids) in zip(layers, saved, strict=True):
            layer.unique, layer.lookup, layer.check_ids = unique, lookup, check_ids


class _LogReader:
    """Keeps each step's info tensors on the device and reads them in one host sync every ``every`` steps."""

    def __init__(self, log: StageLog, on_step: OnStep | None, every: int) -> None:
        self.log, self.on_step, self.every = log, on_step, every
        self.pending: list[tuple[int, dict[str, torch.Tensor]]] = []

    def add(self, step: int, info: dict[str, torch.Tensor]) -> None:
        # clone: a replayed graph overwrites its output tensors on the next step
        self.pending.append((step, {key: value.detach().clone() for key, value in info.items()}))
        if len(self.pending) >= self.every:
            self.flush()

    def flush(self) -> None:
        """Read the pending steps (the keys are the same within a stage; the loop flushes at the switch)."""
        if not self.pending:
            return
        keys = list(self.pending[0][1])
        rows = torch.stack([torch.stack([info[key] for key in keys]) for _, info in self.pending]).tolist()
        for (step, _), row in zip(self.pending, rows, strict=True):
            values = dict(zip(keys, row, strict=True))
            self.log.losses.append(values["task"])
            self.log.lambdas.append(values.get("lambda", 0.0))
            if self.on_step is not None:
                self.on_step(step, values)
        self.pending = []


def _eager_step(
    model: nn.Module, batch: object, loss_fn: StepLoss, optimizer: torch.optim.Optimizer, freeze_at: float | None
) -> dict[str, torch.Tensor]:
    """One plain step; with ``freeze_at`` the gates freeze once ``S ≤ freeze_at`` (one host sync)."""
    loss, info = loss_fn(model, batch)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if freeze_at is not None and float(model_size(model)) <= freeze_at:
        _freeze_gates(model)
    return info


def _end_early(model: nn.Module, optimizer: torch.optim.Optimizer, log: StageLog) -> None:
    """Record the size after the early stage, slice its dead ranks out and report the ranks."""
    log.size_after_early = float(model_size(model))
    truncate_(model, optimizer=optimizer)
    log.ranks_after_early = rank_report(model)


def _truncate(model: nn.Module, optimizer: torch.optim.Optimizer) -> bool:
    """:func:`truncate_`; True when some ranks were removed (parameters were replaced)."""
    before = {name: layer.ranks for name, layer in tt_layers(model)}
    return truncate_(model, optimizer=optimizer) != before


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
    on_step: OnStep | None = None,
    cuda_graphs: bool = False,
    static_step: bool = False,
    warmup: int = 3,
    log_every: int = 1,
) -> StageLog:
    """Train ``model`` (which must carry rank gates) for ``early_steps`` + ``late_steps`` optimizer steps.

    Args:
        model: a model whose TT/TTM layers have gates (:func:`tensorslim.comera.enable_gates`).
        batches: yields whatever ``loss_fn`` takes (with ``static_step``/``cuda_graphs``: a tensor or tuple of
            tensors, every batch with the same shapes).
        loss_fn: ``(model, batch) -> task loss`` (scalar tensor).
        optimizer: e.g. :func:`tensorslim.comera.build_optimizer`; its state is sliced on truncation. With
            ``cuda_graphs`` every param group needs ``capturable=True``.
        early_steps / late_steps: stage lengths; ``late_steps=0`` skips the late stage.
        config: objective hyperparameters.
        truncate_every: also slice dead ranks out every this many steps.
        enforce_target: after the late stage, kill the smallest gates until ``S ≤ S*`` (not in CoMERA).
        stop_at_target: freeze the gates once ``S ≤ S*`` in the late stage (not in CoMERA: there the λ-switch turns
            the size objective off, but Adam's momentum keeps shrinking gates, so the size overshoots the target).
            Eagerly this costs one host sync per late step and turns the gates' ``requires_grad`` off; the static
            step does it on the device (:class:`GateFreeze`) with the same parameter values, and turns
            ``requires_grad`` off at the end.
        on_step: called with ``(step, {name: float})`` for every step, when its values are read (see ``log_every``).
        cuda_graphs: capture each step in a CUDA graph (CoMERA's GPU path; needs a CUDA device). The graph is
            recaptured at the stage switch and after every truncation that removed ranks, and TTM embeddings use
            :func:`static_lookups` during training.
        static_step: run the static-shape step of ``cuda_graphs`` eagerly (warm-up and restore included): the same
            logic, testable on CPU.
        warmup: warm-up steps (undone) before each capture of the static step.
        log_every: read the losses from the device every this many steps (one host sync per read), and at the
            stage switch and the end; 1 reads after every step, as the eager loop always did.
    """
    require_int("log_every", log_every)
    objective = CoMERAObjective(config)
    losses = {False: stage_loss(objective, loss_fn, late=False), True: stage_loss(objective, loss_fn, late=True)}
    log = StageLog(size_start=float(model_size(model)))
    reader = _LogReader(log, on_step, log_every)
    graphed, freeze = None, None
    if static_step or cuda_graphs:
        freeze = GateFreeze(model, optimizer, objective) if stop_at_target else None
        extra = (freeze.frozen,) if freeze else ()
        graphed = GraphedStep(model, optimizer, losses[False], capture=cuda_graphs, warmup=warmup, extra_state=extra)
    with static_lookups(model) if cuda_graphs else contextlib.nullcontext():
        for step in range(early_steps + late_steps):
            late = step >= early_steps
            if step == early_steps:
                reader.flush()
                _end_early(model, optimizer, log)
                log.target_size = objective.start_late(model)
                if graphed is not None:
                    graphed.recapture(loss_fn=losses[True], update=freeze.step if freeze else None)
            if graphed is not None:
                info = graphed(next(batches))
            else:
                freeze_at = log.target_size if stop_at_target and late else None
                info = _eager_step(model, next(batches), losses[late], optimizer, freeze_at)
            reader.add(step, info)
            truncated = bool(truncate_every) and (step + 1) % truncate_every == 0 and _truncate(model, optimizer)
            if truncated and graphed is not None:
                graphed.recapture()
        reader.flush()
    if freeze is not None and bool(freeze.frozen):
        _freeze_gates(model)
    if late_steps == 0:
        _end_early(model, optimizer, log)
        return log
    if enforce_target:
        log.pruned_to_target = prune_to_size_(model, log.target_size)
    log.size_after_late = float(model_size(model))
    truncate_(model, optimizer=optimizer)
    log.ranks_after_late = rank_report(model)
    return log
