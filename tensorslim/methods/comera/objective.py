"""CoMERA's two-stage multi-objective training loss.

CoMERA (Yang et al., NeurIPS 2024, arXiv 2405.14377, §3), multi-objective rank-adaptive training: the early stage
minimizes a scalarization ``task + γ·R(D)``; the optional late stage steers toward a target model size. As the
official code implements it (``MNLI_trainer.py`` L324, L362-402):

* early: ``loss = L + γ·R``, γ = 0.01;
* late: at its start ``S* = ratio·S(D)`` and a task-loss target ``L*``; every step
  ``λ = 1[(L − L*)/L < (S − S*)/S]`` (no gradient) and ``loss = ρ_L·L + ρ_R·R + λ·R + (1−λ)·L`` with
  ρ_L = 0.1, ρ_R = 0.01, i.e. descend whichever objective is relatively farther from its target.

The official late stage only runs inside its CUDA-graph path. Here λ and S(D) are plain tensor ops, so the same code
runs eagerly on CPU or GPU and can be captured in a CUDA graph. ``L*`` (hard-coded 0.8 for MNLI cross-entropy
upstream) has no default here: :meth:`CoMERAObjective.start_late` takes it, and the training hook
(:class:`tensorslim.methods.comera.train_hook.CoMERAHook`) is the one place that chooses it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tensorslim._checks import check_fields
from tensorslim.methods.comera.gates import gate_penalty, model_size


@dataclass(frozen=True, kw_only=True)
class CoMERAConfig:
    """Hyperparameters of the two-stage objective (defaults as shipped in ``run_MNLI.sh``).

    Attributes:
        gamma: weight γ of the rank penalty in the early stage.
        target_ratio: late-stage target size as a fraction of the size at the stage switch, in (0, 1].
        rho_task: small weight ρ_L kept on the task loss in the late stage.
        rho_rank: small weight ρ_R kept on the rank penalty in the late stage.
        threshold: a gate at or below this value is a pruned rank.
    """

    gamma: float = 0.01
    target_ratio: float = 0.5
    rho_task: float = 0.1
    rho_rank: float = 0.01
    threshold: float = 1e-2

    def __post_init__(self) -> None:
        if isinstance(self.target_ratio, bool) or not isinstance(self.target_ratio, int | float):
            raise ValueError(f"target_ratio={self.target_ratio!r} is invalid; allowed: a number in (0, 1]")
        if not 0 < self.target_ratio <= 1:
            raise ValueError(f"target_ratio={self.target_ratio!r} is out of range; allowed: a number in (0, 1]")
        for name in ("gamma", "rho_task", "rho_rank", "threshold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{name}={value!r} is invalid; allowed: a number >= 0")
        check_fields(self)  # after the range checks above, whose messages say more


class CoMERAObjective:
    """Stateful two-stage loss: call :meth:`early` until the switch, :meth:`start_late` once, then :meth:`late`.

    Example:
        >>> objective = CoMERAObjective(CoMERAConfig(target_ratio=0.5))
        >>> loss, info = objective.early(task_loss, model)  # stage 1
        >>> objective.start_late(model, target_loss=2.3)  # records S* = 0.5·S(D) and L*
        >>> loss, info = objective.late(task_loss, model)  # stage 2
    """

    def __init__(self, config: CoMERAConfig | None = None) -> None:
        self.config = config or CoMERAConfig()
        self.target_size: torch.Tensor | None = None
        self.target_loss: float | None = None

    def early(self, task_loss: torch.Tensor, model: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``L + γ·R(D)``; returns the loss and detached parts (task, penalty)."""
        penalty = gate_penalty(model)
        loss = task_loss + self.config.gamma * penalty
        return loss, {"task": task_loss.detach(), "penalty": penalty.detach()}

    def start_late(self, model: nn.Module, *, target_loss: float) -> float:
        """Record ``L* = target_loss`` and the size target ``S* = ratio·S(D)`` from the current gates; returns S*.

        Raises:
            ValueError: ``target_loss`` is not a number > 0.
        """
        if isinstance(target_loss, bool) or not isinstance(target_loss, int | float) or not target_loss > 0:
            raise ValueError(f"target_loss={target_loss!r} is invalid; allowed: a number > 0")
        self.target_loss = float(target_loss)
        self.target_size = model_size(model) * self.config.target_ratio
        return float(self.target_size)

    def late(self, task_loss: torch.Tensor, model: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The λ-switched late-stage loss; λ is a 0/1 tensor (no host sync), so a CUDA graph can capture it."""
        if self.target_size is None or self.target_loss is None:
            raise ValueError("late() called before start_late(model, target_loss=...); S* and L* are not set")
        config = self.config
        penalty = gate_penalty(model)
        size = model_size(model)  # (), no grad
        with torch.no_grad():
            task = task_loss.detach()
            loss_gap = (task - self.target_loss) / task
            size_gap = (size - self.target_size) / size.clamp(min=1)
            lam = (loss_gap < size_gap).to(task_loss.dtype)
        loss = config.rho_task * task_loss + config.rho_rank * penalty + lam * penalty + (1 - lam) * task_loss
        return loss, {"task": task, "penalty": penalty.detach(), "size": size, "lambda": lam}
