"""Test-wide settings: a private cache folder, so tests never write to the user's cache."""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

import pytest
import torch

# pytest-xdist runs two workers on two cores: one thread each avoids OpenMP oversubscription, which made small
# steps up to 20x slower when both workers spun two threads.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORSLIM_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of a dozen real stdlib modules (about 300 kB): big enough to train on, quick to tokenize."""
    folder = tmp_path_factory.mktemp("corpus")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    names = ["argparse", "ast", "calendar", "csv", "dataclasses", "difflib", "fractions", "functools", "heapq"]
    names += ["inspect", "pathlib", "shlex", "string", "textwrap", "typing"]
    for name in names:
        source = stdlib / f"{name}.py"
        if source.exists():
            shutil.copy(source, folder / f"{name}.txt")
    return folder
