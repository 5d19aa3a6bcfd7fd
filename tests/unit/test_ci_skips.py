"""Under CI, a skipped test or test module fails the session (tests/conftest.py); elsewhere skips stay skips."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
# The inner session gets the repository's CI rules: its conftest re-exports tests/conftest.py's hook.
CONFTEST = "from tests.conftest import pytest_configure  # noqa: F401\n"
TESTS = """
import pytest

def test_passes():
    pass

def test_needs_a_missing_package():
    pytest.importorskip("no_such_package_tensorslim")

@pytest.mark.skipif(True, reason="declared: not for this machine")
def test_declared_skip():
    pass

@pytest.mark.xfail(reason="known bug", strict=True)
def test_known_bug():
    assert False
"""
# hypothesis's plugin would import hypothesis afresh in every in-process run (2 s): the inner runs do without it.
ARGS = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")
MODULE_SKIP = """
import pytest

pytest.importorskip("no_such_package_tensorslim")

def test_never_collected():
    pass
"""


@pytest.fixture
def inner(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_inner=TESTS, test_module_skip=MODULE_SKIP)
    pytester.syspathinsert(ROOT)
    return pytester


@pytest.mark.parametrize("value", [None, "", "0", "false"])
def test_skips_stay_skips_outside_ci(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    result = inner.runpytest(*ARGS)
    result.assert_outcomes(passed=1, skipped=3, xfailed=1)
    assert result.ret == pytest.ExitCode.OK


@pytest.mark.parametrize("value", ["true", "1"])
def test_skips_fail_under_ci(inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    result = inner.runpytest(*ARGS, "-rf")
    # The runtime skip fails, the skipif mark and the xfail are kept, and the skipped module fails the session.
    result.assert_outcomes(passed=1, failed=1, skipped=2, xfailed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*test modules skipped while CI is set*",
            "test_module_skip.py: could not import 'no_such_package_tensorslim'*",
            "FAILED test_inner.py::test_needs_a_missing_package - could not import * -- a test may not skip when CI*",
        ]
    )


def test_a_skipped_module_alone_fails_the_session(inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    result = inner.runpytest(*ARGS, "test_module_skip.py")
    assert result.ret == pytest.ExitCode.TESTS_FAILED


@pytest.mark.slow
def test_skips_fail_under_ci_with_xdist(inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    result = inner.runpytest_subprocess(*ARGS, "-n", "2", "-rf")
    result.assert_outcomes(passed=1, failed=1, skipped=2, xfailed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*test modules skipped while CI is set*", "test_module_skip.py: could not import*"])
