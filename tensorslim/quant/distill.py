"""Layer-by-layer distillation of a tensor-compressed, quantization-aware student (tensor.md §4.3).

As in the released QAT-TT code (``utils.py`` L62-272, ``distill.py`` L175-198): forward hooks capture the outputs of
the embeddings and of every encoder layer of teacher and student; attention probabilities come from
``output_attentions=True``. At step ``t`` the curriculum uses ``layer_use = min(1 + t // steps_per_layer, L + 1)``
and the loss is

    embedding (MSE + 1 − cos) + (1/layer_use) Σ_{i < min(layer_use, L)} [MSE(h_s, h_t) + 1 − cos(h_s, h_t)]
                              + (1/layer_use) Σ_i KL(att_t ‖ att_s)

(attention probabilities + 1e-8, ``F.kl_div`` mean reduction, cosine over the hidden axis averaged over tokens).
Once every layer is on (``layer_use = L + 1``) the task loss is added and the learning rate drops to ``final_lr``.

Student construction (our addition, the issue's comparison): a copy of the teacher whose encoder linear layers are
:class:`~tensorslim.layers.tt.TTLinear`, initialized by TT-SVD of the teacher weights or randomly (the release uses
random cores), then prepared for QAT with :func:`~tensorslim.quant.qat.prepare_qat_`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.layers.tt import TTConfig
from tensorslim.quant.qat import QATConfig, prepare_qat_

TaskLoss = Callable[[object, object, dict], torch.Tensor]  # (student_out, teacher_out, batch) -> loss


@dataclass(frozen=True, kw_only=True)
class DistillConfig:
    """Curriculum and optimizer settings (release: 2000 steps per layer, lr 1e-3 → 2e-5, grad-norm 10).

    Attributes:
        steps_per_layer: steps before one more encoder layer joins the loss.
        task_steps: steps of the final phase (all layers + task loss at ``final_lr``).
        lr: learning rate of the layer-wise phase (Adam, constant, as released).
        final_lr: learning rate once the task loss is on.
        max_grad_norm: gradient clipping.
    """

    steps_per_layer: int = 2000
    task_steps: int = 1000
    lr: float = 1e-3
    final_lr: float = 2e-5
    max_grad_norm: float = 10.0

    def __post_init__(self) -> None:
        for name in ("steps_per_layer", "task_steps"):
            if getattr(self, name) < 0 or (name == "steps_per_layer" and self.steps_per_layer < 1):
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= {1 if name == 'steps_per_layer' else 0}")
        if not (self.lr > 0 and self.final_lr > 0):
            raise ValueError(f"lr={self.lr!r} and final_lr={self.final_lr!r} must be > 0")


def layers_in_use(step: int, *, steps_per_layer: int, n_layers: int) -> int:
    """The release's curriculum ``min(1 + step // steps_per_layer, L + 1)``; ``L + 1`` means the task phase."""
    return min(1 + step // steps_per_layer, n_layers + 1)


def hidden_loss(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """``MSE + (1 − mean cosine)`` over ``(B, T, D)`` hidden states."""
    return F.mse_loss(student, teacher) + (1 - F.cosine_similarity(student, teacher, dim=-1).mean())


def attention_kl(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """``KL(att_t ‖ att_s)`` of ``(B, heads, T, T)`` probabilities as released: ``kl_div(log(s+1e-8), t+1e-8)``
    with the default ``"mean"`` reduction (a mean over all entries), written out to avoid its deprecation warning."""
    t = teacher + 1e-8
    return (t * (torch.log(t) - torch.log(student + 1e-8))).mean()


class HiddenCapture:
    """Forward hooks that keep the output hidden state of named submodules (first element of a tuple output)."""

    def __init__(self, model: nn.Module, names: list[str]) -> None:
        self.names, self.outputs = names, {}
        self.handles = [model.get_submodule(n).register_forward_hook(self._hook(n)) for n in names]

    def _hook(self, name: str):  # noqa: ANN202 - a torch hook
        def hook(_: nn.Module, __: tuple, output: object) -> None:
            self.outputs[name] = output[0] if isinstance(output, tuple) else output

        return hook

    def take(self) -> list[torch.Tensor]:
        outs = [self.outputs[n] for n in self.names]
        self.outputs = {}
        return outs

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def bert_distill_points(model: nn.Module) -> list[str]:
    """``embeddings`` + ``encoder.layer.{i}`` of a Hugging Face BERT (``BertModel``, or ``bert.`` inside a head)."""
    prefix = "bert." if hasattr(model, "bert") else ""
    encoder = model.get_submodule(prefix + "encoder")
    return [prefix + "embeddings"] + [f"{prefix}encoder.layer.{i}" for i in range(len(encoder.layer))]


def distill_loss(
    student_h: list[torch.Tensor],
    teacher_h: list[torch.Tensor],
    student_att: tuple,
    teacher_att: tuple,
    *,
    layer_use: int,
) -> torch.Tensor:
    """The release's layer-wise loss for the first ``layer_use`` encoder layers (see the module docstring)."""
    n_layers = len(teacher_h) - 1
    loss = hidden_loss(student_h[0], teacher_h[0])
    active = min(layer_use, n_layers)
    layer_terms = sum(hidden_loss(student_h[i + 1], teacher_h[i + 1]) for i in range(active))
    att_terms = sum(attention_kl(student_att[i], teacher_att[i]) for i in range(active))
    return loss + (layer_terms + att_terms) / layer_use


@dataclass
class DistillHistory:
    losses: list[float] = field(default_factory=list)
    layer_use: list[int] = field(default_factory=list)


def _cycle(batches: Iterable[dict]) -> Iterator[dict]:
    while True:
        empty = True
        for batch in batches:
            empty = False
            yield batch
        if empty:
            raise ValueError("distillation data is empty: pass at least one batch")


def distill(
    teacher: nn.Module,
    student: nn.Module,
    batches: Iterable[dict],
    config: DistillConfig,
    *,
    points: list[str] | None = None,
    task_loss: TaskLoss | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> DistillHistory:
    """Train ``student`` to match ``teacher`` layer by layer, then on the task (tensor.md §4.3).

    Args:
        teacher: frozen reference model (Hugging Face BERT-like; called with ``output_attentions=True``).
        student: same architecture with compressed layers.
        batches: re-iterable keyword batches (``input_ids``, ``attention_mask``, and task labels if any).
        config: curriculum and optimizer settings.
        points: hooked submodules, embeddings first (default: :func:`bert_distill_points`).
        task_loss: loss of the final phase; default: the layer-wise loss alone with every layer on.
        on_step: called with ``(step, loss)`` after each step.
    """
    points = points or bert_distill_points(teacher)
    n_layers = len(points) - 1
    teacher.eval()
    student.train()
    t_cap, s_cap = HiddenCapture(teacher, points), HiddenCapture(student, points)
    optimizer = torch.optim.Adam([p for p in student.parameters() if p.requires_grad], lr=config.lr)
    total = config.steps_per_layer * n_layers + config.task_steps
    history = DistillHistory()
    try:
        for step, batch in zip(range(total), _cycle(batches), strict=False):
            layer_use = layers_in_use(step, steps_per_layer=config.steps_per_layer, n_layers=n_layers)
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            with torch.no_grad():
                t_out = teacher(**inputs, output_attentions=True)
            s_out = student(**inputs, output_attentions=True)
            loss = distill_loss(s_cap.take(), t_cap.take(), s_out.attentions, t_out.attentions, layer_use=layer_use)
            if layer_use > n_layers:
                for group in optimizer.param_groups:
                    group["lr"] = config.final_lr
                if task_loss is not None:
                    loss = loss + task_loss(s_out, t_out, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(student.parameters(), config.max_grad_norm)
            optimizer.step()
            history.losses.append(float(loss.detach()))
            history.layer_use.append(layer_use)
            if on_step is not None:
                on_step(step, float(loss.detach()))
    finally:
        t_cap.remove()
        s_cap.remove()
    return history


def build_student(
    teacher: nn.Module,
    *,
    tt: TTConfig,
    qat: QATConfig | None,
    filter_fn: Callable[[nn.Module, str], bool] | None = None,
) -> tuple[nn.Module, object]:
    """A deep copy of ``teacher`` with encoder linear layers in TT format (TT-SVD or random cores), QAT-prepared.

    Returns:
        ``(student, conversion report)``.
    """
    from tensorslim.convert import convert_

    student = copy.deepcopy(teacher)
    filter_fn = filter_fn or (lambda m, n: isinstance(m, nn.Linear) and ".encoder." in f".{n}")
    report = convert_(student, tt, filter_fn=filter_fn)
    if qat is not None:
        prepare_qat_(student, qat)
    return student, report


def mean_pooled(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sentence embeddings ``(B, D)``: the mean of ``(B, T, D)`` hidden states over the unmasked tokens."""
    weights = mask[..., None].to(hidden.dtype)  # (B, T, 1)
    return (hidden * weights).sum(1) / weights.sum(1)


def embedding_loss(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The sentence-embedding task loss: ``1 −`` mean cosine of the mean-pooled outputs ``(B, T, D)``."""
    return 1 - F.cosine_similarity(mean_pooled(student, mask), mean_pooled(teacher, mask), dim=-1).mean()
