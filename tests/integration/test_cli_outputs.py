"""No command writes over what is already there: every output path that exists (a file, or a folder that holds files)
is refused before any work, in one line naming the path and ``--overwrite``, and left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorslim.cli.main import main

MINE = b"mine"


def _used(path: Path, *, folder: bool) -> Path:
    """``path`` holding something of the user's: a file, or a folder with a file in it."""
    if folder:
        path.mkdir()
        (path / "notes.txt").write_bytes(MINE)
    else:
        path.write_bytes(MINE)
    return path


CHUNK = ["--chunk", "8"]

# (command, the flag naming its output, whether that is a folder, further arguments that keep it cheap)
COMMANDS = [
    ("bench", "--out", False, ["--preset", "tiny", "--methods", "cola"]),  # the stem's .json exists (below)
    ("convert", "--save", True, ["--preset", "tiny", "--method", "cola"]),
    ("quantize", "--out", False, ["--method", "rtn"]),
    ("longeval", "--json", False, ["--preset", "tiny", "--length", "32", "--docs", "1", "--capacity", "16", *CHUNK]),
    ("distill", "--out", False, ["--task-steps", "1"]),
    ("export", "--out", True, []),
]


@pytest.mark.parametrize(("command", "flag", "folder", "extra"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_an_existing_output_is_refused_without_overwrite_and_left_as_it_was(
    command: str, flag: str, folder: bool, extra: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if command == "bench":
        used, named = _used(tmp_path / "result.json", folder=False), tmp_path / "result"
    else:
        used = named = _used(tmp_path / "out", folder=folder)
    argv = [command, flag, str(named), *extra]
    if command == "distill":
        argv += ["--out-dir", str(tmp_path / "run")]  # a new run folder: only the report is in the way
    if command == "export":
        argv += ["--run", str(tmp_path / "no-run")]  # the output is refused before the run is even looked at
    capsys.readouterr()
    assert main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and str(named) in error, error
    assert "--overwrite" in error or command == "export", error  # export always writes a new folder
    content = (used / "notes.txt") if folder else used
    assert content.read_bytes() == MINE
    assert sorted(p.name for p in tmp_path.iterdir()) == [used.name]  # nothing else was written


def test_export_to_a_file_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    used = _used(tmp_path / "out", folder=False)
    assert main(["export", "--run", str(tmp_path), "--out", str(used)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1 and used.read_bytes() == MINE
