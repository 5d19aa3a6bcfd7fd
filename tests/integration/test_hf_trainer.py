"""Converted Hugging Face models train under ``transformers.Trainer``: the loss falls, checkpoints are written, and a
run resumed from a checkpoint (into a freshly built, differently initialised model) ends with the same weights as
the uninterrupted run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from tensorslim.convert import convert_
from tensorslim.layers.lax import LaXCoLAConfig
from tensorslim.layers.lowrank import CoLAConfig
from tensorslim.pretrained import load_pretrained, save_pretrained

transformers = pytest.importorskip("transformers")


def _bert_classifier(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=16,
        num_labels=2,
    )
    model = transformers.BertForSequenceClassification(config)
    convert_(model, CoLAConfig(rank=8))
    return model


def _gpt2(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=16)
    model = transformers.GPT2LMHeadModel(config)
    convert_(model, LaXCoLAConfig(rank=8))  # latent crossings between blocks; the head stays tied to wte
    return model


def _classification_data() -> list[dict[str, torch.Tensor]]:
    """64 sequences whose label is their first token."""
    generator = torch.Generator().manual_seed(0)
    data = []
    for i in range(64):
        ids = torch.randint(2, 64, (12,), generator=generator)
        ids[0] = i % 2
        data.append(
            {"input_ids": ids, "attention_mask": torch.ones(12, dtype=torch.long), "labels": torch.tensor(i % 2)}
        )
    return data


def _lm_data() -> list[dict[str, torch.Tensor]]:
    """Arithmetic sequences with 5 strides: easy to learn."""
    return [{"input_ids": (ids := torch.arange(12) * (i % 5 + 1) % 64), "labels": ids} for i in range(32)]


def _train(
    build: Callable[[int], nn.Module], data: list, out: Path, *, steps: int, resume: Path | None = None, seed: int = 0
) -> transformers.Trainer:
    args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        logging_steps=steps // 4,
        save_steps=steps // 2,
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(model=build(seed), args=args, train_dataset=data)
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    return trainer


def _losses(trainer: transformers.Trainer) -> list[float]:
    return [record["loss"] for record in trainer.state.log_history if "loss" in record]


def _assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    first, second = a.state_dict(), b.state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.parametrize(("build", "data"), [(_bert_classifier, _classification_data), (_gpt2, _lm_data)])
def test_converted_model_trains_checkpoints_and_resumes(
    build: Callable[[int], nn.Module], data: Callable[[], list], tmp_path: Path
) -> None:
    full = _train(build, data(), tmp_path / "full", steps=16)
    losses = _losses(full)
    assert len(losses) == 4 and losses[-1] < 0.9 * losses[0]
    checkpoint = tmp_path / "full" / "checkpoint-8"
    assert (checkpoint / "model.safetensors").is_file()
    resumed = _train(build, data(), tmp_path / "resumed", steps=16, resume=checkpoint, seed=1)
    _assert_same_weights(full.model, resumed.model)
    assert _losses(resumed)[-1] == losses[-1]


def test_a_trained_model_saves_and_loads_with_tensorslim(tmp_path: Path) -> None:
    trainer = _train(_gpt2, _lm_data(), tmp_path / "run", steps=8)
    save_pretrained(trainer.model, tmp_path / "saved")
    loaded = load_pretrained(tmp_path / "saved")
    ids = torch.arange(10)[None] * 3 % 64
    with torch.no_grad():
        assert torch.equal(trainer.model.eval()(ids).logits, loaded(ids).logits)
