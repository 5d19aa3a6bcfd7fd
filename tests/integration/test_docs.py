"""Every documented snippet and command runs as written: the ```python blocks and the ```bash command lines of
README.md and docs/*.md.

A python block runs on its own (the venv's interpreter, a fresh working folder, ``$TENSORSLIM_CACHE`` in a temporary
folder), so it must import what it uses and build its own toy model and data. A bash block's lines that start with
``tensorslim``, ``python`` or ``torchrun`` (after optional ``VAR=value`` assignments) run in order in one fresh
folder, so a ``--resume`` line continues the run a line above it. Lines that start with anything else (``make``)
are not commands this test runs.

Long commands run at the smallest size that still exercises them (``REWRITES`` and ``ADDED``): every command that
was rewritten says so in the test's output and in its id. Commands that need something CI does not have are in
``NOT_RUN`` with the reason; a whole block can be left out with a ``<!-- not run: reason -->`` comment on the line
before its fence.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent
RUNNERS = ("tensorslim", "python", "torchrun")
TIMEOUT_S = 600
# bitsandbytes (imported by galore-torch) logs this on CPUs with AVX-512 BF16 when the `kernels` package is missing.
BITSANDBYTES_NOISE = "Failed to load CPU gemm_4bit_forward"

# Commands not run, matched by substring: keep this list short, and say why.
NOT_RUN: tuple[tuple[str, str], ...] = (
    ("torchrun ", "several processes (tests/distributed runs `torchrun ... train --tp 2` and the TP styles on CPU)"),
    ("--device cuda", "needs a GPU"),
)

# Size flags and the value the test runs them with (the documented value is replaced).
REWRITES: dict[str, str] = {
    "--steps": "2",
    "--batch-size": "2",
    "--seq-len": "32",
    "--warmup": "0",
    "--repeats": "1",
    "--calib-docs": "4",
    "--sweeps": "1",
    "--steps-per-layer": "1",
    "--task-steps": "1",
    "--eval-docs": "4",
    "--head-docs": "16",
    "--test-docs": "16",
}
# Presets too big for a CPU test; `convert` keeps them (a dry run on the meta device costs no memory).
PRESETS: dict[str, str] = {p: "tiny" for p in ("60m", "130m", "350m", "1b", "7b")} | {"bert6": "bert-tiny"}
# Flags a command gets when it does not give them, so that its defaults do not run a long job.
ADDED: dict[str, tuple[str, ...]] = {
    "train": ("--steps", "2", "--batch-size", "2", "--seq-len", "32", "--eval-blocks", "4", "--no-progress"),
    "bench": ("--preset", "tiny", "--warmup", "0", "--repeats", "1", "--batch-size", "2", "--seq-len", "32"),
    "quantize": ("--calib-docs", "4", "--seq-len", "32"),
    "distill": (
        "--steps-per-layer",
        "1",
        "--task-steps",
        "1",
        "--eval-docs",
        "4",
        "--head-docs",
        "16",
        "--test-docs",
        "16",
        "--batch-size",
        "2",
    )
    + ("--seq-len", "32"),
    "comera_bert.py": ("--steps", "2", "--batch-size", "2", "--seq-len", "32"),
    "profile_step.py": ("--preset", "tiny", "--batch-size", "2", "--seq-len", "32"),
}


@dataclass
class Command:
    """One documented command line: as written, as run, and why it is not run (when it is not)."""

    line: int
    words: list[str]
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    not_run: str | None = None

    @property
    def text(self) -> str:
        return shlex.join(self.words)

    @property
    def rewritten(self) -> bool:
        return self.not_run is None and self.argv != self.words


@dataclass
class Block:
    """A fenced block of a doc: its language, its first line, its source and its commands."""

    path: Path
    line: int
    lang: str
    source: str
    not_run: str | None = None
    commands: list[Command] = field(default_factory=list)

    @property
    def id(self) -> str:
        rewritten = "-rewritten" if any(c.rewritten for c in self.commands) else ""
        return f"{self.path.relative_to(ROOT)}:{self.line}-{self.lang}{rewritten}"


_FENCE = re.compile(r"^```(\w*)\s*$")
_NOT_RUN = re.compile(r"^<!--\s*not run:\s*(.+?)\s*-->\s*$")


def extract(path: Path) -> list[Block]:
    """The ```python and ```bash blocks of a Markdown file, with their commands."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        marker = _NOT_RUN.match(lines[i - 1]) if i > 0 else None
        if fence.group(1) in ("python", "bash"):
            block = Block(path, i + 1, fence.group(1), "\n".join(lines[i + 1 : end]) + "\n", marker and marker.group(1))
            if block.lang == "bash":
                block.commands = commands(lines[i + 1 : end], first_line=i + 2, not_run=block.not_run)
            blocks.append(block)
        i = end + 1
    return blocks


