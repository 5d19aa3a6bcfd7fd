"""Optimizers: AdamW for every method, and GaLore (Zhao et al., 2024, arXiv 2403.03507) as the baseline."""

from __future__ import annotations

import logging

import torch
from torch import nn

from tensorslim.functional.threads import update_small_on_one_thread


def galore_targets(model: nn.Module) -> list[nn.Parameter]:
    """GaLore projects the 2-D weights of attention and MLP modules; embeddings, norms and the head stay on AdamW
    (the official ``torchrun_main.py``)."""
    return [
        p
        for name, p in model.named_parameters()
        if p.ndim == 2 and any(key in name for key in ("attn", "mlp")) and p.requires_grad
    ]


def build_optimizer(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float,
    galore_rank: int | None = None,
    galore_update_proj_gap: int = 200,
    galore_scale: float = 0.25,
) -> torch.optim.Optimizer:
    """AdamW over all trainable parameters, or GaLore-AdamW when ``galore_rank`` is given.

    GaLore comes from the ``galore-torch`` package (imported only when asked for: it pulls transformers and
    bitsandbytes and takes seconds to import).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if galore_rank is None:
        # The fused kernel does the whole update in one pass over memory: about 5x faster than the default
        # per-tensor loop on CPU, where the optimizer is memory-bound (benchmarks/results/profile_*.md).
        fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
        return update_small_on_one_thread(torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused))
    GaLoreAdamW = _import_galore_adamw()
    projected = {id(p) for p in galore_targets(model)}
    groups = [
        {"params": [p for p in params if id(p) not in projected]},
        {
            "params": [p for p in params if id(p) in projected],
            "rank": galore_rank,
            "update_proj_gap": galore_update_proj_gap,
            "scale": galore_scale,
            "proj_type": "std",
        },
    ]
    return GaLoreAdamW(groups, lr=lr, weight_decay=weight_decay, no_deprecation_warning=True)


def _import_galore_adamw() -> type[torch.optim.Optimizer]:
    """``galore_torch.GaLoreAdamW``, imported without the kernel warning of bitsandbytes.

    ``galore_torch/__init__.py`` imports its 8-bit optimizer and so bitsandbytes, which on CPUs with AVX-512 BF16
    logs "Failed to load CPU gemm_4bit_forward from kernels-community" at import when the optional ``kernels``
    package is missing. GaLore-AdamW never runs that kernel, so the message is only noise; nothing else is silenced.
    """
    bnb_logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    noise = _DropMessage("Failed to load CPU gemm_4bit_forward")
    bnb_logger.addFilter(noise)
    try:
        from galore_torch import GaLoreAdamW
    except ImportError as error:
        raise ValueError("method 'galore' needs the galore-torch package: pip install galore-torch") from error
    finally:
        bnb_logger.removeFilter(noise)
    return GaLoreAdamW


class _DropMessage(logging.Filter):
    """Drops the log records whose message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)
