"""The loss of layer-by-layer distillation into a tensor-compressed, quantization-aware student.

QAT-TT (Yang, Choudhary, Kunzmann, Zhang, "Quantization-Aware and Tensor-Compressed Training of Transformers for
Natural Language Understanding", arXiv 2306.01076) distills a TT + LSQ student from its pretrained teacher layer by
layer. As in its released code, the hidden states compared are the outputs of the embeddings and of every encoder
layer (a Hugging Face model's ``hidden_states``) and the attention probabilities those of ``output_attentions``.
At step ``t`` the curriculum uses ``layer_use = min(1 + t // steps_per_layer, L + 1)`` and the loss is

    embedding (MSE + 1 − cos) + (1/layer_use) Σ_{i < min(layer_use, L)} [MSE(h_s, h_t) + 1 − cos(h_s, h_t)]
                              + (1/layer_use) Σ_i KL(att_t ‖ att_s)

(attention probabilities + 1e-8, ``F.kl_div`` mean reduction, cosine over the hidden axis averaged over tokens).
Once every layer is on (``layer_use = L + 1``) the task loss is added. The training itself is the ``distill`` task
(:mod:`tensorslim.tasks.distill`) of the one Trainer; the student is built by the ``tt-qat`` method
(:mod:`tensorslim.methods.qat`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


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


def distill_loss(
    student_h: Sequence[torch.Tensor],
    teacher_h: Sequence[torch.Tensor],
    student_att: Sequence[torch.Tensor],
    teacher_att: Sequence[torch.Tensor],
    *,
    layer_use: int,
) -> torch.Tensor:
    """The release's layer-wise loss for the first ``layer_use`` encoder layers (see the module docstring).

    Args:
        student_h, teacher_h: ``L + 1`` hidden states ``(B, T, D)``: the embeddings' output, then each layer's.
        student_att, teacher_att: ``L`` attention probabilities ``(B, heads, T, T)``.
        layer_use: the curriculum's :func:`layers_in_use`.
    """
    n_layers = len(teacher_h) - 1
    loss = hidden_loss(student_h[0], teacher_h[0])
    active = min(layer_use, n_layers)
    layer_terms = sum(hidden_loss(student_h[i + 1], teacher_h[i + 1]) for i in range(active))
    att_terms = sum(attention_kl(student_att[i], teacher_att[i]) for i in range(active))
    return loss + (layer_terms + att_terms) / layer_use


def mean_pooled(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sentence embeddings ``(B, D)``: the mean of ``(B, T, D)`` hidden states over the unmasked tokens."""
    weights = mask[..., None].to(hidden.dtype)  # (B, T, 1)
    return (hidden * weights).sum(1) / weights.sum(1)


def embedding_loss(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The sentence-embedding task loss: ``1 −`` mean cosine of the mean-pooled outputs ``(B, T, D)``."""
    return 1 - F.cosine_similarity(mean_pooled(student, mask), mean_pooled(teacher, mask), dim=-1).mean()


def logit_kl(student: torch.Tensor, teacher: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """``KL(p_t ‖ p_s)`` of the next-token distributions of ``(B, T, V)`` logits, per token (``"mean"``) or summed
    over the tokens (``"sum"``); temperature 1 (Hinton et al., arXiv 1503.02531), in float32."""
    s = F.log_softmax(student.float().flatten(0, -2), dim=-1)  # (B·T, V)
    t = F.log_softmax(teacher.float().flatten(0, -2), dim=-1)
    per_token = (t.exp() * (t - s)).sum(-1)  # (B·T,)
    return per_token.sum() if reduction == "sum" else per_token.mean()
