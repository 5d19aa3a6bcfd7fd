"""CoMERA's rank-adaptive stages inside the one trainer (``tensorslim train --method comera``), built by the
``comera`` method's registry record.

CoMERA (Yang et al., NeurIPS 2024, arXiv 2405.14377, §3) trains in two stages: an early stage on ``task + γ·R(D)``
and a late stage that steers the model size toward ``S* = ratio·S`` with the per-step λ-switch.
:class:`CoMERAHook` plugs that into :class:`tensorslim.train.trainer.Trainer` through the method-hook seam
(:mod:`tensorslim.methods.hooks`): gates on every TT layer, the three optimizer groups, the stage losses, truncation of
dead ranks at each stage end (and every ``truncate_every`` steps), a per-layer rank report after each stage (printed
and written to ``<run>/comera_ranks.json``) and the state a resumed run needs (core ranks, ``S*``, ``L*``, the freeze).

Where we deviate from the official code (besides the deviations listed in :mod:`tensorslim.methods.comera.objective`):

* Stages are counted in optimizer steps (``late_fraction`` of them in the late stage), not epochs (20 + 10 upstream).
* Learning rates keep CoMERA's ratios (cores 1e-4 : gates 1e-3 : rest 5e-5) relative to the trainer's peak lr and
  follow the trainer's warm-up + cosine schedule; upstream they are constant. Gates get no weight decay (their only
  pull to zero is the rank penalty); cores and the rest use the run's weight decay (0 upstream).
* ``L*`` — its one definition: ``target_loss`` when given, else the mean task loss of the last tenth of the early
  stage, so the late stage trades size for loss only while the loss stays at its early-stage level. Upstream it is
  hard-coded to 0.8 (an MNLI cross-entropy that a language model may never reach, so nothing would be pruned).
* The gates freeze once the late stage reaches ``S ≤ S*`` (``freeze_at_target``). With the λ-switch alone the size
  objective turns off at the target, but Adam's momentum keeps shrinking the gates, so the size overshoots (on
  ``bert-small`` masked LM: 0.935 / 0.720 of the target for ratios 0.5 / 0.2; frozen: 0.993 / 0.968).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tensorslim.functional.threads import update_small_on_one_thread
from tensorslim.methods.comera.gates import (
    bond_ranks,
    enable_gates,
    format_rank_report,
    gated_layers,
    layer_gates,
    model_size,
    prune_to_size_,
    rank_report,
    resize_ranks_,
    truncate_,
)
from tensorslim.methods.comera.objective import CoMERAConfig, CoMERAObjective
from tensorslim.methods.comera.optim import param_groups
from tensorslim.methods.hooks import TrainHook

# CoMERA's learning rates (cores 1e-4, gates 1e-3, rest 5e-5; §5) as multiples of the cores' rate.
LR_SCALES = {"cores": 1.0, "gates": 10.0, "other": 0.5}
REPORT_FILE = "comera_ranks.json"


def stage_steps(steps: int, *, late_fraction: float) -> tuple[int, int]:
    """``(early, late)`` step counts; the early stage keeps at least one step."""
    late = min(round(steps * late_fraction), steps - 1)
    return steps - late, late


class CoMERAHook(TrainHook):
    """The two CoMERA stages as a trainer hook, over every gated layer (TT/TTM layers and gated low-rank layers, see
    :func:`~tensorslim.methods.comera.gates.gated_layers`).

    Args:
        steps: the run's total optimizer steps.
        late_fraction: share of the steps in the late stage, in [0, 1); 0 runs the early stage only.
        config: the objective's hyperparameters (γ, target ratio, ρ's).
        target_loss: ``L*``; None takes the mean task loss of the last tenth of the early stage.
        freeze_at_target: stop training the gates once the late stage reaches ``S(D) ≤ S*`` (not in CoMERA).
        truncate_every: also slice dead ranks out every this many steps; 0: at the stage ends only.
        run_dir: where ``comera_ranks.json`` goes (None: not written).
        lr_scales: learning-rate multiples of the ``cores``, ``gates`` and ``other`` groups (default: CoMERA's
            :data:`LR_SCALES`).
        prune_at_end: at the end of the late stage, kill the smallest gates until ``S(D) ≤ S*``
            (:func:`~tensorslim.methods.comera.gates.prune_to_size_`; not in CoMERA), so a run that has not reached
            the target lands on it.
    """

    def __init__(
        self,
        steps: int,
        *,
        late_fraction: float = 0.5,
        config: CoMERAConfig | None = None,
        target_loss: float | None = None,
        freeze_at_target: bool = True,
        truncate_every: int = 0,
        run_dir: Path | None = None,
        lr_scales: dict[str, float] | None = None,
        prune_at_end: bool = False,
    ) -> None:
        self.early_steps, self.late_steps = stage_steps(steps, late_fraction=late_fraction)
        self.objective = CoMERAObjective(config)
        self.target_loss = target_loss
        self.freeze_at_target = freeze_at_target
        self.truncate_every = truncate_every
        self.frozen = False
        self.run_dir = run_dir
        self.lr_scales = dict(lr_scales or LR_SCALES)
        self.prune_at_end = prune_at_end
        self.window = max(1, self.early_steps // 10)
        self.recent: list[float] = []  # task losses of the last `window` early steps (per micro-batch)
        self.reports: dict[str, Any] = {}
        self._info: dict[str, torch.Tensor] = {}
        self._model: nn.Module | None = None

    def build_optimizer(self, model: nn.Module, *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
        """Attach the rank gates, then AdamW over CoMERA's three groups
        (:func:`tensorslim.methods.comera.optim.param_groups`)."""
        enable_gates(model, threshold=self.objective.config.threshold)
        self._model = model  # state_dict() stores its core ranks
        self.reports.setdefault("start_size", float(model_size(model)))
        scales = self.lr_scales
        groups = param_groups(
            model, lr_cores=lr * scales["cores"], lr_gates=lr * scales["gates"], lr_other=lr * scales["other"]
        )
        for group in groups:
            group["lr_scale"] = scales[group["name"]]
            group["weight_decay"] = 0.0 if group["name"] == "gates" else weight_decay
        fused = all(p.device.type in ("cpu", "cuda") for group in groups for p in group["params"])
        return update_small_on_one_thread(torch.optim.AdamW(groups, lr=lr, fused=fused))

    @property
    def late(self) -> bool:
        return self.objective.target_size is not None

    def loss(self, task_loss: torch.Tensor, *, model: nn.Module, step: int) -> torch.Tensor:
        """Early: ``L + γ·R(D)``; late: the λ-switched loss
        (:class:`~tensorslim.methods.comera.objective.CoMERAObjective`)."""
        if self.late:
            loss, self._info = self.objective.late(task_loss, model)
        else:
            loss, self._info = self.objective.early(task_loss, model)
            if step >= self.early_steps - self.window:
                self.recent.append(float(self._info["task"]))
        return loss

    def after_step(self, model: nn.Module, *, optimizer: torch.optim.Optimizer, step: int) -> dict[str, float]:
        """Log penalty, size and λ; freeze the gates at the target; at the end of each stage (and every
        ``truncate_every`` steps) truncate dead ranks; report the ranks at each stage end."""
        metrics = {f"comera_{key}": float(value) for key, value in self._info.items() if key != "task"}
        if "comera_lambda" in metrics:  # a late step: count those whose λ-switch trained the size (for target())
            self.reports["late_size_steps"] = self.reports.get("late_size_steps", 0) + int(metrics["comera_lambda"])
        size = float(model_size(model))
        if self.late and self.freeze_at_target and not self.frozen and size <= float(self.objective.target_size):
            self._freeze(model)
            self.reports["frozen_at"] = {"step": step, "size": size}
        if step == self.early_steps:
            self._end_stage("after_early", model, optimizer=optimizer, step=step)
            if self.late_steps:
                self._start_late(model)
        elif step == self.early_steps + self.late_steps:
            if self.prune_at_end:
                self.reports["pruned_at_end"] = prune_to_size_(model, float(self.objective.target_size))
            self._end_stage("after_late", model, optimizer=optimizer, step=step)
        elif self.truncate_every and step % self.truncate_every == 0:
            truncate_(model, optimizer=optimizer)
        metrics["comera_size"] = size
        return metrics

    def target(self, model: nn.Module) -> dict[str, Any]:
        """CoMERA's size target ``S* = ratio·S`` (``S``: the size when the late stage began): reached when the trained
        size is within 5 % of it; a miss says in one line what the late stage did and what would reach it."""
        size, ratio = float(model_size(model)), self.objective.config.target_ratio
        target = self.reports.get("target_size")
        if target is None:
            steps = self.early_steps + self.late_steps
            note = (
                f"missed: the late stage never started ({self.early_steps} early steps of {steps}); run more "
                "--steps or a larger --comera-late-fraction"
            )
            return {"what": f"CoMERA size S* = {ratio:g}·S", "target": None, "reached": size, "ok": False, "note": note}
        start = target / ratio
        found = {"what": f"CoMERA size S* = {ratio:g}·S (S = {start:,.0f})", "target": target, "reached": size}
        if abs(size - target) <= 0.05 * target:
            return {**found, "ok": True, "note": None}
        note = f"missed: size {size:,.0f} vs {target:,.0f} after {self.late_steps} late-stage steps: "
        if size < target:
            note += "the gates shrank past the target" + (
                "" if self.freeze_at_target else " (--comera-freeze-at-target stops them there)"
            )
            return {**found, "ok": False, "note": note}
        trained = self.reports.get("late_size_steps", 0)
        note += f"the λ-switch trained the size in {trained} of them"
        if trained < self.late_steps:
            note += f" (in the others the task loss was farther from L* = {self.objective.target_loss:.4g})"
        threshold = self.objective.config.threshold
        note += (
            f" and no rank gate fell to the pruning threshold {threshold:g}"
            if size >= start
            else f" and cut the size by {1 - size / start:.0%} of S"
        )
        note += "; more late-stage steps (--steps, --comera-late-fraction) or --prune-at-end reach it"
        return {**found, "ok": False, "note": note}

    def _freeze(self, model: nn.Module) -> None:
        """Stop training the gates: no gradient, so AdamW leaves them (and their moments) as they are."""
        self.frozen = True
        for _, layer in gated_layers(model):
            for gate in layer_gates(layer):
                gate.requires_grad_(False)
                gate.grad = None

    def _start_late(self, model: nn.Module) -> None:
        """``L*`` (the one rule: the given ``target_loss``, else the early stage's last-tenth mean) and ``S*``."""
        target_loss = self.target_loss if self.target_loss is not None else sum(self.recent) / len(self.recent)
        self.objective.start_late(model, target_loss=target_loss)
        self.reports["target_loss"] = target_loss
        self.reports["target_size"] = float(self.objective.target_size)
        self._write_reports()

    def _end_stage(self, stage: str, model: nn.Module, *, optimizer: torch.optim.Optimizer, step: int) -> None:
        truncate_(model, optimizer=optimizer)
        rows = rank_report(model)
        self.reports[stage] = {
            "step": step,
            "size": float(model_size(model)),
            "layers": [{**asdict(row), "ranks": list(row.ranks)} for row in rows],
        }
        print(format_rank_report(rows, title=f"CoMERA ranks {stage.replace('_', ' ')} (step {step})"), flush=True)
        self._write_reports()

    def _write_reports(self) -> None:
        if self.run_dir is None:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        report = {"target_ratio": self.objective.config.target_ratio, "gamma": self.objective.config.gamma}
        (self.run_dir / REPORT_FILE).write_text(json.dumps({**report, **self.reports}, indent=2) + "\n")

    def state_dict(self) -> dict[str, Any]:
        """The ranks of every gated layer (they shrink on truncation), ``S*``/``L*`` and the reports so far."""
        if self._model is None:
            raise ValueError("CoMERAHook.state_dict() before build_optimizer(model): no model to take ranks from")
        return {
            "ranks": {name: list(bond_ranks(layer)) for name, layer in gated_layers(self._model)},
            "target_size": None if not self.late else float(self.objective.target_size),
            "target_loss": self.objective.target_loss if self.late else None,
            "frozen": self.frozen,
            "recent": list(self.recent),
            "reports": self.reports,
        }

    def load_state_dict(self, state: dict[str, Any], *, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Cut the fresh model's cores and gates to the stored ranks (the weights are loaded afterwards)."""
        if not state:  # a checkpoint written before the hook existed: nothing was truncated
            return
        resize_ranks_(model, state["ranks"], optimizer=optimizer)
        self.recent = list(state["recent"])
        self.reports = dict(state["reports"])
        if state["target_size"] is not None:
            device = next(model.parameters()).device
            self.objective.target_loss = float(state["target_loss"])
            self.objective.target_size = torch.tensor(state["target_size"], device=device)
        if state.get("frozen"):
            self._freeze(model)
