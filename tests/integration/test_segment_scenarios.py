"""experiments/segment_scenarios.py: bad input is one line and exit 2; a tiny experiment writes its table, JSON and
figures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))

from segment_scenarios import main  # noqa: E402


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dataset", "lung"], "dataset='lung' is unknown"),
        (["--inputs", "mask,edges"], "inputs='edges' is unknown"),
        (["--train-cases", "0"], "train_cases=0 is invalid; allowed: 1..12"),
        (["--train-cases", "1,13"], "train_cases=13 is invalid; allowed: 1..12"),
        (["--dataset", "brain", "--train-cases", "27"], "allowed: 1..26 for dataset 'brain'"),
        (["--train-cases", "two"], "train_cases='two' is invalid"),
        (["--train-pool", "5", "--train-cases", "6"], "train_cases=6 is invalid; allowed: 1..5"),
        (["--train-pool", "-1"], "train_pool=-1 is invalid"),
        (["--seeds", "0"], "seeds=0 is invalid"),
        (["--intensity", "wild"], "intensity='wild' is unknown"),
        (["--mask-dropout", "1"], "mask_dropout=1.0 is invalid; allowed: a number in [0, 1)"),
        (["--image-size", "36"], "image_size=36 is invalid; allowed: a multiple of 8"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--steps", "1", "--train-cases", "1", "--image-size", "32", "--out-dir", str(tmp_path)]
    assert main(base + argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_tiny_experiment_writes_table_json_and_figures(tmp_path: Path) -> None:
    argv = ["--dataset", "heart", "--inputs", "image,image+mask", "--train-cases", "1"]
    argv += ["--image-size", "32", "--steps", "3", "--batch-size", "2", "--overlay-cases", "2", "--out-dir"]
    assert main([*argv, str(tmp_path)]) == 0
    result = json.loads((tmp_path / "segment_heart.json").read_text())
    assert result["command"].startswith(
        "python experiments/segment_scenarios.py --dataset heart --inputs image,image+mask"
    )
    runs = result["runs"]
    assert sorted((r["inputs"], r["train_cases"]) for r in runs) == [("constant", 1), ("image", 1), ("image+mask", 1)]
    assert all(0.0 <= r["dice"] <= 1.0 for r in runs)
    table = (tmp_path / "segment_heart.md").read_text()
    assert "| constant | 1 | 1 |" in table and "relative gain" in table
    assert (tmp_path / "segment_heart_dice.png").stat().st_size > 0
    assert (tmp_path / "segment_heart_overlays.png").stat().st_size > 0
    assert not (tmp_path / "runs").exists()  # run folders are temporary unless --keep-runs
