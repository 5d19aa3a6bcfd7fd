"""A finished parallel run leaves no gloo thread behind, in every layout.

A gloo group's threads that outlive ``destroy_process_group`` run on into interpreter shutdown, where they could
abort a finished run ("terminate called without an active exception", SIGABRT) on a loaded machine; see
:mod:`tensorslim.distributed.teardown`. The threads left alive are the deterministic symptom, so each layout is
checked for them (``benchmarks/teardown_under_load.py`` repeats whole runs beside busy processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed import workers

ROOT = Path(__file__).resolve().parents[2]
CODE = "import sys; from tests.distributed.workers import teardown_main; teardown_main(*sys.argv[1:])"


def run_layout(layout: str, corpus: Path, out_dir: Path) -> list[str]:
    """Both ranks of a 2-process run in ``layout``; a list of failures, each naming the layout and the rank."""
    args = [str(corpus), str(out_dir), layout]
    with workers.hosted_group() as group:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **group}
        procs = [
            subprocess.Popen([sys.executable, "-c", CODE, str(rank), *args], cwd=ROOT, env=env, stderr=subprocess.PIPE)
            for rank in (0, 1)
        ]
        errors = [proc.communicate(timeout=600)[1].decode() for proc in procs]
    failures = []
    for rank, (proc, error) in enumerate(zip(procs, errors, strict=True)):
        if proc.returncode != 0 or "terminate called" in error:
            failures.append(f"layout {layout}: rank {rank} exited {proc.returncode}: {error[-1500:]}")
            continue
        left = json.loads((out_dir / f"threads_{rank}.json").read_text())["gloo_threads"]
        if left:
            failures.append(f"layout {layout}: rank {rank} kept gloo threads alive after the run: {left}")
    return failures


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="thread names are read from Linux /proc")
@pytest.mark.parametrize("layout", ["dp-shard", "tp-overlap"])
def test_a_finished_run_leaves_no_gloo_thread(layout: str, small_corpus: Path, tmp_path: Path) -> None:
    assert run_layout(layout, small_corpus, tmp_path / layout) == []