def commands(lines: list[str], *, first_line: int, not_run: str | None) -> list[Command]:
    """The command lines of a bash block (continuations joined), each with the argv the test runs."""
    found, pending, start = [], "", first_line
    for number, raw in enumerate(lines, start=first_line):
        if not pending:
            start = number
        pending += raw.rstrip().removesuffix("\\") + " " if raw.rstrip().endswith("\\") else raw
        if raw.rstrip().endswith("\\"):
            continue
        words, pending = shlex.split(pending, comments=True), ""
        env = {}
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        if not words or Path(words[0]).name not in RUNNERS:
            continue
        command = Command(start, words, env=env, not_run=not_run)
        command.not_run = command.not_run or next((why for key, why in NOT_RUN if key in command.text + " "), None)
        if command.not_run is None:
            command.argv = small(words)
        found.append(command)
    return found


def small(words: list[str]) -> list[str]:
    """The command at the test's size: the rewrites of the tables, and ``/tmp/X`` outputs as ``X`` in the run's
    working folder."""
    argv = list(words)
    program = Path(argv[1]).name if len(argv) > 1 else ""
    for k in range(2, len(argv)):
        flag = argv[k - 1]
        if flag in REWRITES:
            argv[k] = REWRITES[flag]
        elif flag == "--preset" and program != "convert":
            argv[k] = PRESETS.get(argv[k], argv[k])
        elif argv[k].startswith("/tmp/"):
            argv[k] = argv[k].removeprefix("/tmp/")
    extra = ADDED.get(program, ())
    for k in range(0, len(extra), 2):
        if extra[k] not in argv:
            argv += [extra[k], extra[k + 1]] if not extra[k].startswith("--no-") else [extra[k]]
    return argv


BLOCKS = [block for path in DOC_FILES for block in extract(path)]
RUN = [b for b in BLOCKS if b.not_run is None and (b.lang == "python" or any(not c.not_run for c in b.commands))]


def resolve(argv: list[str]) -> list[str]:
    """The venv's programs for `tensorslim` and `python`, and a repository script for `python benchmarks/x.py`."""
    argv = [str(BIN / Path(argv[0]).name), *argv[1:]]
    if Path(argv[0]).name == "python" and len(argv) > 1 and (ROOT / argv[1]).is_file():
        argv[1] = str(ROOT / argv[1])
    return argv


