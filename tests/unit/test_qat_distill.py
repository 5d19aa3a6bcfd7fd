"""The ``distill`` task and the ``tt-qat`` method on a tiny BERT: the loss against an independent computation from
hooks and explicit formulas, the curriculum, the TT-SVD student, bad input."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from tensorslim.layers.tt import TTLinear
from tensorslim.methods import MethodContext, method_options
from tensorslim.methods.qat import TTQATOptions, convert_tt_qat
from tensorslim.quant.distill import attention_kl, distill_loss, embedding_loss, hidden_loss, layers_in_use
from tensorslim.quant.qat import LearnedScaleQuantizer
from tensorslim.tasks.distill import Distillation, DistillOptions

HEADS, D = 2, 16


def _tiny_bert(seed: int = 0) -> nn.Module:
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=60,
        hidden_size=D,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        intermediate_size=32,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertModel(config).eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 60, (3, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, 7:] = 0  # one padded sequence
    return ids, mask


def _task(teacher: nn.Module, **options: int) -> Distillation:
    task = Distillation(options)
    task.attach_teacher(teacher)
    return task


def _reference_states(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> tuple[list, list]:
    """Hidden states from forward hooks (the release's capture) and attention probabilities recomputed from the
    hooked query/key projections: ``softmax(q kᵀ / √d_head)`` over the unmasked keys."""
    hidden, qk = {}, {}
    names = ["embeddings"] + [f"encoder.layer.{i}" for i in range(len(model.encoder.layer))]
    handles = []
    for name in names:

        def keep(_m: nn.Module, _i: tuple, out: object, name: str = name) -> None:
            hidden[name] = out[0] if isinstance(out, tuple) else out

        handles.append(model.get_submodule(name).register_forward_hook(keep))
    for i, layer in enumerate(model.encoder.layer):
        for part in ("query", "key"):

            def keep_qk(_m: nn.Module, _i: tuple, out: torch.Tensor, key: tuple = (i, part)) -> None:
                qk[key] = out

            handles.append(getattr(layer.attention.self, part).register_forward_hook(keep_qk))
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    for handle in handles:
        handle.remove()
    b, t = ids.shape
    attentions = []
    for i in range(len(model.encoder.layer)):
        q = qk[(i, "query")].reshape(b, t, HEADS, D // HEADS).transpose(1, 2)  # (B, H, T, dh)
        k = qk[(i, "key")].reshape(b, t, HEADS, D // HEADS).transpose(1, 2)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(D // HEADS)  # (B, H, T, T)
        attentions.append(scores.masked_fill(mask[:, None, None, :] == 0, float("-inf")).softmax(-1))
    return [hidden[n] for n in names], attentions


def _h_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    cos = (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))
    return ((a - b) ** 2).mean() + 1 - cos.mean()


def _kl_ref(s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    t, s = t + 1e-8, s + 1e-8
    return (t * (t.log() - s.log())).sum() / t.numel()


def _pooled_ref(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.stack([h[i, mask[i].bool()].mean(0) for i in range(len(h))])


@pytest.mark.parametrize("step", [0, 2, 4])
def test_task_loss_equals_the_formula_on_hooked_states(step: int) -> None:
    teacher, student = _tiny_bert(0), _tiny_bert(1)
    ids, mask = _batch()
    task = _task(teacher, steps_per_layer=2)
    task.begin_step(step)
    got = task.loss(student, (ids, mask))
    hs, att_s = _reference_states(student, ids, mask)
    ht, att_t = _reference_states(teacher, ids, mask)
    layer_use = 1 + step // 2  # 1, 2, then 3 = L + 1: every layer and the embedding loss
    active = min(layer_use, 2)
    expected = (
        _h_ref(hs[0], ht[0])
        + sum(_h_ref(hs[i + 1], ht[i + 1]) + _kl_ref(att_s[i], att_t[i]) for i in range(active)) / layer_use
    )
    if layer_use == 3:
        s, t = _pooled_ref(hs[-1], mask), _pooled_ref(ht[-1], mask)
        expected = expected + 1 - ((s * t).sum(-1) / (s.norm(dim=-1) * t.norm(dim=-1))).mean()
    assert got.item() > 0.1
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_curriculum_adds_one_layer_every_n_steps_then_the_task_phase() -> None:
    task = _task(_tiny_bert(), steps_per_layer=3)
    got = []
    for step in range(10):
        task.begin_step(step)
        got.append(task.layer_use)
    assert got == [1, 1, 1, 2, 2, 2, 3, 3, 3, 3]
    assert got == [layers_in_use(s, steps_per_layer=3, n_layers=2) for s in range(10)]


def test_loss_terms_match_explicit_formulas() -> None:
    g = torch.Generator().manual_seed(1)
    hs = [torch.randn(2, 5, 8, generator=g) for _ in range(3)]
    ht = [torch.randn(2, 5, 8, generator=g) for _ in range(3)]
    att_s = tuple(torch.softmax(torch.randn(2, 2, 5, 5, generator=g), -1) for _ in range(2))
    att_t = tuple(torch.softmax(torch.randn(2, 2, 5, 5, generator=g), -1) for _ in range(2))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    torch.testing.assert_close(hidden_loss(hs[0], ht[0]), _h_ref(hs[0], ht[0]))
    torch.testing.assert_close(attention_kl(att_s[0], att_t[0]), _kl_ref(att_s[0], att_t[0]))
    full = _h_ref(hs[0], ht[0]) + sum(_h_ref(hs[i + 1], ht[i + 1]) + _kl_ref(att_s[i], att_t[i]) for i in range(2)) / 3
    torch.testing.assert_close(distill_loss(hs, ht, att_s, att_t, layer_use=3), full)
    s, t = _pooled_ref(hs[2], mask), _pooled_ref(ht[2], mask)
    cos = (s * t).sum(-1) / (s.norm(dim=-1) * t.norm(dim=-1))
    torch.testing.assert_close(embedding_loss(hs[2], ht[2], mask), 1 - cos.mean())


def _student(teacher: nn.Module, **options: object) -> tuple[nn.Module, list]:
    student = copy.deepcopy(teacher)
    context = MethodContext(
        model_name="tiny-bert",
        family="hf-bert",
        model_config=teacher.config,
        task="embed",
        options=method_options("tt-qat", options),
        pretrained=True,
    )
    return student, convert_tt_qat(student, context)


def test_full_rank_tt_svd_student_starts_at_zero_loss_and_random_does_not() -> None:
    teacher = _tiny_bert()
    ids, mask = _batch()
    task = _task(teacher, steps_per_layer=1)
    task.begin_step(10)  # every layer and the embedding loss
    exact, reports = _student(teacher, rank=64, n_cores=2, qat="none")
    assert len(reports[0].layers) == 2 * 6 and all(
        isinstance(exact.get_submodule(r.name), TTLinear) for r in reports[0].layers
    )
    assert task.loss(exact, (ids, mask)).item() < 1e-4
    random_student, _ = _student(teacher, rank=64, n_cores=2, qat="none", init="random")
    assert task.loss(random_student, (ids, mask)).item() > 0.1


def test_qat_student_has_learned_scales_and_a_short_fit_lowers_the_loss() -> None:
    teacher = _tiny_bert()
    ids, mask = _batch()
    student, _ = _student(teacher, rank=4, n_cores=2, bits=4)
    assert any(isinstance(m, LearnedScaleQuantizer) for m in student.modules())
    task = _task(teacher, steps_per_layer=100)
    optimizer = torch.optim.Adam(student.parameters(), lr=3e-3)
    losses = []
    for step in range(30):
        task.begin_step(step)
        loss = task.loss(student, (ids, mask))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) < 0.8 * sum(losses[:5])
    assert all(p.grad is None for p in teacher.parameters())


def test_bad_distillation_input() -> None:
    with pytest.raises(ValueError, match="steps_per_layer=0"):
        DistillOptions(steps_per_layer=0)
    with pytest.raises(ValueError, match="qat='int4' is not supported"):
        TTQATOptions(qat="int4")
    with pytest.raises(ValueError, match="init='x' is not supported"):
        TTQATOptions(init="x")
    with pytest.raises(ValueError, match="bits=9"):
        TTQATOptions(bits=9)
    with pytest.raises(ValueError, match="no teacher"):
        Distillation().loss(_tiny_bert(), _batch())
    with pytest.raises(ValueError, match="needs a pretrained teacher"):
        Distillation().build_data(SimpleNamespace(), model_name="tiny")
