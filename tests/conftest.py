"""Test-wide settings: a private cache folder, so tests never write to the user's cache; no skips under CI.

A test that needs an optional package (cvxpy, tensorly, peft, transformers, MiniLM, datasets) may skip on a bare
install. When the environment variable ``CI`` is set (``CI=true``, as CI services set it), such a skip fails the
session instead, so a missing test dependency can never pass unnoticed: a test that skips becomes a failure
(naming the reason), and a test module that skips at import (a module-level ``pytest.importorskip``) is listed at
the end and makes pytest exit with 1. Only a ``skip``/``skipif`` mark is a declared skip that CI accepts, e.g. a
test that applies to CPU-only machines and skips where CUDA is present.
"""

from __future__ import annotations

import os
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


# --- no skips under CI -------------------------------------------------------------------------------------------

CI_ENV = "CI"


def ci_enabled() -> bool:
    """True when ``$CI`` is set to anything but an empty string, ``0``, ``false`` or ``no``."""
    return os.environ.get(CI_ENV, "").strip().lower() not in ("", "0", "false", "no")


def pytest_configure(config: pytest.Config) -> None:
    if ci_enabled():
        config.pluginmanager.register(NoSkipsInCI(config), "tensorslim-no-skips-in-ci")


class NoSkipsInCI:
    """The plugin that fails skipped tests and sessions with skipped test modules (see the module docstring)."""

    def __init__(self, config: pytest.Config) -> None:
        # Under pytest-xdist the controller receives every worker's skipped module, so only it keeps the list.
        self.tracks_modules = not hasattr(config, "workerinput")
        self.skipped_modules: list[tuple[str, str]] = []

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
        """A skipped test becomes a failed one, unless a skip mark declared it (an xfail stays an xfail)."""
        report = yield
        if report.skipped and not hasattr(report, "wasxfail") and not _declared(item, call):
            report.outcome = "failed"
            report.longrepr = f"{_reason(report)} -- a test may not skip when {CI_ENV} is set; install what it needs"
        return report

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """Collection cannot fail softly (an error stops the run), so a module that skips is only noted here."""
        if self.tracks_modules and report.skipped:
            self.skipped_modules.append((report.nodeid, _reason(report)))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.skipped_modules:
            terminalreporter.section(f"test modules skipped while {CI_ENV} is set", sep="=", red=True, bold=True)
            for nodeid, reason in self.skipped_modules:
                terminalreporter.line(f"{nodeid}: {reason}")

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        ok = session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
        if self.skipped_modules and ok:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The text of a skip: its ``longrepr`` is ``(path, line, "Skipped: <reason>")``."""
    longrepr = report.longrepr
    return (longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)).removeprefix("Skipped: ")


def _declared(item: pytest.Item, call: pytest.CallInfo) -> bool:
    """A skip that a ``skip``/``skipif`` mark declared: pytest evaluates those marks first, at setup."""
    marked = any(item.iter_markers("skip")) or any(item.iter_markers("skipif"))
    return call.when == "setup" and marked
