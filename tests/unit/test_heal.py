"""Healing a compressed model: layer by layer, then end to end on the Trainer; tiny BERT and tiny LLaMA."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from tensorslim import convert_
from tensorslim.compression.heal import HealConfig, block_schedule, distill, heal, heal_blocks
from tensorslim.layers.lowrank import SVDConfig
from tensorslim.models.llama import LlamaConfig, LlamaForCausalLM
from tensorslim.quant.distill import logit_kl
from tests.helpers import tiny_hf_bert

transformers = pytest.importorskip("transformers")


def _compressed(model: torch.nn.Module, rank: int) -> torch.nn.Module:
    student = copy.deepcopy(model)
    heads = ("lm_head",)
    with pytest.warns(UserWarning):  # a lossy conversion of trained-like weights warns
        convert_(student, SVDConfig(rank=rank), filter_fn=lambda m, n: not n.endswith(heads))
    return student.eval()


def _texts(n: int, *, seed: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[0, 8:] = 0
    return [{"input_ids": torch.randint(0, 64, (4, 12), generator=gen), "attention_mask": mask} for _ in range(n)]


def _error(model: torch.nn.Module, reference: torch.nn.Module, batch: dict) -> float:
    """Relative error of ``model``'s last hidden states against ``reference``'s."""
    with torch.no_grad():
        a, b = model(**batch).last_hidden_state, reference(**batch).last_hidden_state
    return ((a - b).norm() / b.norm()).item()


def test_logit_kl_is_torchs_kl_div() -> None:
    gen = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(2, 5, 11, generator=gen), torch.randn(2, 5, 11, generator=gen)
    expected = F.kl_div(
        F.log_softmax(student.flatten(0, 1), -1),
        F.log_softmax(teacher.flatten(0, 1), -1),
        log_target=True,
        reduction="batchmean",
    )
    assert logit_kl(student, teacher).item() == pytest.approx(expected.item(), rel=1e-5)
    assert logit_kl(student, teacher, reduction="sum").item() == pytest.approx(10 * expected.item(), rel=1e-5)


def test_layer_by_layer_healing_fits_blocks_only_and_brings_the_model_closer() -> None:
    teacher = tiny_hf_bert()
    student = _compressed(teacher, rank=2)
    original = {k: v.clone() for k, v in teacher.state_dict().items()}
    embeddings = {k: v.clone() for k, v in student.embeddings.state_dict().items()}
    held_out = _texts(1, seed=9)[0]
    before = _error(student, teacher, held_out)
    losses = heal_blocks(student, teacher, _texts(4, seed=0), steps=40, lr=3e-3, progress=False)
    assert len(losses) == 2  # both blocks were changed, both were fit
    assert _error(student, teacher, held_out) < before
    assert all(torch.equal(v, embeddings[k]) for k, v in student.embeddings.state_dict().items())
    assert all(torch.equal(v, original[k]) for k, v in teacher.state_dict().items())


def _llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(d_model=64, n_layers=2, n_heads=4, d_ff=128, vocab_size=96, max_seq_len=32, init_std=0.1)
    return LlamaForCausalLM(config).eval()


def test_lm_healing_on_the_trainer_lowers_the_kl_and_reports_perplexity() -> None:
    teacher = _llama()
    student = _compressed(teacher, rank=4)
    gen = torch.Generator().manual_seed(1)
    data = [torch.randint(0, 96, (4, 16), generator=gen) for _ in range(4)]
    held_out = [torch.randint(0, 96, (4, 16), generator=gen)]
    with torch.no_grad():
        kl_before = logit_kl(student(held_out[0]), teacher(held_out[0])).item()
    outside = {k: v.clone() for k, v in student.state_dict().items() if not k.startswith("layers.")}
    student.norm.weight.requires_grad_(False)  # a flag the user set stays as it was
    metrics = distill(
        student, teacher, data, held_out=held_out, config=HealConfig(block_steps=0, steps=12, lr=3e-3, progress=False)
    )
    # only the converted blocks learn: the embeddings, the final norm and the head stay the original's
    assert outside and all(torch.equal(student.state_dict()[k], v) for k, v in outside.items())
    assert [p.requires_grad for p in student.parameters()] == [
        p is not student.norm.weight for p in student.parameters()
    ]
    with torch.no_grad():
        logits = student(held_out[0])
        kl_after = logit_kl(logits, teacher(held_out[0])).item()
        nll = F.cross_entropy(logits[:, :-1].flatten(0, 1), held_out[0][:, 1:].flatten())
    assert kl_after < kl_before
    assert metrics["val_loss"] == pytest.approx(kl_after, rel=1e-4)  # the Trainer evaluated the healed model
    assert metrics["val_perplexity"] == pytest.approx(math.exp(nll.item()), rel=1e-4)


def test_heal_runs_both_stages_and_names_them() -> None:
    teacher = tiny_hf_bert()
    student = _compressed(teacher, rank=2)
    stages: list[str] = []
    before = _error(student, teacher, _texts(1, seed=9)[0])
    config = HealConfig(block_steps=10, block_lr=3e-3, steps=10, lr=1e-4, batch_size=4, progress=False)
    heal(student, teacher, _texts(4, seed=0), held_out=_texts(1, seed=9), config=config, on_stage=stages.append)
    assert stages == ["healed layer by layer (10 steps per block)", "healed end to end (10 steps)"]
    assert _error(student, teacher, _texts(1, seed=9)[0]) < before
    assert not student.training


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"steps": -1}, "steps=-1"),
        ({"block_lr": float("nan")}, "block_lr=nan"),
        ({"lr": 0}, "lr=0"),
        ({"batch_size": 0}, "batch_size=0"),
        ({"loss": "hidden"}, "loss='hidden'"),
    ],
)
def test_heal_config_refuses_bad_values(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        HealConfig(**kwargs)


def test_heal_refuses_inputs_it_cannot_distill_and_changes_nothing() -> None:
    teacher = tiny_hf_bert()
    student = _compressed(teacher, rank=2)
    state = {k: v.clone() for k, v in student.state_dict().items()}
    with pytest.raises(ValueError, match="cannot be healed"):
        heal(student, teacher, [torch.randint(0, 64, (4, 12))])  # an encoder needs its attention mask
    assert all(torch.equal(v, state[k]) for k, v in student.state_dict().items())


def test_layer_by_layer_healing_of_a_llama_brings_its_logits_closer() -> None:
    teacher = _llama()
    student = _compressed(teacher, rank=4)
    gen = torch.Generator().manual_seed(2)
    data = [torch.randint(0, 96, (4, 16), generator=gen) for _ in range(6)]
    held_out = torch.randint(0, 96, (4, 16), generator=gen)
    with torch.no_grad():
        before = logit_kl(student(held_out), teacher(held_out)).item()
    losses = heal_blocks(student, teacher, data, steps=6, lr=3e-3, progress=False)
    with torch.no_grad():
        after = logit_kl(student(held_out), teacher(held_out)).item()
    assert len(losses) == 2
    assert after < before


def test_warmup_cosine_rises_then_falls_to_a_tenth() -> None:
    factors = [block_schedule(100, 1e-3).factor(step) for step in range(100)]
    assert factors[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])  # 5 warm-up steps
    assert factors[5] == pytest.approx(1.0)
    assert factors[-1] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 94 / 95)))
    assert all(a >= b for a, b in zip(factors[5:], factors[6:], strict=False))


def test_a_sequence_classifier_heals_on_its_class_distribution() -> None:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, num_labels=3
    )
    teacher = transformers.BertForSequenceClassification(config).eval()
    with torch.no_grad():
        teacher.classifier.weight.mul_(20)  # confident classes, so that the compression moves the KL clearly
    student = _compressed(teacher, rank=2)
    held_out = _texts(1, seed=9)

    def kl(model: torch.nn.Module) -> float:
        with torch.no_grad():
            return logit_kl(model(**held_out[0]).logits, teacher(**held_out[0]).logits).item()

    before = kl(student)
    metrics = distill(
        student, teacher, _texts(4, seed=0), held_out=held_out,
        config=HealConfig(block_steps=0, steps=15, lr=3e-3, batch_size=4, progress=False),
    )  # fmt: skip
    assert kl(student) < before
    assert metrics["val_loss"] == pytest.approx(kl(student), rel=1e-4)  # the Trainer evaluated the class KL
    with torch.no_grad():
        same = student(**held_out[0]).logits.argmax(-1) == teacher(**held_out[0]).logits.argmax(-1)
    assert metrics["val_agreement"] == pytest.approx(same.float().mean().item())


def test_output_healing_brings_the_last_hidden_state_closer_and_reports_the_pooled_cosine() -> None:
    teacher = tiny_hf_bert()
    student = _compressed(teacher, rank=2)
    held_out = _texts(1, seed=9)

    def pooled_cosine(model: torch.nn.Module) -> float:
        batch = held_out[0]
        mask = batch["attention_mask"][..., None].float()  # (B, T, 1)
        with torch.no_grad():
            s, t = (m(**batch).last_hidden_state for m in (model, teacher))
        pooled = [(h * mask).sum(1) / mask.sum(1) for h in (s, t)]  # (B, D) each
        return F.cosine_similarity(*pooled, dim=-1).mean().item()

    before = _error(student, teacher, held_out[0])
    metrics = distill(
        student, teacher, _texts(4, seed=0), held_out=held_out,
        config=HealConfig(block_steps=0, steps=15, lr=1e-4, batch_size=4, loss="output", progress=False),
    )  # fmt: skip
    assert _error(student, teacher, held_out[0]) < before
    assert metrics["val_cos_mean"] == pytest.approx(pooled_cosine(student), rel=1e-5)  # evaluated the healed model
