"""Which precision a run trains in: ``fp32``, ``bf16`` autocast, or ``auto`` (bf16 only where the hardware has it).

bf16 autocast keeps fp32 master weights, gradients and optimizer state; matmuls run in bf16 and the reductions
autocast lists as fp32 ops (softmax, log-softmax/cross-entropy, norms) stay in fp32 (the mixed-precision recipe of
Micikevicius et al., 2018, arXiv 1710.03740, §3, with bf16 instead of fp16 so that no loss scaling is needed).

On a CPU, bf16 pays only with native instructions (AVX-512 BF16 or AMX): elsewhere PyTorch emulates it and a bf16
matmul is several times *slower* than fp32. ``auto`` therefore decides from what the device declares, never from a
timing (a timing on a shared machine flips from one run to the next): on a CPU, bf16 exactly when its feature flags
name native bf16 (``avx512_bf16`` or ``amx_bf16`` in ``/proc/cpuinfo``); on CUDA, when
``torch.cuda.is_bf16_supported()``. The same machine always gets the same answer, and the run's summary records
what was found and why.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

DTYPES = ("fp32", "bf16", "auto")
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class PrecisionProbe:
    """What ``auto`` found about the device (read from what it declares; nothing is timed).

    Attributes:
        device: ``cpu`` or ``cuda``.
        capability: ``torch.backends.cpu.get_cpu_capability()`` (CPU) or the CUDA device name.
        native_flags: the CPU flags that name native bf16 (empty where none, or not Linux).
        bf16_native: the verdict: the device computes bf16 natively.
    """

    device: str
    capability: str
    native_flags: tuple[str, ...]
    bf16_native: bool

    @property
    def reason(self) -> str:
        """One line naming what was found, e.g. ``"CPU AVX512 with native bf16 (avx512_bf16)"``."""
        if self.device == "cuda":
            return f"{self.capability} {'supports' if self.bf16_native else 'does not support'} bf16"
        if self.bf16_native:
            return f"CPU {self.capability} with native bf16 ({', '.join(self.native_flags)})"
        return f"CPU {self.capability} without native bf16 (no {' or '.join(NATIVE_BF16_FLAGS)} flag)"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "native_flags": list(self.native_flags), "reason": self.reason}


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU feature flags of the first core (empty where ``/proc/cpuinfo`` does not exist)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return frozenset()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def probe_bf16(device: torch.device | str = "cpu", *, flags: frozenset[str] | None = None) -> PrecisionProbe:
    """Whether ``device`` computes bf16 natively: its CPU flags (``flags``, default ``/proc/cpuinfo``'s) or, on CUDA,
    ``torch.cuda.is_bf16_supported()``. Deterministic: the same machine always gets the same verdict."""
    device = torch.device(device)
    if device.type == "cuda":
        supported = torch.cuda.is_bf16_supported()
        return PrecisionProbe(
            device="cuda", capability=torch.cuda.get_device_name(device), native_flags=(), bf16_native=supported
        )
    native = tuple(sorted(set(NATIVE_BF16_FLAGS) & (cpu_flags() if flags is None else flags)))
    return PrecisionProbe(
        device="cpu",
        capability=torch.backends.cpu.get_cpu_capability(),
        native_flags=native,
        bf16_native=bool(native),
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
