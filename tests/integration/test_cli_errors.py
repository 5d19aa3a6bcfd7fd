"""Bad values on the command line: one line naming the value and what is allowed, exit code 2, nothing written.

Each case fails before any model is built or data is read, so the whole file runs in seconds.
"""

from __future__ import annotations

import pytest

from tensorslim.cli.main import main


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The error ``tensorslim argv`` prints, after checking it is one line and the exit code is 2."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--tp", "0"], "tp=0 is invalid; allowed: an integer >= 1"),
        (["train", "--tp", "-1"], "tp=-1 is invalid; allowed: an integer >= 1"),
        (["train", "--tp-style", "zero"], "tp_style='zero' is unknown; allowed: ['btp', 'vanilla', 'megatron']"),
        (["train", "--tp-overlap", "yes"], "tp_overlap='yes' is unknown; allowed: ['none', 'backward', 'full']"),
        (["train", "--lr", "inf"], "lr=inf is invalid; allowed: a finite number > 0"),
        (["train", "--weight-decay", "nan"], "weight_decay=nan is invalid; allowed: a number >= 0"),
        (["train", "--grad-clip", "-1"], "grad_clip=-1.0 is invalid; allowed: a number >= 0"),
    ],
)
def test_bad_value_is_one_line_and_exit_code_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in _one_line_error(argv, capsys)
