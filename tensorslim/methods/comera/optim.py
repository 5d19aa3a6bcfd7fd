"""CoMERA's optimizer grouping (arXiv 2405.14377, §5; official ``utils.py`` L50-66, ``MNLI_trainer.py`` L736-741).

Three AdamW groups with weight decay 0 and a constant learning rate: TT/TTM cores (1e-4), rank gates (1e-3),
everything else (5e-5). The official split matches parameter *names* (``encoder`` & ``tensor.factors``), which puts
the tensorized classifier's cores and gates in the "rest" group; we group by module type, so every core and every
gate is in its own group wherever the layer sits. A gated low-rank layer's ``A`` and ``B`` are its "cores" (the
two-core chain of :mod:`tensorslim.methods.comera.gates`).
"""

from __future__ import annotations

import torch
from torch import nn

from tensorslim.layers.lowrank import LowRankLinear
from tensorslim.methods.comera.gates import gated_layers, layer_gates


def param_groups(
    model: nn.Module, *, lr_cores: float = 1e-4, lr_gates: float = 1e-3, lr_other: float = 5e-5
) -> list[dict]:
    """``[cores, gates, rest]`` parameter groups (each with a ``name`` key); empty groups are dropped."""
    cores, gates = [], []
    for _, layer in gated_layers(model):
        cores.extend((layer.weight_a, layer.weight_b) if isinstance(layer, LowRankLinear) else layer.cores)
        gates.extend(layer_gates(layer))
    taken = {id(p) for p in cores + gates}
    rest = [p for p in model.parameters() if id(p) not in taken and p.requires_grad]
    groups = [
        {"name": "cores", "params": cores, "lr": lr_cores},
        {"name": "gates", "params": gates, "lr": lr_gates},
        {"name": "other", "params": rest, "lr": lr_other},
    ]
    return [group for group in groups if group["params"]]


def build_optimizer(
    model: nn.Module, *, lr_cores: float = 1e-4, lr_gates: float = 1e-3, lr_other: float = 5e-5
) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`, weight decay 0 (as shipped)."""
    groups = param_groups(model, lr_cores=lr_cores, lr_gates=lr_gates, lr_other=lr_other)
    return torch.optim.AdamW(groups, weight_decay=0.0)
