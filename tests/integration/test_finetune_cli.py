"""``tensorslim finetune``: one fine-tuning run of one method through the Trainer, and its one-line errors."""

from __future__ import annotations

import pytest

from tensorslim.cli.main import main


def test_finetune_trains_one_method_and_reports_its_accuracies(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    argv = ["finetune", "--method", "lora", "--train-size", "16", "--dev-size", "16", "--steps", "1"]
    assert main([*argv, "--out-dir", str(out)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("tensorslim finetune: lora on bbcnews-titles (K=16, 1 steps): development accuracy ")
    assert "test accuracy" in line and str(out) in line
    assert (out / "summary.json").exists() or any(out.iterdir())  # the Trainer's run folder


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (["--method", "ia3"], "method='ia3' is unknown"),
        (["--steps", "0"], "--steps=0 is invalid"),
        (["--train-size", "-1"], "--train-size=-1 is invalid"),
        (["--seq-len", "1"], "--seq-len=1 is invalid"),
    ],
)
def test_a_bad_flag_is_a_one_line_error_and_writes_nothing(tmp_path, capsys, flag, message) -> None:
    assert main(["finetune", *flag, "--out-dir", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and "\n" not in error
    assert not (tmp_path / "run").exists()
