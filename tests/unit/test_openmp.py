"""The command line's OpenMP wait policy: a bounded spin only when our threads have the cores to themselves."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorslim.cli import openmp
from tensorslim.cli.openmp import SPIN_COUNT, apply_wait_policy, choose_wait_policy, runnable_others

SPIN = {"GOMP_SPINCOUNT": str(SPIN_COUNT)}
PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}


@pytest.mark.parametrize(
    ("cores", "threads", "others", "expected"),
    [
        (2, 2, 0, SPIN),  # a quiet 2-core machine
        (2, 2, 1, PASSIVE),  # one other busy process: a spinning thread would take its core
        (2, 1, 1, SPIN),  # one torch thread beside one busy process: both have a core
        (4, 2, 3, PASSIVE),
        (2, 2, None, PASSIVE),  # load unknown (no /proc/stat): the safe choice
    ],
)
def test_spin_only_when_every_thread_has_a_free_core(
    cores: int, threads: int, others: int | None, expected: dict[str, str]
) -> None:
    assert choose_wait_policy(cores=cores, threads=threads, others=others) == expected


def test_runnable_others_is_the_median_read_less_the_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "stat"
    later = iter([9, 3])  # a daemon wakes for the second read only

    def next_read(_: float) -> None:
        path.write_text(f"cpu  1 2 3 4\nprocs_running {next(later)}\nprocs_blocked 0\n")

    path.write_text("cpu  1 2 3 4\nprocs_running 3\nprocs_blocked 0\n")
    monkeypatch.setattr(openmp.time, "sleep", next_read)
    assert runnable_others(samples=3, stat_path=str(path)) == 2
    path.write_text("procs_running 1\n")
    assert runnable_others(samples=1, stat_path=str(path)) == 0


def test_runnable_others_is_unknown_without_the_kernel_count(tmp_path: Path) -> None:
    assert runnable_others(samples=1, stat_path=str(tmp_path / "missing")) is None
    (tmp_path / "stat").write_text("cpu  1 2 3 4\n")
    assert runnable_others(samples=1, stat_path=str(tmp_path / "stat")) is None


@pytest.mark.parametrize("setting", [{"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "0"}])
def test_a_users_own_setting_is_kept(setting: dict[str, str]) -> None:
    environ = dict(setting)
    assert apply_wait_policy(environ) == {} and environ == setting


def test_apply_sets_exactly_one_policy() -> None:
    environ: dict[str, str] = {"OMP_NUM_THREADS": "1"}
    added = apply_wait_policy(environ)
    assert added in (SPIN, PASSIVE) and environ == {"OMP_NUM_THREADS": "1", **added}
