"""``torch.compile`` for training and benchmarking: the model's repeated blocks compiled in place.

Regional compilation (PyTorch's recipe for transformers): every block of a stack of identical blocks (an
``nn.ModuleList`` of modules of one class) is compiled with ``nn.Module.compile``; the blocks share their code, so
TorchInductor compiles one graph and reuses it for all of them, which makes compiling a 24-layer model cost about what
one layer costs. A model without such a stack is compiled whole. ``nn.Module.compile`` compiles the module's call
without wrapping it, so parameter names, ``state_dict`` keys and checkpoints stay those of the eager model; the
optimizer (already one fused kernel on CPU and CUDA) stays eager.

Compilation happens at the first call and again when what a graph was traced for changes (train → eval, a new batch
shape), so its time shows up in those steps: :func:`compile_seconds` separates it from the steady step time.
"""

from __future__ import annotations

import statistics

from torch import nn


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
