"""Reading the dense weight out of the module types that ``convert_`` replaces, and writing one back."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from tensorslim.registry import LayerReport

T = TypeVar("T")


def is_hf_conv1d(module: nn.Module) -> bool:
    """GPT-2's ``Conv1D`` (transformers.pytorch_utils): a linear layer that stores its weight as ``(d_in, d_out)``.

    Detected by name and attributes so that transformers need not be imported.
    """
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and getattr(module, "weight", None) is not None


def is_dense_linear(module: nn.Module) -> bool:
    """True for ``nn.Linear`` (and subclasses) and Hugging Face ``Conv1D``."""
    return isinstance(module, nn.Linear) or is_hf_conv1d(module)


def linear_shape(module: nn.Module) -> tuple[int, int]:
    """``(d_in, d_out)`` of an ``nn.Linear`` or ``Conv1D``."""
    d_in, d_out = module.weight.shape[::-1] if isinstance(module, nn.Linear) else module.weight.shape
    return int(d_in), int(d_out)


def linear_weight(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weight in ``nn.Linear`` layout ``(d_out, d_in)`` and the bias (or None)."""
    weight = module.weight if isinstance(module, nn.Linear) else module.weight.t()
    return weight, module.bias


def factored_like(cls: type[nn.Module], module: nn.Module, config: Any) -> tuple[nn.Module, tuple, torch.Tensor]:
    """A ``cls`` layer of the shape ``config.resolve(d_in, d_out)`` chooses for the dense ``module``, on its
    weight's device and dtype, with a bias where it has one; with that shape and the weight ``(d_out, d_in)``."""
    d_in, d_out = linear_shape(module)
    weight, bias = linear_weight(module)
    shape = config.resolve(d_in, d_out)
    layer = cls(*shape, bias=bias is not None, device=weight.device, dtype=weight.dtype)
    return layer, shape, weight


def require_weights(weight: torch.Tensor, init: str) -> None:
    """Raise ``ValueError`` for a decomposing ``init`` of a meta-device module (it has no weights to decompose)."""
    if weight.is_meta:
        raise ValueError(f"init={init!r} needs real weights, got a meta-device module; use init='random'")


def dense_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """An ``nn.Linear`` holding copies of ``weight`` ``(d_out, d_in)`` and ``bias``, on their device and dtype."""
    d_out, d_in = weight.shape
    dense = nn.Linear(d_in, d_out, bias=bias is not None, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        dense.weight.copy_(weight)
        if bias is not None:
            dense.bias.copy_(bias)
    return dense


def resolve_for(name: str, module: nn.Module, resolve: Callable[[int, int], T]) -> T:
    """``resolve(d_in, d_out)`` for the dense ``module`` (a config's shape choice), its error naming the layer."""
    try:
        return resolve(*linear_shape(module))
    except ValueError as error:
        raise ValueError(f"layer {name!r}: {error}") from None


def replacement_report(name: str, module: nn.Module, *, new_shape: str, rank: int, params_after: int) -> LayerReport:
    """The ``convert_`` report row for replacing the dense ``module`` by a layer of ``params_after`` parameters."""
    d_in, d_out = linear_shape(module)
    return LayerReport(
        name=name,
        kind=type(module).__name__,
        old_shape=(d_in, d_out),
        new_shape=new_shape,
        rank=rank,
        params_before=d_in * d_out + (d_out if module.bias is not None else 0),
        params_after=params_after,
    )


def uniform_bias_(bias: torch.Tensor | None, fan: int) -> None:
    """Fill ``bias`` (if any) from ``U(±1/√fan)`` in place, as ``nn.Linear`` does with ``fan = d_in``; callers
    that follow their paper's reference code pass its fan (CoMERA and CoLA: ``d_out``)."""
    if bias is not None:
        with torch.no_grad():
            bias.uniform_(-1 / math.sqrt(fan), 1 / math.sqrt(fan))
