"""A CI-size soak: a 40-step ``tiny`` run killed twice with SIGKILL (once at a random step, once while a checkpoint
is being written) and resumed each time ends with exactly the uninterrupted run's losses, every step of them
(``benchmarks/soak_resume.py`` at its full size: 2,000 steps, 10 kills)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_killed_runs_resume_to_the_uninterrupted_losses(tmp_path: Path) -> None:
    out = tmp_path / "soak.md"
    args = ["--steps", "40", "--kills", "2", "--checkpoint-every", "10", "--seed", "1", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "soak_resume.py"), *args], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    text = out.read_text()
    assert "2 of 2 kills resumed" in text and "every one of the 40 step losses identical: True" in text
    assert "during a checkpoint write" in text or "right after a checkpoint appeared" in text
