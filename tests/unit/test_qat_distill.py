"""Layer-by-layer distillation: curriculum, loss terms against explicit formulas, TT-SVD student, a tiny run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tensorslim.layers.tt import TTConfig, TTLinear
from tensorslim.quant.distill import (
    DistillConfig,
    attention_kl,
    bert_distill_points,
    build_student,
    distill,
    distill_loss,
    hidden_loss,
    layers_in_use,
)
from tensorslim.quant.qat import LearnedScaleQuantizer, QATConfig


def _tiny_bert() -> nn.Module:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=60,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        attn_implementation="eager",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertModel(config).eval()


def _batches() -> list[dict]:
    g = torch.Generator().manual_seed(0)
    return [
        {"input_ids": torch.randint(0, 60, (4, 12), generator=g), "attention_mask": torch.ones(4, 12, dtype=torch.long)}
        for _ in range(2)
    ]


def test_curriculum_adds_one_layer_every_n_steps_then_the_task_phase() -> None:
    got = [layers_in_use(s, steps_per_layer=3, n_layers=2) for s in range(10)]
    assert got == [1, 1, 1, 2, 2, 2, 3, 3, 3, 3]


def test_loss_terms_match_explicit_formulas() -> None:
    g = torch.Generator().manual_seed(1)
    hs = [torch.randn(2, 5, 8, generator=g) for _ in range(3)]
    ht = [torch.randn(2, 5, 8, generator=g) for _ in range(3)]
    att_s = tuple(torch.softmax(torch.randn(2, 2, 5, 5, generator=g), -1) for _ in range(2))
    att_t = tuple(torch.softmax(torch.randn(2, 2, 5, 5, generator=g), -1) for _ in range(2))

    def h_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        cos = (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))
        return ((a - b) ** 2).mean() + 1 - cos.mean()

    def kl_ref(s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        t, s = t + 1e-8, s + 1e-8
        return (t * (t.log() - s.log())).sum() / t.numel()

    assert torch.allclose(hidden_loss(hs[0], ht[0]), h_ref(hs[0], ht[0]), atol=1e-6)
    assert torch.allclose(attention_kl(att_s[0], att_t[0]), kl_ref(att_s[0], att_t[0]), atol=1e-6)
    expected = h_ref(hs[0], ht[0]) + (h_ref(hs[1], ht[1]) + kl_ref(att_s[0], att_t[0])) / 1
    assert torch.allclose(distill_loss(hs, ht, att_s, att_t, layer_use=1), expected, atol=1e-6)
    full = h_ref(hs[0], ht[0]) + sum(h_ref(hs[i + 1], ht[i + 1]) + kl_ref(att_s[i], att_t[i]) for i in range(2)) / 3
    assert torch.allclose(distill_loss(hs, ht, att_s, att_t, layer_use=3), full, atol=1e-6)


def test_full_rank_tt_svd_student_starts_at_zero_loss_and_random_does_not() -> None:
    teacher = _tiny_bert()
    assert bert_distill_points(teacher) == ["embeddings", "encoder.layer.0", "encoder.layer.1"]
    config = DistillConfig(steps_per_layer=1, task_steps=0, lr=1e-12)  # lr ~ 0: the loss of the initial student
    exact, report = build_student(teacher, tt=TTConfig(rank=64, n_cores=2), qat=None)
    assert all(isinstance(exact.get_submodule(r.name), TTLinear) for r in report.layers)
    assert len(report.layers) == 2 * 6
    first = distill(teacher, exact, _batches(), config).losses[0]
    assert first < 1e-4
    random_student, _ = build_student(teacher, tt=TTConfig(rank=64, n_cores=2, init="random"), qat=None)
    assert distill(teacher, random_student, _batches(), config).losses[0] > 100 * max(first, 1e-6)


def test_short_qat_distillation_lowers_the_loss_and_removes_its_hooks() -> None:
    teacher = _tiny_bert()
    student, _ = build_student(teacher, tt=TTConfig(rank=4, n_cores=2), qat=QATConfig(mode="weight", bits=4))
    assert any(isinstance(m, LearnedScaleQuantizer) for m in student.modules())
    history = distill(teacher, student, _batches(), DistillConfig(steps_per_layer=30, task_steps=0, lr=3e-3))
    assert history.layer_use[:30] == [1] * 30
    assert sum(history.losses[25:30]) < sum(history.losses[:5])
    # transformers installs its own output-recording hooks lazily; none of ours may remain
    hooks = [h for m in list(teacher.modules()) + list(student.modules()) for h in m._forward_hooks.values()]
    assert not [h for h in hooks if "HiddenCapture" in getattr(h, "__qualname__", "")]


def test_bad_distillation_input() -> None:
    with pytest.raises(ValueError, match="steps_per_layer"):
        DistillConfig(steps_per_layer=0)
    teacher = _tiny_bert()
    with pytest.raises(ValueError, match="empty"):
        distill(teacher, teacher, [], DistillConfig(steps_per_layer=1, task_steps=0))
