"""Run folders never lose work: a second run into a used folder is refused, a finished run resumed changes nothing,
``--overwrite`` replaces only a run's own outputs, and two runs never share a folder at once."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tensorslim.cli.main import main
from tensorslim.train.run_folder import RunFolderError, claim


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_used_folder_is_refused_resumed_only_when_unfinished_and_overwritten_only_when_asked(
    small_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    args = ["train", "--steps", "2", "--batch-size", "2", "--seq-len", "32", "--vocab-size", "512", "--eval-blocks"]
    args += ["2", "--data", str(small_corpus), "--no-progress", "--no-tensorboard", "--out-dir", str(run)]
    assert main(args) == 0
    first = _files(run)
    assert "summary.json" in first and "metrics.jsonl" in first
    capsys.readouterr()

    assert main([*args, "--steps", "3"]) == 2  # a second run into the same folder
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and str(run) in error
    assert "--resume" in error and "--overwrite" in error and "new folder" in error
    assert _files(run) == first

    assert main([*args, "--resume"]) == 0  # the run already ended: nothing to do
    assert "already finished at step 2" in capsys.readouterr().out
    assert _files(run) == first

    (run / "notes.txt").write_text("mine")
    assert main([*args, "--overwrite"]) == 2  # --overwrite never deletes what is not a run's
    assert "notes.txt" in capsys.readouterr().err and _files(run) == {**first, "notes.txt": b"mine"}
    (run / "notes.txt").unlink()

    assert main([*args, "--overwrite", "--seed", "1"]) == 0
    assert _files(run)["summary.json"] != first["summary.json"]


def test_a_folder_in_use_is_refused_and_freed_when_its_run_is_killed(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from tensorslim.train.run_folder import claim; "
            "claim(sys.argv[1], resume=False, overwrite=False); print('held', flush=True); time.sleep(3600)",
            str(folder),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunFolderError, match="is in use by another run"):
            claim(folder, resume=False, overwrite=False)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    claim(folder, resume=False, overwrite=False).release()  # the killed run left no stale lock
    assert list(folder.iterdir()) == []  # and no lock file
