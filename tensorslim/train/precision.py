"""Which precision a run trains in: ``fp32``, ``bf16`` autocast, or ``auto`` (bf16 only where the hardware has it).

bf16 autocast keeps fp32 master weights, gradients and optimizer state; matmuls run in bf16 and the reductions
autocast lists as fp32 ops (softmax, log-softmax/cross-entropy, norms) stay in fp32 (the mixed-precision recipe of
Micikevicius et al., 2018, arXiv 1710.03740, §3, with bf16 instead of fp16 so that no loss scaling is needed).

On a CPU, bf16 pays only with native instructions (AVX-512 BF16 or AMX): elsewhere PyTorch emulates it and a bf16
matmul is several times *slower* than fp32. ``auto`` therefore probes at start: it reads the CPU's flags and times a
small matmul in both precisions, and picks bf16 only when the flags name native bf16 and the bf16 matmul is clearly
faster. The probe's findings go into the run's summary so that a reader sees why a precision was chosen.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

DTYPES = ("fp32", "bf16", "auto")
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# bf16 must beat fp32 by this much on the probe matmul: a native kernel is 2-4x faster, an emulated one slower, and a
# shared machine's noise stays well inside the gap.
MIN_SPEEDUP = 1.3


@dataclass(frozen=True)
class PrecisionProbe:
    """What ``auto`` found about the device.

    Attributes:
        device: ``cpu`` or ``cuda``.
        capability: ``torch.backends.cpu.get_cpu_capability()`` (CPU) or the CUDA device name.
        native_flags: the CPU flags that name native bf16 (empty where none, or not Linux).
        fp32_gflops: throughput of the probe matmul in fp32.
        bf16_gflops: the same in bf16.
        bf16_native: the verdict: bf16 hardware present and faster than fp32.
    """

    device: str
    capability: str
    native_flags: tuple[str, ...]
    fp32_gflops: float
    bf16_gflops: float
    bf16_native: bool

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "native_flags": list(self.native_flags)}


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU feature flags of the first core (empty where ``/proc/cpuinfo`` does not exist)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return frozenset()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def _matmul_gflops(dtype: torch.dtype, device: torch.device, *, size: int = 512, repeats: int = 5) -> float:
    """Best-of-``repeats`` throughput of a ``size``³ matmul (best, not mean: other processes only slow it down)."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    best = float("inf")
    for _ in range(repeats + 1):  # the first call pays for lazy kernel selection
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def probe_bf16(device: torch.device | str = "cpu") -> PrecisionProbe:
    """Whether ``device`` computes bf16 natively: flags (CPU) or ``is_bf16_supported`` (CUDA), and a bf16 matmul at
    least :data:`MIN_SPEEDUP` times faster than fp32 (about 50 ms on a CPU)."""
    device = torch.device(device)
    fp32 = _matmul_gflops(torch.float32, device)
    bf16 = _matmul_gflops(torch.bfloat16, device)
    if device.type == "cuda":
        capability, flags = torch.cuda.get_device_name(device), ()
        hardware = torch.cuda.is_bf16_supported()
    else:
        capability = torch.backends.cpu.get_cpu_capability()
        flags = tuple(sorted(set(NATIVE_BF16_FLAGS) & cpu_flags()))
        hardware = bool(flags)
    return PrecisionProbe(
        device=device.type,
        capability=capability,
        native_flags=flags,
        fp32_gflops=fp32,
        bf16_gflops=bf16,
        bf16_native=hardware and bf16 >= MIN_SPEEDUP * fp32,
    )


def resolve_dtype(
    requested: str, device: torch.device | str, *, probe: Callable[[torch.device], PrecisionProbe] = probe_bf16
) -> tuple[str, PrecisionProbe | None]:
    """The precision a run uses (``fp32`` or ``bf16``) and, for ``auto``, the probe that chose it.

    ``probe`` is injectable so that the choice can be tested without depending on the machine.
    """
    if requested not in DTYPES:
        raise ValueError(f"dtype={requested!r} is invalid; allowed: {list(DTYPES)}")
    if requested != "auto":
        return requested, None
    found = probe(torch.device(device))
    return ("bf16" if found.bf16_native else "fp32"), found


def autocast(dtype: str, device: torch.device | str) -> Any:
    """The autocast context of a resolved precision (a no-op context for fp32)."""
    if dtype == "bf16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return nullcontext()
