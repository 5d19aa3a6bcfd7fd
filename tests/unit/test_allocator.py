"""keep_freed_memory: a tensor freed and allocated again no longer faults its pages in (glibc on Linux)."""

from __future__ import annotations

import ctypes
import resource

import torch

from tensorslim.train.allocator import M_MMAP_MAX, M_TRIM_THRESHOLD, keep_freed_memory


def _glibc_defaults() -> None:
    """glibc's default mmap count and trim threshold (any Trainer built earlier in this process changed them)."""
    libc = ctypes.CDLL("libc.so.6")
    assert libc.mallopt(M_MMAP_MAX, 65536) == 1 and libc.mallopt(M_TRIM_THRESHOLD, 128 * 1024) == 1


def _faults_of_fresh_tensor(numel: int) -> int:
    """Minor page faults taken while allocating, filling and freeing a ``numel``-float tensor."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.ones(numel)
    del x
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_freed_memory_is_reused_without_page_faults() -> None:
    numel = 40 * 2**20 // 4  # 40 MiB: above glibc's largest mmap threshold (32 MiB), so mmap'd and unmapped
    pages = numel * 4 // resource.getpagesize()
    _glibc_defaults()
    # glibc's default: every allocation of this size maps fresh pages and faults them all in.
    assert all(_faults_of_fresh_tensor(numel) > pages // 2 for _ in range(3))
    assert keep_freed_memory()  # the CI machines run glibc on Linux
    # The heap grows for the first few allocations (glibc's aligned allocation does not fit the exact hole a freed
    # block leaves until free neighbours coalesce), then the same memory is reused every time.
    faults = [_faults_of_fresh_tensor(numel) for _ in range(16)]
    assert max(faults[-4:]) < pages // 20, faults
