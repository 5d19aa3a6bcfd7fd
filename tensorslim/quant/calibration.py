"""Streaming calibration: the Gram matrix ``H = XᵀX`` of every target layer's inputs, accumulated in float64.

Both COMQ (in the Gram form, compress.md §1.2) and GPTQ (Frantar et al. 2022, §3, ``H = 2XXᵀ``) need the layer
inputs only through ``H``, so calibration batches are streamed through the float model once, with a forward
pre-hook per layer, and ``X`` itself is never stored. As in the COMQ release, every layer sees the inputs of the
*float* model (not of the partly quantized one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.layers._source import is_hf_conv1d, linear_weight


def is_quantizable(module: nn.Module) -> bool:
    """``nn.Linear``, Hugging Face ``Conv1D`` and ungrouped zero-padded ``nn.Conv2d``."""
    if isinstance(module, nn.Conv2d):
        return module.groups == 1 and module.padding_mode == "zeros" and isinstance(module.padding, tuple)
    return isinstance(module, nn.Linear) or is_hf_conv1d(module)


def check_quantizable(module: nn.Module, name: str) -> None:
    """Raise a one-line ``TypeError`` naming the layer unless :func:`is_quantizable`."""
    if is_quantizable(module):
        return
    what = type(module).__name__
    if isinstance(module, nn.Conv2d):
        what += f" (groups={module.groups}, padding={module.padding!r}, padding_mode={module.padding_mode!r})"
    raise TypeError(
        f"layer {name!r} of type {what} cannot be quantized; supported: nn.Linear, transformers Conv1D, "
        "nn.Conv2d with groups=1 and explicit zero padding"
    )


def weight_matrix(module: nn.Module) -> torch.Tensor:
    """The weight as a ``(d_out, d_in)`` matrix; a Conv2d kernel is flattened in ``unfold``'s (C, kh, kw) order."""
    if isinstance(module, nn.Conv2d):
        return module.weight.detach().reshape(module.out_channels, -1)
    return linear_weight(module)[0].detach()


def layer_inputs(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The rows ``X`` (n, d_in) such that the layer computes ``X @ weight_matrix.T`` (+ bias).

    Linear layers flatten all leading (batch, token) axes; Conv2d unfolds patches as GPTQ's ``add_batch`` does.
    """
    if isinstance(module, nn.Conv2d):
        patches = F.unfold(
            x, module.kernel_size, dilation=module.dilation, padding=module.padding, stride=module.stride
        )  # (B, C*kh*kw, L)
        return patches.transpose(1, 2).reshape(-1, patches.shape[1])
    return x.reshape(-1, x.shape[-1])


@dataclass
class GramStats:
    """``H = Σ XᵀX`` (d_in, d_in) in float64 and the number of rows ``n`` it sums."""

    gram: torch.Tensor
    rows: int = 0

    def add(self, x: torch.Tensor) -> None:
        x64 = x.detach().to(torch.float64)  # (n, d_in)
        self.gram.addmm_(x64.T, x64)
        self.rows += x64.shape[0]


def run_model(model: nn.Module, batch: object) -> object:
    """Call ``model`` on one calibration batch.

    Any ``Mapping`` is passed as keywords: a dict, and also a tokenizer's ``transformers.BatchEncoding``, which is a
    ``UserDict`` and not a dict. A tuple/list is passed as positionals, anything else as the one argument.
    """
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def collect_grams(
    model: nn.Module, layers: dict[str, nn.Module], calibration: Iterable[object]
) -> dict[str, GramStats]:
    """Stream ``calibration`` through ``model`` and return the input Gram matrix of each named layer.

    Raises:
        ValueError: ``calibration`` yields no batch, or some layer never ran / saw zero rows.
    """
    stats = {
        name: GramStats(torch.zeros(weight_matrix(m).shape[1], weight_matrix(m).shape[1], dtype=torch.float64))
        for name, m in layers.items()
    }

    def hook_for(name: str, module: nn.Module):  # noqa: ANN202 - a torch hook
        def hook(_: nn.Module, args: tuple) -> None:
            stats[name].add(layer_inputs(module, args[0]))

        return hook

    handles = [m.register_forward_pre_hook(hook_for(name, m)) for name, m in layers.items()]
    batches = 0
    try:
        with torch.no_grad():
            for batch in calibration:
                run_model(model, batch)
                batches += 1
    finally:
        for handle in handles:
            handle.remove()
    if batches == 0:
        raise ValueError("calibration data is empty: pass at least one batch of model inputs")
    unseen = [name for name, s in stats.items() if s.rows == 0]
    if unseen:
        raise ValueError(f"calibration never reached layers {unseen[:3]}{'...' if len(unseen) > 3 else ''}")
    return stats


def relative_output_error(weight: torch.Tensor, quantized: torch.Tensor, gram: torch.Tensor) -> float:
    """``‖X(W − Q)ᵀ‖_F / ‖XWᵀ‖_F`` computed from ``H = XᵀX`` alone: ``sqrt(tr(R H Rᵀ) / tr(W H Wᵀ))``."""
    w = weight.to(torch.float64)
    r = w - quantized.to(torch.float64)  # (d_out, d_in)
    num = ((r @ gram) * r).sum()
    den = ((w @ gram) * w).sum()
    return float(torch.sqrt(num.clamp(min=0) / den)) if den > 0 else float("nan")
