"""Every task through the one Trainer: masked LM and classification on the BERT presets, with exact resume."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tensorslim.checkpoint import latest_checkpoint
from tensorslim.tasks.classify import split_rows
from tensorslim.tasks.mlm import MASK_FRACTION, mask_tokens
from tensorslim.train.config import TrainConfig
from tensorslim.train.trainer import Trainer, train
from tests.helpers import train_until_interrupted


def _config(out: Path, **overrides: object) -> TrainConfig:
    base = TrainConfig(
        preset="bert-tiny",
        task="mlm",
        method="dense",
        steps=6,
        batch_size=4,
        seq_len=32,
        vocab_size=512,
        eval_every=3,
        eval_blocks=4,
        checkpoint_every=3,
        out_dir=str(out),
        progress=False,
        tensorboard=False,
    )
    return replace(base, **overrides)


def test_bert_masking_follows_the_paper_proportions() -> None:
    ids = torch.randint(5, 500, (64, 128))
    inputs, labels = mask_tokens(ids, mask_id=999, vocab=500, generator=torch.Generator().manual_seed(0))
    chosen = labels != -100
    assert chosen.float().mean().item() == pytest.approx(MASK_FRACTION, abs=0.01)
    assert torch.equal(labels[chosen], ids[chosen]) and torch.equal(inputs[~chosen], ids[~chosen])
    masked = (inputs == 999)[chosen].float().mean().item()
    kept = (inputs == ids)[chosen].float().mean().item()
    assert masked == pytest.approx(0.8, abs=0.03) and kept == pytest.approx(0.1 + 0.1 / 500, abs=0.03)


@pytest.mark.parametrize(("task", "data", "method"), [("mlm", None, "comera"), ("classify", "bbcnews", "cola")])
def test_interrupted_and_resumed_equals_uninterrupted(
    small_corpus: Path, tmp_path: Path, task: str, data: str | None, method: str
) -> None:
    config = _config(tmp_path / "full", task=task, method=method, data=data or str(small_corpus))
    full = train(config)
    cut = replace(config, out_dir=str(tmp_path / "cut"))

    train_until_interrupted(cut, after_step=4)
    assert latest_checkpoint(tmp_path / "cut" / "checkpoints").name == "step_0000003"
    resumed = train(replace(cut, resume=True))
    assert resumed.losses == full.losses
    assert resumed.val_metrics == full.val_metrics
    assert (tmp_path / "full" / "loss.png").stat().st_size > 0
    summary = json.loads((tmp_path / "full" / "summary.json").read_text())
    assert summary["params_total"] < summary["dense_params_total"]


def test_classification_metrics_equal_a_direct_computation(tmp_path: Path) -> None:
    trainer = Trainer(_config(tmp_path, task="classify", data="bbcnews", batch_size=8))
    rows, pad_id = trainer.data.validation
    trainer.data.validation = (rows[:21], pad_id)  # 8 + 8 + 5: uneven batches must not change the means
    ids, mask, labels = split_rows(rows[:21], pad_id=pad_id)
    trainer.model.eval()
    with torch.no_grad():
        logits = trainer.model(ids, attention_mask=mask)
    metrics = trainer.validate()
    assert metrics["val_loss"] == pytest.approx(F.cross_entropy(logits, labels).item(), rel=1e-5)
    assert metrics["val_accuracy"] == pytest.approx((logits.argmax(-1) == labels).float().mean().item())
    assert set(labels.tolist()) <= set(range(5)) and logits.shape == (21, 5)


def test_a_classification_run_learns_above_the_majority_share(tmp_path: Path) -> None:
    config = _config(
        tmp_path, task="classify", data="bbcnews", steps=100, batch_size=16, seq_len=128, lr=1e-3, eval_every=100
    )
    config = replace(config, vocab_size=None)
    result = train(config)
    # The largest of the 5 BBC classes is 23 % of the test set: a model that learned nothing scores at most that.
    assert result.val_metrics["val_accuracy"] > 0.3


@pytest.mark.parametrize("method", ["unipelt-prompt", "lora"])
def test_adapters_on_our_bert_train_the_adapters_and_head_only(tmp_path: Path, method: str) -> None:
    config = _config(tmp_path, task="classify", data="bbcnews-titles", method=method, steps=3, seq_len=128)
    trainer = Trainer(config)
    from tensorslim.layers.adapters import trainable_parameters

    counts = trainable_parameters(trainer.model)
    head = sum(p.numel() for p in trainer.model.classifier.parameters())
    assert counts["other"] == head and all(p.requires_grad for p in trainer.model.classifier.parameters())
    frozen = {name: p.clone() for name, p in trainer.model.named_parameters() if not p.requires_grad}
    result = trainer.run()
    assert all(torch.equal(p, frozen[name]) for name, p in trainer.model.named_parameters() if name in frozen)
    assert all(math.isfinite(loss) for loss in result.losses)
    if method == "unipelt-prompt":  # 10 more positions than bert-tiny's 128, so 128-token inputs fit beside the prompt
        assert trainer.model.encoder.config.max_seq_len == 128 + 10


def test_adapters_start_from_an_mlm_runs_encoder_with_init_base(small_corpus: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    mlm = train(_config(tmp_path / "mlm", data="bbcnews", steps=3))
    state = load_file(str(latest_checkpoint(Path(mlm.run_dir) / "checkpoints") / "model.safetensors"))
    config = _config(
        tmp_path / "cls", task="classify", data="bbcnews-titles", method="unipelt", init_base=mlm.run_dir, steps=2
    )
    trainer = Trainer(config)
    encoder = [name for name in state if name.startswith("encoder.")]
    assert encoder and all(torch.equal(_unwrapped(trainer.model)[name], state[name]) for name in encoder)  # the run's
    trainer.run()
    assert all(torch.equal(_unwrapped(trainer.model)[name], state[name]) for name in encoder)  # frozen under adapters


def _unwrapped(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state of an equipped model under the base model's names (the wrappers' ``inner.``/``base.`` removed)."""
    return {name.replace(".inner.", ".").replace(".base.", "."): t for name, t in model.state_dict().items()}


def test_init_base_reads_a_save_pretrained_folder(tmp_path: Path) -> None:
    from tensorslim.models import build_model
    from tensorslim.pretrained import save_pretrained

    torch.manual_seed(5)
    mlm = build_model("bert-tiny", task="mlm", vocab_size=576)  # the classify data's vocabulary at --vocab-size 512
    save_pretrained(mlm, tmp_path / "saved", base="bert-tiny")
    config = _config(
        tmp_path / "cls", task="classify", data="bbcnews-titles", method="lora", init_base=str(tmp_path / "saved")
    )
    model = Trainer(config).model
    assert torch.equal(model.encoder.embeddings.word.weight, mlm.encoder.embeddings.word.weight)


@pytest.mark.parametrize(
    ("method", "message"),
    [("cola", "fill encoder only in part"), ("dense", None)],
)
def test_init_base_refuses_another_structure_and_a_path_without_weights(
    tmp_path: Path, method: str, message: str | None
) -> None:
    run = train(_config(tmp_path / "mlm", data="bbcnews", steps=1, method=method))
    config = _config(tmp_path / "cls", task="classify", data="bbcnews-titles", method="lora", init_base=run.run_dir)
    if message is None:  # an unconverted run loads; a folder without weights is refused
        Trainer(config)
        config = replace(config, init_base=str(tmp_path))
        message = "holds no model.safetensors"
    with pytest.raises(ValueError, match=message) as error:
        Trainer(config)
    assert "\n" not in str(error.value)
