"""What the families that replace a dense linear share: reading its weight out of the module types ``convert_``
replaces and writing one back, their report rows, and their rank allocation under a budget."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import torch
from torch import nn

from tensorslim.budget import RankChoices, choose_ranks
from tensorslim.registry import Allocation, LayerReport

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


def allocate_ranks(
    candidates: list[tuple[str, nn.Module]],
    config: Any,
    *,
    decomposing_init: str,
    choices: Callable[[str, nn.Module, bool], RankChoices],
) -> Allocation:
    """One rank per candidate dense layer under ``config.budget`` (see :mod:`tensorslim.budget`): water-filling of
    what each rank step removes when ``config.init`` is ``decomposing_init`` and the weights are real, else the one
    uniform rank that fits.

    Args:
        candidates: ``(name, module)`` of the layers to replace.
        config: the family's config (``budget``, ``init``, ``rank``); each layer gets a copy with its rank.
        decomposing_init: the ``init`` that decomposes the weights (and so can use their spectra).
        choices: ``choices(name, module, spectrum)``, a layer's cost at each rank (and, with ``spectrum``, the gain
            of each rank step).
    """
    real_weights = not any(linear_weight(module)[0].is_meta for _, module in candidates)
    spectrum = config.budget.use_spectrum(from_weights=config.init == decomposing_init, real_weights=real_weights)
    priced = [choices(name, module, spectrum) for name, module in candidates]
    ranks, use = choose_ranks(priced, config.budget, spectrum=spectrum)
    configs = {name: replace(config, rank=rank, budget=None) for (name, _), rank in zip(candidates, ranks, strict=True)}
    return Allocation(configs=configs, use=use)