@pytest.fixture(scope="session")
def docs_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the session, shared by the xdist workers: a tokenizer is trained once, not once per worker
    (cache writes are atomic renames, so two workers may fill it at once)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if base.name.startswith("popen-gw") else base) / "docs-cache"


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run one command with one thread; fail with its output unless it exits 0; return its output.

    A ``tensorslim`` command must not print bitsandbytes' kernel warning (the `test_no_bitsandbytes_noise_*` tests).
    """
    full_env = os.environ | {"OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"} | (env or {})
    done = subprocess.run(argv, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=TIMEOUT_S)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"exit {done.returncode}: {shlex.join(argv)}\n{output[-6000:]}"
    if Path(argv[0]).name == "tensorslim":
        assert BITSANDBYTES_NOISE not in output, f"bitsandbytes noise in the output of {shlex.join(argv)}"
    return output


def _slow(block: Block) -> bool:
    return block.lang == "bash" or "train(" in block.source


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id, marks=[pytest.mark.slow] if _slow(b) else []) for b in RUN])
def test_doc_block_runs(block: Block, tmp_path: Path, docs_cache: Path) -> None:
    env = {"TENSORSLIM_CACHE": str(docs_cache)}
    if block.lang == "python":
        script = tmp_path / "block.py"
        script.write_text(block.source)
        print(f"python {block.id}")
        run([sys.executable, str(script)], tmp_path, env)
        return
    for command in block.commands:
        if command.not_run:
            print(f"not run: {command.text}  ({command.not_run})")
            continue
        print(f"{'rewritten' if command.rewritten else 'as written'}: {command.text}")
        if command.rewritten:
            print(f"       ran: {shlex.join(command.argv)}")
        start = time.perf_counter()
        run(resolve(command.argv), tmp_path, env | command.env)
        print(f"       took {time.perf_counter() - start:.1f} s")


def test_docs_have_blocks_and_every_not_run_block_says_why() -> None:
    """The extraction finds the documented blocks, and nothing is left out silently."""
    assert len(RUN) >= 20, [b.id for b in BLOCKS]
    for block in BLOCKS:
        if block.not_run is not None:
            assert len(block.not_run) > 10, f"{block.id}: say why the block is not run"
    skipped = [(b.id, c.text, c.not_run) for b in BLOCKS for c in b.commands if c.not_run]
    print("\n".join(f"not run: {where}: {text}  ({why})" for where, text, why in skipped))


def test_rewrites_shrink_sizes_and_keep_convert_presets() -> None:
    """The rewrite table itself: sizes are replaced or added, `convert` keeps its preset, scripts resolve."""
    (train,) = commands(["tensorslim train --preset 7b --steps 300  # a comment"], first_line=1, not_run=None)
    assert train.rewritten and train.argv[1:6] == ["train", "--preset", "tiny", "--steps", "2"]
    assert "--batch-size" in train.argv and "--no-progress" in train.argv
    (convert,) = commands(["tensorslim convert --preset 7b --method cola"], first_line=1, not_run=None)
    assert not convert.rewritten and convert.argv[-3:] == ["7b", "--method", "cola"]
    (script,) = commands(
        ["OMP_NUM_THREADS=1 python benchmarks/profile_step.py \\", "  --preset 350m --out /tmp/p"],
        first_line=1,
        not_run=None,
    )
    assert script.env == {"OMP_NUM_THREADS": "1"} and script.argv[2:6] == ["--preset", "tiny", "--out", "p"]
    assert resolve(script.argv)[1] == str(ROOT / "benchmarks/profile_step.py")
    (torchrun,) = commands(["torchrun --nproc-per-node 2 -m tensorslim train"], first_line=1, not_run=None)
    assert torchrun.not_run and not torchrun.argv
    assert commands(["make demo", "# tensorslim train"], first_line=1, not_run=None) == []


TINY_RUN = ["--steps", "1", "--batch-size", "2", "--seq-len", "16", "--eval-blocks", "1", "--no-progress"]


def test_no_bitsandbytes_noise_without_galore(tmp_path: Path, small_corpus: Path) -> None:
    """`train --help` and a dense run import no galore-torch, so no bitsandbytes and none of its kernel warning."""
    run([str(BIN / "tensorslim"), "train", "--help"], tmp_path)
    argv = ["train", "--method", "dense", "--data", str(small_corpus), *TINY_RUN]
    code = (
        "import sys\n"
        "from tensorslim.cli.main import main\n"
        f"assert main({argv!r}) in (0, None)\n"
        "assert 'bitsandbytes' not in sys.modules and 'galore_torch' not in sys.modules, 'galore-torch was imported'\n"
    )
    run([sys.executable, "-c", code], tmp_path)


def test_no_bitsandbytes_noise_with_galore(tmp_path: Path, small_corpus: Path) -> None:
    """Building the GaLore optimizer imports galore-torch and so bitsandbytes, whose kernel warning is silenced."""
    output = run(
        [str(BIN / "tensorslim"), "train", "--method", "galore", "--data", str(small_corpus), *TINY_RUN], tmp_path
    )
    assert "deprecated" not in output


def test_docs_cite_papers_not_files_outside_the_repository() -> None:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for path in docs:
        text = path.read_text()
        assert "../shared" not in text and "digest" not in text.lower(), path
        for target in re.findall(r"\]\(([^)#]+)\)", text):  # relative Markdown links resolve inside the repository
            if "://" not in target:
                resolved = (path.parent / target).resolve()
                assert resolved.exists() and ROOT.resolve() in resolved.parents, (path, target)
