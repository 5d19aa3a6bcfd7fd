"""Reading through the one Trainer: ``readlm`` pre-trains with skips and resumes exactly; ``longqa`` and the reading
flags of ``tensorslim train``, with their one-line errors."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tensorslim.cli.main import main
from tensorslim.tasks.base import model_tokenizer
from tensorslim.train.config import TrainConfig
from tensorslim.train.trainer import Trainer, train
from tests.helpers import train_until_interrupted


def _config(corpus: Path, out: Path, **overrides: object) -> TrainConfig:
    base = TrainConfig(
        preset="gpt2-tiny",
        task="readlm",
        method="dense",
        steps=6,
        batch_size=3,
        seq_len=32,
        vocab_size=512,
        data=str(corpus),
        eval_every=3,
        eval_blocks=6,
        checkpoint_every=3,
        out_dir=str(out),
        progress=False,
        tensorboard=False,
        task_options={"reader": "random-access", "skip_k": 8, "skip_alpha": 30.0},
    )
    return replace(base, **overrides)


def test_readlm_skips_with_the_losses_it_trains_on_and_resumes_exactly(small_corpus: Path, tmp_path: Path) -> None:
    full = train(_config(small_corpus, tmp_path / "full"))
    assert full.val_metrics["val_read_fraction"] < 0.9 and full.val_metrics["val_mean_skip"] > 0
    cut = _config(small_corpus, tmp_path / "cut")
    train_until_interrupted(cut, after_step=4)
    state = json.loads((tmp_path / "cut" / "checkpoints" / "step_0000003" / "state.json").read_text())
    assert state["data"]["reader"]["lanes"][0]["skips"] is not None  # the reader's position is in the checkpoint
    resumed = train(replace(cut, resume=True))
    assert resumed.losses == full.losses and resumed.val_loss == full.val_loss


def test_readlm_with_alpha_zero_reads_every_window_in_order(small_corpus: Path, tmp_path: Path) -> None:
    trainer = Trainer(_config(small_corpus, tmp_path / "run", task_options={"skip_alpha": 0.0, "skip_k": 8}))
    trainer.run()
    log = trainer.task.stream.reader.log
    assert log.tokens_read == log.tokens_total and set(log.skip_counts) <= {0}
    for record in log.records:
        assert record.starts == list(range(0, record.length, 32))


def test_longqa_trains_from_the_command_line(tmp_path: Path) -> None:
    out = tmp_path / "qa"
    argv = ["train", "--task", "longqa", "--preset", "gpt2-tiny", "--method", "dense", "--steps", "2"]
    argv += ["--batch-size", "2", "--seq-len", "32", "--eval-blocks", "3", "--qa-docs", "4", "--doc-tokens", "256"]
    argv += ["--passage-tokens", "64", "--fact-lead", "16", "--tokenizer", model_tokenizer("minilm")]
    argv += ["--reader", "random-access", "--skip-k", "16", "--skip-alpha", "5", "--out-dir", str(out), "--no-progress"]
    assert main(argv) == 0
    metrics = json.loads((out / "summary.json").read_text())["val_metrics"]
    assert 0 <= metrics["val_accuracy"] <= 1 and 0 < metrics["val_read_fraction"] <= 1


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--skip-k", "0"], "skip_k=0"),
        (["--skip-k", "-4"], "skip_k=-4"),
        (["--skip-alpha", "-1"], "skip_alpha=-1.0"),
        (["--pooling", "max"], "pooling='max'"),
        (["--reader", "skim"], "reader='skim'"),
    ],
)
def test_bad_reading_flags_exit_2_with_one_line(flags: list[str], named: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "--task", "readlm", "--preset", "gpt2-tiny", *flags]) == 2
    error = capsys.readouterr().err.strip()
    assert named in error and "allowed" in error and "\n" not in error
