"""``torchrun --nproc-per-node 2 -m tensorslim train --tp 2`` end to end: the one Trainer on two processes equals it
on one process, reports once, resumes on one process and leaves the process group cleanly."""

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
# --standalone: the rendezvous store binds a port the kernel picks (localhost:0), not the fixed default 29500 that
# another run on the same machine may hold
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
TORCHRUN += ["-m", "tensorslim", "train"]
TITLE = "tensorslim train: tiny / lm / cola"


def _losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _flags(corpus: Path, run: Path, *, steps: int) -> list[str]:
    flags = ["--steps", str(steps), "--batch-size", "4", "--seq-len", "32", "--eval-every", "2"]
    flags += ["--checkpoint-every", "2", "--eval-blocks", "4", "--vocab-size", "512", "--data", str(corpus)]
    return [*flags, "--out-dir", str(run), "--no-progress", "--no-tensorboard"]


def _torchrun(flags: list[str]) -> subprocess.CompletedProcess:
    # the timeouts only bound a hang: on a loaded machine a rank can reach a collective minutes after its peer
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TENSORSLIM_DIST_TIMEOUT": "600"}
    return subprocess.run([*TORCHRUN, *flags], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)


@pytest.mark.slow
def test_torchrun_tp2_matches_one_process_and_resumes_there(
    small_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = tmp_path / "run"
    flags = _flags(small_corpus, run, steps=4)
    done = _torchrun([*flags, "--tp", "2", "--tp-overlap", "full"])  # async latent all-reduces, same math
    assert done.returncode == 0, done.stderr[-3000:]
    assert "terminate called" not in done.stderr
    assert done.stdout.count(TITLE) == 1  # the summary table, from rank 0 only
    tp2 = _losses(run)
    assert len(tp2) == 4
    assert json.loads((run / "summary.json").read_text())["losses"] == tp2
    # The same run on one process: the same Trainer, the same full weights, the same curve.
    assert main(["train", *_flags(small_corpus, tmp_path / "one", steps=4)]) == 0
    assert max(abs(a - b) for a, b in zip(_losses(tmp_path / "one"), tp2, strict=True)) < 1e-5
    # Roll back to the step-2 checkpoint (full, unsharded state) and finish on one process.
    shutil.rmtree(run / "checkpoints" / "step_0000004")
    (run / "checkpoints" / "latest").write_text("step_0000002")
    assert main(["train", *flags, "--resume"]) == 0
    resumed = _losses(run)
    assert max(abs(a - b) for a, b in zip(resumed, tp2, strict=True)) < 1e-5
    assert capsys.readouterr().out.count(TITLE) == 2


@pytest.mark.slow
def test_data_parallel_runs_with_backward_exit_cleanly(small_corpus: Path, tmp_path: Path) -> None:
    # Teardown once aborted some runs (SIGABRT, "terminate called without an active exception") after training
    # had finished; a run must leave the process group after a barrier and exit 0. Pure data parallelism with
    # DDP's reducer and with FSDP2 (--dp-shard 2), TP=2 once (the test above runs it with --tp-overlap full).
    for i, parallel in enumerate([["--tp", "1"], ["--tp", "2"], ["--tp", "1", "--dp-shard", "2"]]):
        done = _torchrun([*_flags(small_corpus, tmp_path / f"run{i}", steps=2), *parallel])
        assert done.returncode == 0, done.stderr[-3000:]
        assert "terminate called" not in done.stderr
    # the FSDP2 run wrote sharded checkpoints, one shard file per process
    assert sorted(p.name for p in (tmp_path / "run2" / "checkpoints" / "step_0000002").glob("*.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]
