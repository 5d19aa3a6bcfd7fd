"""Training hooks: how a method adds to the one training loop without ``if method == ...`` branches in it.

A method's registry record (:mod:`tensorslim.methods.registry`) may name a hook factory. The trainer calls the hook
at four points: to build the optimizer, to turn each micro-batch's task loss into the loss that is back-propagated,
after each optimizer step, and around checkpoints (:meth:`TrainHook.state_dict` is stored in the checkpoint's JSON
state; :meth:`TrainHook.load_state_dict` runs on resume *before* the weights are loaded, so a hook may reshape the
freshly built model to the checkpoint's shapes). Methods without a hook get :class:`TrainHook`, whose every call is a
no-op.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class TrainHook:
    """The no-op hook; subclasses override what their method needs.

    Optimizer groups may carry an ``lr_scale``: the trainer sets each group's learning rate to
    ``lr_scale × peak lr × schedule(step)``.
    """

    def build_optimizer(self, model: nn.Module, *, lr: float, weight_decay: float) -> torch.optim.Optimizer | None:
        """The method's optimizer, or None for the trainer's default."""
        return None

    def loss(self, task_loss: torch.Tensor, *, model: nn.Module, step: int) -> torch.Tensor:
        """The loss to back-propagate for one micro-batch of optimizer step ``step`` (0-based)."""
        return task_loss

    def after_step(self, model: nn.Module, *, optimizer: torch.optim.Optimizer, step: int) -> dict[str, float]:
        """Runs after optimizer step ``step`` (1-based: steps completed), before validation and checkpointing;
        returns extra metrics for the step's record."""
        return {}

    def target(self, model: nn.Module) -> dict[str, Any] | None:
        """The method's target and whether the trained ``model`` reached it, for the run's summary: ``{"what",
        "target", "reached", "ok", "note"}`` (``note``: one line, why it was missed), or None (no target)."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """JSON-serializable state stored in each checkpoint."""
        return {}

    def load_state_dict(self, state: dict[str, Any], *, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Restore :meth:`state_dict` on resume, before the checkpoint's weights and optimizer state are loaded."""
