"""Optimizers: AdamW for every method, and GaLore (Zhao et al., 2024, arXiv 2403.03507) as the baseline."""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from torch import nn

from tensorslim.functional.threads import update_small_on_one_thread

# What ``state_dtype`` names: the dtype the AdamW moments are stored in.
STATE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def galore_targets(model: nn.Module) -> list[nn.Parameter]:
    """GaLore projects the 2-D weights of attention and MLP modules; embeddings, norms and the head stay on AdamW
    (the official ``torchrun_main.py``)."""
    return [
        p
        for name, p in model.named_parameters()
        if p.ndim == 2 and any(key in name for key in ("attn", "mlp")) and p.requires_grad
    ]


def galore_projection_rank(cola_rank: int | None, *, rank: int | None = None) -> int:
    """GaLore's projection rank: ``rank`` when given, else the model's CoLA rank (``cola_rank`` of its
    :class:`~tensorslim.methods.recipes.Recipe`: the papers pair the two at each size), else 128."""
    return rank or cola_rank or 128


def build_optimizer(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float,
    galore_rank: int | None = None,
    galore_update_proj_gap: int = 200,
    galore_scale: float = 0.25,
    state_dtype: str = "fp32",
) -> torch.optim.Optimizer:
    """AdamW over all trainable parameters, or GaLore-AdamW when ``galore_rank`` is given.

    GaLore comes from the ``galore-torch`` package (imported only when asked for: it pulls transformers and
    bitsandbytes and takes seconds to import). ``state_dtype="bf16"`` keeps AdamW's moments in bfloat16
    (:class:`LowPrecisionStateAdamW`; not with GaLore).
    """
    if state_dtype not in STATE_DTYPES:
        raise ValueError(f"state_dtype={state_dtype!r} is invalid; allowed: {list(STATE_DTYPES)}")
    if state_dtype != "fp32" and galore_rank is not None:
        raise ValueError(f"state_dtype={state_dtype!r} is not supported with GaLore; allowed: 'fp32'")
    params = [p for p in model.parameters() if p.requires_grad]
    if state_dtype != "fp32":
        return LowPrecisionStateAdamW(params, lr=lr, weight_decay=weight_decay, state_dtype=STATE_DTYPES[state_dtype])
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


class LowPrecisionStateAdamW(torch.optim.Optimizer):
    """AdamW (Loshchilov & Hutter, 2019, arXiv 1711.05101, Algorithm 2, PyTorch's decoupled weight decay) whose two
    moments are stored in ``state_dtype`` (bfloat16: half of AdamW's optimizer memory).

    Beyond the papers we follow (CoLA, GaLore and CoMERA train with fp32 AdamW state). Each step computes the moments
    and the update in the parameters' dtype, then rounds the moments to ``state_dtype`` (round to nearest even) for
    the next step, so the first step equals fp32 AdamW and later steps differ only by that rounding. Unlike the fused
    fp32 kernel it updates one tensor at a time in several passes: it saves memory, not time.
    """

    def __init__(
        self,
        params: Any,
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        state_dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        if isinstance(lr, torch.Tensor) or not lr > 0:
            raise ValueError(f"lr={lr!r} is invalid; allowed: a float > 0")
        if state_dtype not in STATE_DTYPES.values():
            raise ValueError(f"state_dtype={state_dtype} is invalid; allowed: {list(STATE_DTYPES.values())}")
        self.state_dtype = state_dtype
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, group, beta1, beta2)
        return loss

    def _update(self, param: torch.Tensor, group: dict[str, Any], beta1: float, beta2: float) -> None:
        state = self.state[param]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(param, dtype=self.state_dtype)
            state["exp_avg_sq"] = torch.zeros_like(param, dtype=self.state_dtype)
        state["step"] += 1
        step = float(state["step"])
        grad = param.grad
        param.mul_(1 - group["lr"] * group["weight_decay"])
        exp_avg = state["exp_avg"].to(param.dtype).lerp_(grad, 1 - beta1)  # m_t, at full precision
        exp_avg_sq = state["exp_avg_sq"].to(param.dtype).mul_(beta2).addcmul_(grad, grad, value=1 - beta2)  # v_t
        denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2**step)).add_(group["eps"])
        param.addcdiv_(exp_avg, denom, value=-group["lr"] / (1 - beta1**step))
        state["exp_avg"].copy_(exp_avg)
        state["exp_avg_sq"].copy_(exp_avg_sq)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as ``torch.optim.Optimizer`` does, which casts the moments to the parameters' dtype; then store them
        in ``state_dtype`` again."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    state[key] = state[key].to(self.state_dtype)


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
