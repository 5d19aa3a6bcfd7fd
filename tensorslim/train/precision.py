"""Which precision a run trains in: ``fp32``, ``bf16`` autocast, or ``auto`` (bf16 only where the hardware has it).

bf16 autocast keeps fp32 master weights, gradients and optimizer state; matmuls run in bf16 and the reductions
autocast lists as fp32 ops (softmax, log-softmax/cross-entropy, norms) stay in fp32 (the mixed-precision recipe of
Micikevicius et al., 2018, arXiv 1710.03740, §3, with bf16 instead of fp16 so that no loss scaling is needed).
On CPU the trainer and the benchmark also keep bf16 copies of the GEMM weights (:class:`BF16Shadows`): the forward
reads them instead of casting, their gradients stay in bf16 until AdamW casts them back, and every computed value is
the one plain autocast computes.

On a CPU, bf16 pays only with native instructions (AVX-512 BF16 or AMX): elsewhere PyTorch emulates it and a bf16
matmul is several times *slower* than fp32. ``auto`` therefore probes at start: it reads the CPU's flags and times a
small matmul in both precisions, and picks bf16 only when the flags name native bf16 and the bf16 matmul is clearly
faster. The probe's findings go into the run's summary so that a reader sees why a precision was chosen.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tensorslim.layers.lowrank import LowRankLinear

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


def shadowable(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """The weights that bf16 autocast casts whole to bf16 in every forward, as ``(module, attribute)``: those of
    ``nn.Linear`` and of :class:`~tensorslim.layers.lowrank.LowRankLinear` (``B`` only without rank gates, whose
    product with ``B`` is taken in fp32 first). A parameter that any other module also holds (a head tied to the
    embedding) is left out: the embedding reads it in fp32.
    """
    owners: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                owners.setdefault(id(param), []).append((module, name))
    found = []
    for param in model.parameters():
        held = owners[id(param)]
        if not (param.requires_grad and param.dtype == torch.float32 and param.device.type == "cpu"):
            continue
        if not param.is_contiguous():  # the update walks its flat view
            continue
        if all(_casts_whole(module, name) for module, name in held):
            found.extend(held)
    return found


def _casts_whole(module: nn.Module, name: str) -> bool:
    if type(module) is nn.Linear:
        return name == "weight"
    if type(module) is LowRankLinear:
        return name == "weight_a" or (name == "weight_b" and not module.gated)
    return False


def fused_adamw(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` is the plain fused AdamW that :meth:`BF16Shadows.step` reproduces slice by slice."""
    return type(optimizer) is torch.optim.AdamW and all(
        group["fused"] and not group["amsgrad"] and not group["maximize"] and not isinstance(group["lr"], torch.Tensor)
        for group in optimizer.param_groups
    )


