"""The command line answers ``--help`` and ``--version`` without importing torch, from texts that equal what the
real parsers print."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from importlib.metadata import version

import pytest

from tensorslim.cli import help_cache
from tensorslim.cli.help_texts import TEXTS
from tensorslim.cli.main import COMMANDS
from tensorslim.methods import METHODS
from tensorslim.tasks import TASKS


def _cli_without_torch(*argv: str) -> str:
    """The output of ``tensorslim argv`` in a fresh interpreter, which must not have imported torch."""
    code = (
        "import atexit, sys; from tensorslim.cli.main import main; "
        "atexit.register(lambda: print('torch' in sys.modules, file=sys.stderr)); main(sys.argv[1:])"
    )
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
    assert done.stderr.strip() == "False", "torch was imported"
    return done.stdout


def test_rendered_help_equals_the_real_parsers() -> None:
    fresh = help_cache.render_all()
    stale = sorted(c for c in fresh if TEXTS.get(c) != fresh[c])
    assert not stale, f"help of {stale} is stale: run `python -m tensorslim.cli.help_cache`"
    assert set(TEXTS) == set(fresh)


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["generate", "--run", "x", "-h"]])
def test_help_prints_without_importing_torch(argv: list[str]) -> None:
    command = argv[0] if argv[0] in COMMANDS else ""
    assert _cli_without_torch(*argv) == TEXTS[command]


def test_version_is_the_installed_packages() -> None:
    assert _cli_without_torch("--version").strip() == f"tensorslim {version('tensorslim')}"


def test_train_help_names_every_task_and_each_methods_own_default() -> None:
    text = " ".join(TEXTS["train"].split())  # undo the line wrapping
    for task in TASKS:
        assert f"\n  {task} " in TEXTS["train"], task
    rank_help = text.split("--rank INT ", 1)[1].split("--lora-alpha", 1)[0]
    qat_rank = next(f for f in dataclasses.fields(METHODS["tt-qat"].options) if f.name == "rank").default
    assert f"(default: {qat_rank}) [tt-qat]" in rank_help
    lora_rank = next(f for f in dataclasses.fields(METHODS["lora"].options) if f.name == "rank").metadata["help"]
    assert rank_help.count(lora_rank) == 1 and rank_help.index("[cola,") > rank_help.index(lora_rank)


def test_transformers_load_reports_are_silenced_unless_asked_for() -> None:
    pytest.importorskip("transformers")
    code = (
        "import os; [os.environ.pop(k, None) for k in ('TRANSFORMERS_VERBOSITY', 'HF_HUB_DISABLE_PROGRESS_BARS')]; "
        "from tensorslim.cli.main import quiet_third_parties; quiet_third_parties(); "
        "from transformers import BertConfig, BertForSequenceClassification; import tempfile; "
        "d = tempfile.mkdtemp(); BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, "
        "intermediate_size=64, vocab_size=64).save_pretrained(d); "
        "from transformers import BertModel; BertModel(BertConfig.from_pretrained(d)).save_pretrained(d); "
        "BertForSequenceClassification.from_pretrained(d, num_labels=3)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "LOAD REPORT" not in done.stderr and "Loading weights" not in done.stderr, done.stderr


def test_a_section_several_commands_print_is_written_once() -> None:
    shared = "method options (each applies):\n  --rank INT    rank\n  --bits INT    bits"
    texts = {"": "usage: top\n\nintro\n", "a": f"usage: a\n\n{shared}\n", "b": f"usage: b\n\nmine\n\n{shared}\n"}
    code = help_cache.source(texts)
    assert code.count("--rank INT") == 1 and "METHOD_OPTIONS = " in code
    namespace: dict = {}
    exec(compile(code, "help_texts", "exec"), namespace)  # noqa: S102 - the module just generated
    assert namespace["TEXTS"] == texts
