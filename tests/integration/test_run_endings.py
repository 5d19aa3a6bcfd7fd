"""Runs that end badly end well: a diverging run stops naming the step with no non-finite checkpoint, and SIGTERM
finishes the step, writes a checkpoint and exits with 128 + 15."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tensorslim.checkpoint import latest_checkpoint
from tensorslim.train.config import TrainConfig
from tensorslim.train.trainer import NonFiniteError, Trainer, train


def _diverging(corpus: Path, out: Path) -> TrainConfig:
    return TrainConfig(
        preset="tiny",
        method="dense",
        lr=1000.0,
        grad_clip=0.0,
        steps=40,
        batch_size=4,
        seq_len=32,
        vocab_size=512,
        data=str(corpus),
        eval_every=40,
        eval_blocks=2,
        checkpoint_every=2,
        out_dir=str(out),
        progress=False,
        tensorboard=False,
    )


def test_a_diverging_run_stops_at_the_first_non_finite_step(small_corpus: Path, tmp_path: Path) -> None:
    config = _diverging(small_corpus, tmp_path)
    with pytest.raises(NonFiniteError, match=r"step (\d+): loss=.* is not finite") as caught:
        train(config)
    step = int(caught.value.args[0].split(":")[0].split()[1])
    assert step < 40
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, step))  # the bad step was never logged as trained
    for folder in (tmp_path / "checkpoints").glob("step_*"):  # every checkpoint holds finite weights only
        assert all(torch.isfinite(t).all() for t in load_file(folder / "model.safetensors").values()), folder


def test_skipping_non_finite_steps_counts_them_and_keeps_weights_finite(small_corpus: Path, tmp_path: Path) -> None:
    config = replace(_diverging(small_corpus, tmp_path), steps=12)
    trainer = Trainer(config, on_nonfinite="skip")
    result = trainer.run()
    assert result.skipped_steps > 0
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert latest_checkpoint(tmp_path / "checkpoints").name == "step_0000012"


def test_the_cli_reports_divergence_in_one_line_with_exit_code_2(small_corpus: Path, tmp_path: Path) -> None:
    args = ["train", "--preset", "tiny", "--method", "dense", "--lr", "1000", "--grad-clip", "0", "--steps", "40"]
    args += ["--batch-size", "4", "--seq-len", "32", "--vocab-size", "512", "--data", str(small_corpus)]
    args += ["--out-dir", str(tmp_path), "--no-progress", "--no-tensorboard", "--eval-blocks", "2"]
    result = subprocess.run([sys.executable, "-m", "tensorslim", *args], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "is not finite" in lines[0], result.stderr


def test_sigterm_finishes_the_step_writes_a_checkpoint_and_exits_143(small_corpus: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"  # beside the cache folder: a run folder must start empty
    args = ["train", "--preset", "tiny", "--method", "cola", "--steps", "10000", "--batch-size", "4"]
    args += ["--seq-len", "32", "--vocab-size", "512", "--data", str(small_corpus), "--out-dir", str(run)]
    args += ["--no-progress", "--no-tensorboard", "--eval-blocks", "2", "--checkpoint-every", "10000"]
    env = {**os.environ, "TENSORSLIM_CACHE": str(tmp_path / "cache")}
    process = subprocess.Popen(
        [sys.executable, "-m", "tensorslim", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 1200  # bounds a hang only: a loaded machine starts the run slowly
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read() if process.stderr else ""
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=1200)
    assert process.returncode == 128 + signal.SIGTERM, err
    checkpoint = latest_checkpoint(run / "checkpoints")
    assert checkpoint is not None and f"checkpoint written to {checkpoint}" in out
    step = int(checkpoint.name.split("_")[1])
    lines = metrics.read_text().splitlines()
    assert step >= 2 and json.loads(lines[-1])["step"] == step  # the checkpoint is of the last finished step
    assert math.isfinite(json.loads(lines[-1])["loss"])