class BF16Shadows:
    """bf16 copies of a model's GEMM weights that the forward reads instead of casting the fp32 weights each time.

    The fp32 parameters stay the model's parameters and AdamW's master weights; the shadows are rounded from them
    (round-to-nearest-even, as autocast rounds) after each update, in the same pass over memory
    (:func:`tensorslim.train.optim.adamw_step_bf16_grads`). During :meth:`swapped` the modules hold the shadows, so
    autocast finds its matmul weights already in bf16, and backward leaves their gradients in bf16 on the shadows,
    where autocast's cast would have converted them to fp32 gradients on the parameters. Each value computed is the
    one plain autocast computes: the same bf16 weights, the same bf16 gradient products, and AdamW on the exact fp32
    value of each gradient (``tests/unit/test_precision.py`` checks equal losses). The forward's weight casts and the
    backward's gradient casts, 6 bytes moved per weight each, are gone. This is the "fp32 master copy of weights"
    scheme of Micikevicius et al. (arXiv 1710.03740, §3.1), with the bf16 copy refreshed inside the optimizer pass.

    A parameter that changed outside :meth:`step` (a checkpoint loaded, a hook) is re-rounded at the next
    :meth:`swapped`, found by its version counter. A parameter whose gradient reached it in fp32 anyway (a recomputed
    forward outside :meth:`swapped`) is updated by the optimizer's ordinary step.
    """

    def __init__(self, model: nn.Module) -> None:
        held = shadowable(model)
        params = {id(getattr(m, n)): getattr(m, n) for m, n in held}
        self.params: list[nn.Parameter] = list(params.values())
        self.shadows = {id(p): p.detach().to(torch.bfloat16).requires_grad_(p.requires_grad) for p in self.params}
        self.versions = {id(p): p._version for p in self.params}
        self.slots = [(m, n, self.shadows[id(getattr(m, n))]) for m, n in held]

    def __bool__(self) -> bool:
        return bool(self.params)

    def describe(self) -> dict[str, int]:
        """For the run's summary: how many weights have a bf16 copy, and the copies' bytes (kept between steps,
        where autocast's casts lived only from a forward to its backward)."""
        return {"tensors": len(self.params), "bytes": sum(2 * p.numel() for p in self.params)}

    @contextmanager
    def swapped(self) -> Iterator[None]:
        """The forward's context: every shadowed module holds its bf16 shadow (fresh from its parameter)."""
        with torch.no_grad():
            for p in self.params:
                if p._version != self.versions[id(p)]:
                    self.shadows[id(p)].copy_(p)
                    self.versions[id(p)] = p._version
        saved = [module._parameters[name] for module, name, _ in self.slots]
        try:
            for module, name, shadow in self.slots:
                module._parameters[name] = shadow
            yield
        finally:
            for (module, name, _), param in zip(self.slots, saved, strict=True):
                module._parameters[name] = param

    def grads(self, model: nn.Module) -> list[torch.Tensor]:
        """Every gradient of the step: the shadows' (bf16) and the other parameters' own."""
        grads = []
        for p in model.parameters():  # in the parameters' order, as clip_grad_norm_ sums their norms
            shadow = self.shadows.get(id(p))
            grads += [g for g in (p.grad, None if shadow is None else shadow.grad) if g is not None]
        return grads

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> tuple[float, torch.Tensor | None]:
        """The global gradient norm (each tensor's norm accumulated in fp32, as for the fp32 gradients autocast
        would have made) and the clipping factor for :meth:`step`; fp32 gradients are clipped in place, as
        ``torch.nn.utils.clip_grad_norm_`` does."""
        grads = self.grads(model)
        if not grads:
            return 0.0, None
        norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
        total = torch.linalg.vector_norm(torch.stack(norms))
        if max_norm == float("inf"):
            return total.item(), None
        scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        own = [g for g in grads if g.dtype == torch.float32]
        if own:
            torch._foreach_mul_(own, scale)
        return total.item(), scale

    def step(self, optimizer: torch.optim.Optimizer, *, grad_scale: torch.Tensor | None = None) -> None:
        """One AdamW update of every parameter: the shadowed ones from their bf16 gradients, then their shadows.

        Where a shadowed parameter has no optimizer state yet (the first step), its gradient is cast to fp32 onto the
        parameter and the optimizer's own step creates the state, exactly as for autocast.
        """
        from tensorslim.train.optim import adamw_step_bf16_grads

        updates = []
        for p in self.params:
            shadow = self.shadows[id(p)]
            if shadow.grad is None:
                continue
            if p.grad is not None or not optimizer.state.get(p):
                grad = shadow.grad.float() if grad_scale is None else shadow.grad.float() * grad_scale
                p.grad = grad if p.grad is None else p.grad + grad
            else:
                updates.append((p, shadow.grad, shadow))
        stepped = [p for p in self.params if p.grad is not None]  # updated by the optimizer's own step
        optimizer.step()
        adamw_step_bf16_grads(optimizer, updates, grad_scale=grad_scale)
        with torch.no_grad():  # the fused AdamW kernel does not bump the version counter: refresh what it updated
            for p in stepped:
                self.shadows[id(p)].copy_(p)
        for p in self.params:
            self.versions[id(p)] = p._version

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.zero_grad(set_to_none=True)
        for shadow in self.shadows.values():
            shadow.grad = None
