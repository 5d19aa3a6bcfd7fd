"""How a training step executes: in which precision, compiled or eager, captured in a CUDA graph or not.

These are the step's three speed settings, each a field of the run's config (``dtype``, ``compile``,
``cuda_graphs``) and a flag of ``tensorslim train``.

**Precision**: ``fp32``, ``bf16`` autocast, or ``auto`` (bf16 only where the hardware has it).

bf16 autocast keeps fp32 master weights, gradients and optimizer state; matmuls run in bf16 and the reductions
autocast lists as fp32 ops (softmax, log-softmax/cross-entropy, norms) stay in fp32 (the mixed-precision recipe of
Micikevicius et al., 2018, arXiv 1710.03740, §3, with bf16 instead of fp16 so that no loss scaling is needed).

On a CPU, bf16 pays only with native instructions (AVX-512 BF16 or AMX): elsewhere PyTorch emulates it and a bf16
matmul is several times *slower* than fp32. ``auto`` therefore decides from what the device declares, never from a
timing (a timing on a shared machine flips from one run to the next): on a CPU, bf16 exactly when its feature flags
name native bf16 (``avx512_bf16`` or ``amx_bf16`` in ``/proc/cpuinfo``); on CUDA, when
``torch.cuda.is_bf16_supported()``. The same machine always gets the same answer, and the run's summary records
what was found and why.

**Compilation** (``torch.compile``, for training and benchmarking): the model's repeated blocks compiled in place.

Regional compilation (PyTorch's recipe for transformers): every block of a stack of identical blocks (an
``nn.ModuleList`` of modules of one class) is compiled with ``nn.Module.compile``; the blocks share their code, so
TorchInductor compiles one graph and reuses it for all of them, which makes compiling a 24-layer model cost about what
one layer costs. A model without such a stack is compiled whole. ``nn.Module.compile`` compiles the module's call
without wrapping it, so parameter names, ``state_dict`` keys and checkpoints stay those of the eager model; the
optimizer (already one fused kernel on CPU and CUDA) stays eager.

Compilation happens at the first call and again when what a graph was traced for changes (train → eval, a new batch
shape), so its time shows up in those steps: :func:`compile_seconds` separates it from the steady step time.

**CUDA graphs**: a static-shape training step that a CUDA graph can capture, and that runs the same way eagerly on
CPU.

CoMERA (Yang et al., NeurIPS 2024, arXiv 2405.14377) reports its per-epoch speed-up with the whole training step
captured in a CUDA graph, "eliminating significant runtime overhead from numerous small GPU kernels" (the tiny TT
contractions). The official ``MNLI_trainer.py`` (L434-668) follows PyTorch's whole-network capture
recipe: capturable AdamW, static input buffers of fixed shape, a few warm-up iterations of the full step (forward,
loss, backward, ``optimizer.step``) on a side stream, one capture with ``torch.cuda.graph``, then per batch
``copy_`` into the buffers and ``replay()``; model and optimizer state are saved before the warm-up and restored after
the capture (warm-up must not train), and the graph is captured again when the loss changes (its early → late stage
switch).

:class:`GraphedStep` is that step. Differences from the official code: the state is snapshotted in memory and copied
back *in place* (the graph holds tensor addresses, so a restore that swaps tensors would leave the graph training
orphans), optimizer state that the warm-up created is reset in place to its fresh value (zeros for Adam), the CPU
random generator is forked around the warm-up so dropout masks are unchanged, and with ``capture=False`` the very same
step (warm-up and restore included) runs eagerly, so the bookkeeping is tested without a GPU.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tensorslim._checks import require_int

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
    return contextlib.nullcontext()


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks of every ``nn.ModuleList`` in ``model`` that holds two or more modules, all of one class."""
    blocks = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 1 and len({type(m) for m in module}) == 1:
            blocks.extend(module)
    return blocks


def compile_model(model: nn.Module, *, backend: str = "inductor") -> nn.Module:
    """``model`` with its repeated blocks (else itself) compiled in place; the same module object is returned.

    ``backend`` is ``torch.compile``'s: TorchInductor generates fused kernels; ``aot_eager`` traces forward and
    backward the same way but runs them with eager kernels (no code generation: for quick checks of the tracing).
    """
    for block in repeated_blocks(model) or [model]:
        block.compile(backend=backend)
    return model


def compile_seconds(step_times: list[float]) -> float:
    """Time the first step spent beyond a steady one (the median of the others): compilation and lazy set-up.

    ``step_times`` are one run's step times in order; with fewer than two there is no steady step to compare, and
    the first step's whole time is returned.
    """
    if len(step_times) < 2:
        return sum(step_times)
    return max(0.0, step_times[0] - statistics.median(step_times[1:]))


