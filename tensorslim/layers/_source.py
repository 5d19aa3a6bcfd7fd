"""Reading the dense weight out of the module types that ``convert_`` replaces."""

from __future__ import annotations

import torch
from torch import nn


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
