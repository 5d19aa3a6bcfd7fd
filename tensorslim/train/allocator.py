"""Keep the memory a training step frees, so that the next step does not fault it in again (glibc on Linux).

PyTorch's CPU allocator is the C library's ``malloc``. glibc serves blocks above its mmap threshold (at most 32 MiB)
with fresh ``mmap`` calls, returns them with ``munmap`` when freed, and trims the top of its heap. A training step
frees and allocates the same tensors again every step: gradients, the bf16 copies of the weights under autocast,
activations, the logits. So every step faults the same pages in again, and the kernel zeroes each one. A dense
``350m`` LLaMA step took about 340,000 minor page faults (1.4 GB) and 0.6–1.7 s of system time next to 3.8 s of user
time (one thread, bf16; ``benchmarks/results/speed_allocator_350m_*``).

:func:`keep_freed_memory` turns glibc's mmap path off (``M_MMAP_MAX = 0``) and stops it trimming the heap
(``M_TRIM_THRESHOLD``), so that freed blocks stay in the heap and are reused. This is the effect that PyTorch's CPU
tuning guide gets from jemalloc or tcmalloc through ``LD_PRELOAD``, without a new library or a restart. The
trade-off is memory: the process keeps its heap until it exits, and the heap fragments (glibc's aligned allocation
cannot reuse a freed block of exactly the requested size), so the peak resident memory grows: 1.81 → 2.27–2.45 GB in
a ``60m`` CoLA training run, against 7.9 → 2.2 s of system time (``benchmarks/results/speed_allocator_60m_*``).
"""

from __future__ import annotations

import ctypes
import platform
import sys

# glibc's <malloc.h> parameter numbers.
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
# mallopt takes an int: the largest trim threshold it can express (2 GiB of free heap top before trimming).
NEVER_TRIM = 2**31 - 1


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory in the process; returns whether it applied (False off glibc, e.g. macOS).

    Process-wide and kept until exit. It changes only where ``malloc`` finds memory, never a computed value.
    """
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    # mallopt returns 1 on success; both are needed: without the trim threshold, the freed top of the heap is
    # returned to the kernel and faulted in again just the same.
    return libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM) == 1
