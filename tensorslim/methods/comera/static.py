"""Pieces of CoMERA's static-shape (CUDA-graph) training step: the stage losses as step losses, a gate freeze
without host syncs, and TTM lookups with data-independent shapes.

CoMERA (Yang et al., NeurIPS 2024, arXiv 2405.14377, §4) captures its whole training step in a CUDA graph (official
``MNLI_trainer.py`` L434-668); :class:`tensorslim.train.execution.GraphedStep` is that step, and these are what a
CoMERA step needs inside it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from tensorslim.layers.tt_embedding import TTEmbedding
from tensorslim.methods.comera.gates import gated_layers, layer_gates, model_size, tt_layers
from tensorslim.methods.comera.objective import CoMERAObjective

TaskLoss = Callable[[nn.Module, object], torch.Tensor]
StepLoss = Callable[[nn.Module, object], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def stage_loss(objective: CoMERAObjective, loss_fn: TaskLoss, *, late: bool) -> StepLoss:
    """The early (``L + γ·R``) or late (λ-switched) CoMERA objective as a ``(model, batch) -> (loss, info)`` step
    loss; both are tensor ops only, so the official code captures them in its graph."""

    def loss(model: nn.Module, batch: object) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        task = loss_fn(model, batch)
        return objective.late(task, model) if late else objective.early(task, model)

    return loss


class GateFreeze:
    """The late stage's gate freeze (not in CoMERA, see :class:`~tensorslim.methods.comera.train_hook.CoMERAHook`)
    without a host sync: an update that leaves the gates unchanged once ``S(D) ≤ S*``.

    ``frozen`` is a device-side boolean. :meth:`step` copies the gates, runs the optimizer, puts the copies back where
    ``frozen`` is set (``torch.where``), then sets ``frozen`` if the size has reached the target. The eager hook
    instead reads the size on the host and turns the gates' ``requires_grad`` off; both leave every parameter with the
    same values (gates do not feed the other parameters' gradients, and Adam updates each parameter on its own). Here
    the frozen gates' Adam moments keep moving, unused.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, objective: CoMERAObjective) -> None:
        self.model, self.optimizer, self.objective = model, optimizer, objective
        self.frozen = torch.zeros((), dtype=torch.bool, device=next(model.parameters()).device)

    def step(self) -> None:
        """``optimizer.step()``, then gates restored where frozen and the flag updated (all on the device)."""
        if self.objective.target_size is None:
            raise ValueError("GateFreeze.step() called before objective.start_late(model); S* is not set")
        gates = [gate for _, layer in gated_layers(self.model) for gate in layer_gates(layer)]
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

    The official CoMERA embedding dedupes ids (``use_unique=True``) even inside its graph, which fixes the number of
    distinct ids at capture time; we compute every id instead (same rows, more FLOPs).
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
