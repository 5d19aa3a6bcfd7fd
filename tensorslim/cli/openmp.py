"""How idle OpenMP threads wait between parallel regions, chosen before torch loads OpenMP.

PyTorch's Linux wheels run their CPU kernels on GNU OpenMP (libgomp), which reads its settings once, when it loads.
Between two parallel regions a worker thread spins ``GOMP_SPINCOUNT`` times and then sleeps;
``OMP_WAIT_POLICY=PASSIVE`` makes it sleep at once. The two costs pull apart (``benchmarks/openmp_wait.py``):

- on a quiet machine, sleeping threads make every region pay a wake-up, and a CoLA step is many short regions (its
  rank-r products): against passive threads, a spin of ``SPIN_COUNT`` made the ``350m`` CoLA step 1.18x (fp32) and
  1.49x (bf16) faster, dense 1.05x and 1.29x, the tiny demo step 1.22x (an AMX Xeon, 2 cores);
- on a busy machine, a spinning thread takes a core that another process's thread needs: beside one busy process,
  libgomp's own default (300,000 spins) made those steps 2-12x slower than passive threads, and ``SPIN_COUNT``
  1.1-1.9x slower.

So the command line looks before it starts: when every torch thread has a core that no other running process
wants, threads spin briefly (``SPIN_COUNT``, a bounded spin that limits the harm if other jobs start later), and
otherwise they sleep at once. The choice is made once, at start: if other jobs start later, a run keeps spinning
(set ``OMP_WAIT_POLICY=PASSIVE`` yourself on a machine you share). A user's own ``OMP_WAIT_POLICY`` or
``GOMP_SPINCOUNT`` is always kept.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import MutableMapping

# Rounds of libgomp's busy-wait loop (one pause instruction each); chosen in benchmarks/openmp_wait.py.
SPIN_COUNT = 10_000
USER_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def choose_wait_policy(*, cores: int, threads: int, others: int | None) -> dict[str, str]:
    """The environment variables to set: a bounded spin when the machine is free for our threads, else passive.

    Args:
        cores: the cores this process may run on.
        threads: the threads torch will start (``OMP_NUM_THREADS``, else one per core).
        others: runnable threads of other processes right now (None where this cannot be read: passive).
    """
    if others is not None and others + threads <= cores:
        return {"GOMP_SPINCOUNT": str(SPIN_COUNT)}
    return {"OMP_WAIT_POLICY": "PASSIVE"}


def runnable_others(*, samples: int = 5, interval_s: float = 0.01, stat_path: str = "/proc/stat") -> int | None:
    """Runnable threads of other processes: the median of a few reads of the kernel's ``procs_running``, less ours.

    The median of reads ~10 ms apart, not one read, so that a daemon waking for an instant does not count. None
    off Linux (no ``/proc/stat``).
    """
    counts = []
    for index in range(samples):
        if index:
            time.sleep(interval_s)
        try:
            with open(stat_path) as stat:
                line = next((line for line in stat if line.startswith("procs_running")), None)
        except OSError:
            return None
        if line is None:
            return None
        counts.append(int(line.split()[1]))
    return max(0, int(statistics.median(counts)) - 1)  # the reading thread itself is running


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def apply_wait_policy(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Choose and set the wait policy (call before torch is imported); returns what it added.

    A user's own ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` wins: then nothing is added.
    """
    if any(name in environ for name in USER_SETTINGS):
        return {}
    cores = _cores()
    threads_setting = environ.get("OMP_NUM_THREADS", "")
    threads = int(threads_setting) if threads_setting.isdigit() and int(threads_setting) > 0 else cores
    added = choose_wait_policy(cores=cores, threads=threads, others=runnable_others())
    environ.update(added)
    return added
