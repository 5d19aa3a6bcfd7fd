"""Projections that read the same input, run together when their layer family can fuse them."""

from __future__ import annotations

import torch
from torch import nn


def linear_many(x: torch.Tensor, layers: tuple[nn.Module, ...]) -> list[torch.Tensor]:
    """``[layer(x) for layer in layers]`` for layers that read the same ``x`` (attention's q, k and v; the MLP's gate
    and up projections).

    When every layer is of one class that defines ``apply_many(x, layers)`` itself (a layer family that can fuse
    them, such as :class:`tensorslim.layers.tt.TTLinear`), that class runs them together; the model needs to know no
    family. A subclass that does not define it (its forward differs) runs layer by layer.
    """
    kind = type(layers[0])
    if len(layers) > 1 and "apply_many" in vars(kind) and all(type(layer) is kind for layer in layers):
        return kind.apply_many(x, layers)
    return [layer(x) for layer in layers]
