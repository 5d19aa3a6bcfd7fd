"""``torchrun --nproc-per-node 2 -m tensorslim train --tp 2 --tp-style btp`` end to end, resumed at TP=1."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tensorslim.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def _losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_torchrun_tp2_matches_and_resumes_on_one_process(small_corpus: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    flags = ["--steps", "4", "--batch-size", "4", "--seq-len", "32", "--eval-every", "2", "--checkpoint-every", "2"]
    flags += ["--eval-blocks", "4", "--vocab-size", "512", "--data", str(small_corpus), "--out-dir", str(run)]
    flags += ["--no-progress", "--no-tensorboard"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "tensorslim", "train"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TENSORSLIM_DIST_TIMEOUT": "60"}
    done = subprocess.run([*torchrun, *flags, "--tp", "2"], cwd=ROOT, env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    tp2 = _losses(run)
    assert len(tp2) == 4
    # Roll back to the step-2 checkpoint (full, unsharded state) and finish on one process with the plain trainer.
    shutil.rmtree(run / "checkpoints" / "step_0000004")
    (run / "checkpoints" / "latest").write_text("step_0000002")
    assert main(["train", *flags, "--resume"]) == 0
    resumed = _losses(run)
    assert max(abs(a - b) for a, b in zip(resumed, tp2, strict=True)) < 1e-5
