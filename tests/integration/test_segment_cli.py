"""``tensorslim segment``: one setting trained and scored through the Trainer, and its one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorslim.cli.main import main
from tensorslim.tasks.segment import load_run


def test_segment_trains_one_setting_scores_it_and_keeps_a_loadable_run(tmp_path: Path, capsys) -> None:
    argv = ["segment", "--dataset", "heart", "--inputs", "image+mask", "--train-cases", "1", "--image-size", "32"]
    argv += ["--steps", "2", "--batch-size", "2", "--out-dir", str(tmp_path / "run")]
    assert main(argv) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("tensorslim segment: heart from image+mask, 1 training cases: test Dice 0.")
    dice = float(line.split("test Dice ")[1].split(",")[0])
    assert 0.0 <= dice <= 1.0
    model, _ = load_run(tmp_path / "run")
    assert sum(p.numel() for p in model.parameters()) > 0


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (["--inputs", "edges"], "inputs='edges' is unknown"),
        (["--train-cases", "13"], "train_cases=13 is invalid; allowed: 1..12"),
        (["--image-size", "36"], "image_size=36 is invalid; allowed: a multiple of 8"),
    ],
)
def test_a_bad_flag_is_a_one_line_error_and_writes_nothing(tmp_path: Path, capsys, flag, message) -> None:
    assert main(["segment", "--steps", "1", "--image-size", "32", *flag, "--out-dir", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and len(error.splitlines()) == 1
    assert not (tmp_path / "run").exists()