Batch = torch.Tensor | tuple[torch.Tensor, ...]
StepLoss = Callable[[nn.Module, Batch], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def _as_tuple(batch: object) -> tuple[torch.Tensor, ...]:
    parts = (batch,) if isinstance(batch, torch.Tensor) else batch
    if not isinstance(parts, tuple | list) or not all(isinstance(t, torch.Tensor) for t in parts):
        raise ValueError(f"a batch must be a tensor or a tuple of tensors, got {type(batch).__name__}")
    return tuple(parts)


def _describe(parts: Sequence[torch.Tensor]) -> str:
    return ", ".join(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in parts)


class GraphedStep:
    """One full training step (forward, loss, backward, parameter update) on static input buffers.

    The first call fixes the batch structure, shapes and dtypes and prepares the step: with ``warmup > 0`` it saves the
    parameters, buffers, optimizer state and ``extra_state``, runs ``warmup`` full steps (on a side stream on CUDA),
    captures the step in a ``torch.cuda.CUDAGraph`` when ``capture=True``, and copies the saved values back in place.
    Every call then copies the batch into the buffers and replays the graph (or runs the step eagerly). No host sync
    happens inside the step as long as ``loss_fn``, the model and the optimizer have none.

    Args:
        model: the module being trained.
        optimizer: updates the model's parameters; with ``capture=True`` every param group must have
            ``capturable=True`` (e.g. ``torch.optim.AdamW(..., capturable=True)``; we do not flip the flag, because
            state created non-capturable keeps its step counter on the host). With ``warmup > 0`` it must be Adam or
            AdamW, whose lazily created state is all zeros, so the warm-up's state can be reset in place.
        loss_fn: ``(model, batch) -> (loss, info)``; ``info`` holds detached tensors to report (no ``.item()``).
        capture: capture the step in a CUDA graph (needs a CUDA device, parameters on it and ``warmup >= 1``).
        warmup: full steps run (and undone) before the capture; CoMERA uses 5, PyTorch's recipe 3. The warm-up
            also creates the optimizer's state outside the graph, which capture requires.
        update: the parameter update, default ``optimizer.step``; e.g. an update that also masks some parameters.
        extra_state: other tensors the step changes in place (e.g. a device-side flag); restored like the model.

    Raises:
        ValueError: capture without a CUDA device, parameters off the GPU, a non-capturable optimizer, or
            ``warmup == 0``; a warm-up with an optimizer other than Adam/AdamW; a bad ``warmup``.

    Example:
        >>> step = GraphedStep(model, optimizer, loss_fn, capture=torch.cuda.is_available())
        >>> for batch in batches:  # every batch has the same shapes
        ...     info = step(batch)  # tensors, overwritten by the next call: clone what you keep
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: StepLoss,
        *,
        capture: bool = False,
        warmup: int = 3,
        update: Callable[[], object] | None = None,
        extra_state: Sequence[torch.Tensor] = (),
    ) -> None:
        require_int("warmup", warmup, minimum=0)
        if capture:
            _check_capturable(model, optimizer, warmup)
        if warmup and not isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
            raise ValueError(
                f"warmup={warmup} needs torch.optim.Adam or AdamW (whose fresh state is known to be zeros), "
                f"got {type(optimizer).__name__}; use warmup=0 without capture"
            )
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.capture, self.warmup = capture, warmup
        self.update = update or optimizer.step
        self.extra_state = tuple(extra_state)
        self._buffers: tuple[torch.Tensor, ...] | None = None
        self._single = False
        self._graph: torch.cuda.CUDAGraph | None = None
        self._outputs: dict[str, torch.Tensor] = {}
        self._params: list[nn.Parameter] | None = None  # the parameters the prepared step uses

    def recapture(self, *, loss_fn: StepLoss | None = None, update: Callable[[], object] | None = None) -> None:
        """Prepare (warm up and capture) again at the next call, e.g. after parameters were replaced by a rank
        truncation or when the loss changes (CoMERA's stage switch). ``None`` keeps the current callable."""
        self.loss_fn = loss_fn or self.loss_fn
        self.update = update or self.update
        self._graph, self._outputs, self._params = None, {}, None

    def __call__(self, batch: Batch) -> dict[str, torch.Tensor]:
        """Copy ``batch`` into the static buffers and run one step; returns ``loss_fn``'s info tensors.

        Raises:
            ValueError: ``batch`` differs in structure, shape or dtype from the first batch.
            RuntimeError: the model's parameters were replaced since the step was prepared and
                :meth:`recapture` was not called (a graph would keep training the old tensors).
        """
        self._load(batch)
        if self._params is None:
            self._prepare()
        elif not self._same_params():
            raise RuntimeError("the model's parameters were replaced since the step was prepared; call recapture()")
        if self._graph is not None:
            self._graph.replay()
            return self._outputs
        return self._step()

    def _same_params(self) -> bool:
        current = list(self.model.parameters())
        return len(current) == len(self._params) and all(a is b for a, b in zip(current, self._params, strict=True))

    @property
    def batch(self) -> Batch:
        """The static input buffers (what ``loss_fn`` receives)."""
        if self._buffers is None:
            raise ValueError("no batch has been given yet")
        return self._buffers[0] if self._single else self._buffers

    def _load(self, batch: Batch) -> None:
        parts = _as_tuple(batch)
        if self._buffers is None:
            device = next(self.model.parameters()).device
            self._buffers = tuple(t.detach().to(device, copy=True) for t in parts)
            self._single = isinstance(batch, torch.Tensor)
            return
        got = [(tuple(t.shape), t.dtype) for t in parts]
        if isinstance(batch, torch.Tensor) != self._single or got != [(tuple(t.shape), t.dtype) for t in self._buffers]:
            raise ValueError(
                f"a static-shape step needs every batch shaped like the first: expected [{_describe(self._buffers)}],"
                f" got [{_describe(parts)}] (pad to a fixed length and drop the last partial batch)"
            )
        for buffer, t in zip(self._buffers, parts, strict=True):
            buffer.copy_(t)

    def _step(self) -> dict[str, torch.Tensor]:
        # set_to_none: during capture, backward then allocates the gradients from the graph's private pool.
        self.optimizer.zero_grad(set_to_none=True)
        loss, info = self.loss_fn(self.model, self.batch)
        loss.backward()
        self.update()
        return info

    def _prepare(self) -> None:
        saved = _Snapshot(self.model, self.optimizer, self.extra_state) if self.warmup else None
        device = self._buffers[0].device
        rng_devices = [device] if device.type == "cuda" else []
        with _side_stream(device, self.capture), torch.random.fork_rng(devices=rng_devices):
            for _ in range(self.warmup):
                self._step()
        if self.capture:
            self._graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._graph):
                self._outputs = self._step()
        if saved is not None:
            saved.restore_()
        self._params = list(self.model.parameters())


def _check_capturable(model: nn.Module, optimizer: torch.optim.Optimizer, warmup: int) -> None:
    if not torch.cuda.is_available():
        raise ValueError(
            "capture=True (--cuda-graphs) needs a CUDA device, but torch.cuda.is_available() is False; "
            "run the static step eagerly with capture=False"
        )
    off = sorted({str(p.device) for p in model.parameters() if p.device.type != "cuda"})
    if off:
        raise ValueError(f"capture=True needs the model on a CUDA device; parameters are on {off}")
    bad = [group.get("name", i) for i, group in enumerate(optimizer.param_groups) if not group.get("capturable")]
    if bad:
        raise ValueError(
            f"capture=True needs a capturable optimizer; param groups {bad} have capturable=False "
            "(build it with torch.optim.AdamW(..., capturable=True))"
        )
    if warmup < 1:
        raise ValueError("capture=True needs warmup >= 1 (the optimizer's state must exist before the capture)")


@contextlib.contextmanager
def _side_stream(device: torch.device, capture: bool) -> Iterator[None]:
    """PyTorch's recipe warms up on a side stream before capturing; eagerly there is nothing to do."""
    if not capture:
        yield
        return
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream(device).wait_stream(stream)


class _Snapshot:
    """Copies of everything a warm-up step changes, written back *in place* by :meth:`restore_`.

    Optimizer state that did not exist yet is not copied: the warm-up creates it, and :meth:`restore_` resets it to
    Adam's fresh value (zeros for ``step``, ``exp_avg``, ``exp_avg_sq`` and ``max_exp_avg_sq``).
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, extra: Sequence[torch.Tensor]) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        live = [*model.parameters(), *model.buffers(), *extra]
        live += [v for p in params for v in optimizer.state.get(p, {}).values() if isinstance(v, torch.Tensor)]
        with torch.no_grad():
            self.pairs = [(t, t.detach().clone()) for t in live]
        self.optimizer = optimizer
        self.fresh = [p for p in params if not optimizer.state.get(p)]

    @torch.no_grad()
    def restore_(self) -> None:
        for tensor, value in self.pairs:
            tensor.copy_(value)
        for p in self.fresh:
            for value in self.optimizer.state.get(p, {}).values():
                if isinstance(value, torch.Tensor):
                    value.zero_()
