"""Optimizers: AdamW for every method, and GaLore (Zhao et al., 2024, arXiv 2403.03507) as the baseline."""

from __future__ import annotations

import logging

import torch
from torch import nn

# Mean parameter size (elements) under which the whole AdamW update runs on one thread. PyTorch's fused CPU AdamW
# opens one OpenMP parallel region per parameter tensor; a CoMERA bert6 model has 300 tensors averaging 5,600
# elements, so at two threads its update was 300 regions, each costing more than its work. 32,768 is PyTorch's own
# grain size: elementwise ops on fewer elements than that already run on one thread.
ONE_THREAD_MEAN_NUMEL = 1 << 15


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


def update_small_on_one_thread(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """``optimizer``, whose ``step`` runs on one thread when its parameters are on CPU and average fewer than
    :data:`ONE_THREAD_MEAN_NUMEL` elements (models of tiny tensors, such as CoMERA's TT cores).

    Done with the optimizer's own step hooks (``torch.set_num_threads``, see :mod:`tensorslim.functional.threads`),
    so the object stays a plain ``torch.optim.AdamW`` (the sharded checkpoints check its type). The update of each
    element is the same at any thread count.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    small = sum(p.numel() for p in params) < ONE_THREAD_MEAN_NUMEL * len(params)
    if not params or not small or any(p.device.type != "cpu" for p in params):
        return optimizer
    saved: list[int] = []  # the thread count to restore; kept if a step raised, so the next step restores it

    def enter(*_) -> None:
        if not saved:
            saved.append(torch.get_num_threads())
        torch.set_num_threads(1)

    def leave(*_) -> None:
        torch.set_num_threads(saved.pop())

    optimizer.register_step_pre_hook(enter)
    optimizer.register_step_post_hook(leave)
    return optimizer


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


# Elements per slice of the bf16-gradient AdamW pass (:func:`adamw_step_bf16_grads`): 2^20 elements are 20 MB of
# parameter, moments, gradient (bf16 and its fp32 copy) and copy, which the last-level cache still holds when the
# copy is written. Smaller slices pay more in per-call overhead than they gain in cache; on the CoLA 350m weights
# (one thread, benchmarks/results/bf16_adamw_pass_threads1.md), 2^16 was slower than autocast's casts + AdamW.
BF16_SLICE = 1 << 20


@torch.no_grad()
def adamw_step_bf16_grads(
    optimizer: torch.optim.Optimizer,
    updates: list[tuple[nn.Parameter, torch.Tensor, torch.Tensor]],
    *,
    grad_scale: torch.Tensor | None = None,
) -> None:
    """The fused AdamW update of fp32 parameters from bf16 gradients, writing each parameter's bf16 shadow.

    ``updates`` holds ``(param, grad, shadow)``: ``param`` an fp32 parameter of ``optimizer`` whose state exists (one
    ordinary ``optimizer.step()`` created it), ``grad`` its gradient in bf16, ``shadow`` its bf16 copy that the
    forward reads. Per slice of :data:`BF16_SLICE` elements: the gradient is cast to fp32 (exact), multiplied by
    ``grad_scale`` (gradient clipping, as ``clip_grad_norm_`` multiplies fp32 gradients), updated by PyTorch's own
    fused AdamW kernel, and the shadow is rounded from the new fp32 weights. The fp32 master weights, moments and
    update are those of ``torch.optim.AdamW(fused=True)`` on the fp32 gradient (mixed precision as in arXiv
    1710.03740 §3); what changes is memory traffic: no fp32 gradient is written and read back, and the weights are
    rounded to bf16 while they are in cache instead of once more by autocast in the next forward.
    """
    by_param = {id(p): (p, g, s) for p, g, s in updates}
    buffer = torch.empty(0)
    for group in optimizer.param_groups:
        beta1, beta2 = group["betas"]
        for param in group["params"]:
            if id(param) not in by_param:
                continue
            _, grad, shadow = by_param[id(param)]
            state = optimizer.state[param]
            state["step"] += 1
            flat = [t.view(-1) for t in (param, grad, state["exp_avg"], state["exp_avg_sq"], shadow)]
            if buffer.numel() < min(BF16_SLICE, param.numel()):
                buffer = torch.empty(min(BF16_SLICE, param.numel()), dtype=param.dtype)
            for start in range(0, param.numel(), BF16_SLICE):
                p, g, m, v, s = (t[start : start + BF16_SLICE] for t in flat)
                g32 = buffer[: p.numel()].copy_(g)
                if grad_scale is not None:
                    g32.mul_(grad_scale)
                torch._fused_adamw_(
                    [p],
                    [g32],
                    [m],
                    [v],
                    [],
                    [state["step"]],
                    lr=group["lr"],
                    beta1=beta1,
                    beta2=beta2,
                    weight_decay=group["weight_decay"],
                    eps=group["eps"],
                    amsgrad=False,
                    maximize=False,
                )
                s.copy_(p)
