"""Streaming calibration: the Gram matrix ``H = XᵀX`` of every target layer's inputs, accumulated in float64.

Both COMQ (in the Gram form, compress.md §1.2) and GPTQ (Frantar et al. 2022, §3, ``H = 2XXᵀ``) need the layer
inputs only through ``H``, so calibration batches are streamed through the float model once, with a forward
pre-hook per layer, and ``X`` itself is never stored. As in the COMQ release, every layer sees the inputs of the
*float* model (not of the partly quantized one). The same streaming serves
:func:`tensorslim.compression.calibrate`, which leaves padded tokens out.

Factored layers are quantized factor by factor, each against its own input: CoLA's ``A`` sees the layer input ``x``
and ``B`` sees ``σ(A x)`` (arXiv 2502.10940 §3), computed in the hook from the float ``A``. A TT core has no input
of its own (the layer input meets a core only through the other cores), so TT cores get no Gram matrix and are
rounded to nearest (:func:`quant_targets`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.functional.lowrank import activation_fn
from tensorslim.functional.threads import one_thread
from tensorslim.layers._source import is_hf_conv1d, linear_weight
from tensorslim.layers.lowrank import LowRankLinear
from tensorslim.layers.tt import TTLinear
from tensorslim.quant.qlinear import tt_core_matrix

SUPPORTED = (
    "nn.Linear, transformers Conv1D, nn.Conv2d with groups=1 and explicit zero padding, "
    "LowRankLinear (CoLA/SVD), TTLinear and nn.Embedding"
)


def is_factored(module: nn.Module) -> bool:
    """A :class:`LowRankLinear` (CoLA/SVD) or :class:`TTLinear` whose factors :func:`quant_targets` quantizes.

    Exact types only: subclasses such as LaX layers add terms that these factors alone do not describe.
    """
    return type(module) in (LowRankLinear, TTLinear)


def is_quantizable(module: nn.Module) -> bool:
    """``nn.Linear``, Hugging Face ``Conv1D``, ungrouped zero-padded ``nn.Conv2d``, a factored layer, or a plain
    ``nn.Embedding``."""
    if type(module) is nn.Embedding:
        return module.padding_idx is None and module.max_norm is None
    if isinstance(module, nn.Conv2d):
        return module.groups == 1 and module.padding_mode == "zeros" and isinstance(module.padding, tuple)
    return isinstance(module, nn.Linear) or is_hf_conv1d(module) or is_factored(module)


def check_quantizable(module: nn.Module, name: str) -> None:
    """Raise a one-line ``TypeError`` naming the layer unless :func:`is_quantizable`."""
    if is_quantizable(module):
        return
    what = type(module).__name__
    if isinstance(module, nn.Conv2d):
        what += f" (groups={module.groups}, padding={module.padding!r}, padding_mode={module.padding_mode!r})"
    raise TypeError(f"layer {name!r} of type {what} cannot be quantized; supported: {SUPPORTED}")


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


@dataclass(frozen=True)
class QuantTarget:
    """One matrix that is quantized: a dense layer's weight, or one factor of a factored layer.

    Attributes:
        name: ``layer`` for a dense layer, ``layer.A`` / ``layer.B`` for low-rank factors, ``layer.cores.k`` for TT.
        module: the layer the matrix belongs to (its forward pre-hook sees the layer input).
        weight: the ``(d_out, d_in)`` matrix.
        inputs: maps the layer input to the rows ``X`` (n, d_in) that multiply ``weight``; None when the matrix
            has no input of its own (a TT core), which makes it RTN-only.
    """

    name: str
    module: nn.Module
    weight: torch.Tensor
    inputs: Callable[[torch.Tensor], torch.Tensor] | None


def _latent_rows(module: LowRankLinear) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x ↦ σ(A x)`` as rows (n, r): the input of CoLA's ``B`` in the float layer."""
    sigma, weight_a = activation_fn(module.activation), module.weight_a.detach()

    def rows(x: torch.Tensor) -> torch.Tensor:
        return sigma(F.linear(x, weight_a)).reshape(-1, module.rank)

    return rows


def quant_targets(name: str, module: nn.Module) -> list[QuantTarget]:
    """The matrices of one quantizable layer, in storage order.

    ``LowRankLinear``: ``A`` (r, d_in) on the rows of ``x`` and ``B`` (d_out, r) on ``σ(A x)``. ``TTLinear``: every
    core (gates folded in) as its ``(r_{k-1}, n_k·r_k)`` matrix, with no input. Anything else: the weight matrix.
    """
    if type(module) is LowRankLinear:
        return [
            QuantTarget(f"{name}.A", module, module.weight_a.detach(), lambda x: x.reshape(-1, x.shape[-1])),
            QuantTarget(f"{name}.B", module, module.weight_b.detach(), _latent_rows(module)),
        ]
    if type(module) is TTLinear:
        cores = [core.detach() for core in module.effective_cores()]
        return [QuantTarget(f"{name}.cores.{k}", module, tt_core_matrix(c), None) for k, c in enumerate(cores)]
    if isinstance(module, nn.Embedding):  # a lookup table: no input for GPTQ/COMQ to reconstruct, so RTN per row
        return [QuantTarget(name, module, module.weight.detach(), None)]
    return [dense_target(name, module)]


def dense_target(name: str, module: nn.Module) -> QuantTarget:
    """The weight matrix of an ``nn.Linear`` / ``Conv1D`` / ``Conv2d`` on the rows of :func:`layer_inputs`."""
    return QuantTarget(name, module, weight_matrix(module), lambda x: layer_inputs(module, x))


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


def padding_free(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``x`` without its padded tokens, as rows ``(n, d)``, when ``mask`` fits its leading (batch, token) axes; else
    ``x`` unchanged."""
    if mask is not None and x.ndim == 3 and tuple(x.shape[:2]) == tuple(mask.shape):
        return x[mask.bool()]
    return x


def stream_grams(
    model: nn.Module,
    targets: dict[str, QuantTarget],
    calibration: Iterable[object],
    *,
    drop_padding: bool = False,
    progress: bool = False,
) -> tuple[dict[str, GramStats], int]:
    """Stream ``calibration`` through ``model`` once and sum ``XᵀX`` of every target's input rows.

    Args:
        targets: the matrices whose inputs are watched (each with ``inputs``).
        drop_padding: leave out the tokens a mapping batch's ``attention_mask`` marks as padding.
        progress: a progress bar over the batches.

    Returns:
        The statistics by target name (``rows == 0`` for a layer never reached) and the number of batches.
    """
    from tqdm.auto import tqdm

    stats = {
        name: GramStats(torch.zeros(t.weight.shape[1], t.weight.shape[1], dtype=torch.float64))
        for name, t in targets.items()
    }
    state: dict[str, torch.Tensor | None] = {"mask": None}

    def hook_for(name: str, inputs: Callable[[torch.Tensor], torch.Tensor]):  # noqa: ANN202 - a torch hook
        def hook(_: nn.Module, args: tuple) -> None:
            with one_thread():  # a float64 product of this size gains nothing from threads that may spin-wait
                stats[name].add(inputs(padding_free(args[0], state["mask"])))

        return hook

    handles = [t.module.register_forward_pre_hook(hook_for(name, t.inputs)) for name, t in targets.items()]
    batches = 0
    try:
        with torch.no_grad():
            for batch in tqdm(calibration, desc="calibration", unit="batch", disable=not progress):
                state["mask"] = batch.get("attention_mask") if drop_padding and isinstance(batch, Mapping) else None
                run_model(model, batch)
                batches += 1
    finally:
        for handle in handles:
            handle.remove()
    return stats, batches


def collect_grams(
    model: nn.Module, layers: dict[str, nn.Module | QuantTarget], calibration: Iterable[object]
) -> dict[str, GramStats]:
    """Stream ``calibration`` through ``model`` and return the input Gram matrix of each named layer or target.

    A plain module stands for its weight matrix (:func:`dense_target`); a :class:`QuantTarget` must have ``inputs``.

    Raises:
        ValueError: ``calibration`` yields no batch, or some layer never ran / saw zero rows.
    """
    targets = {name: t if isinstance(t, QuantTarget) else dense_target(name, t) for name, t in layers.items()}
    stats, batches = stream_grams(model, targets, calibration)
    if batches == 0:
        raise ValueError("calibration data is empty: pass at least one batch of model inputs")
    unseen = [name for name, s in stats.items() if s.rows == 0]
    if unseen:
        raise ValueError(f"calibration never reached layers {unseen[:3]}{'...' if len(unseen) > 3 else ''}")
    return stats


def squared_output_error(weight: torch.Tensor, approx: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """``‖X(W − W')ᵀ‖²_F = tr((W − W') H (W − W')ᵀ)`` from ``H = XᵀX`` alone (float64 scalar)."""
    r = weight.to(torch.float64) - approx.to(torch.float64)  # (d_out, d_in)
    return ((r @ gram.to(torch.float64)) * r).sum()


def relative_output_error(weight: torch.Tensor, quantized: torch.Tensor, gram: torch.Tensor) -> float:
    """``‖X(W − Q)ᵀ‖_F / ‖XWᵀ‖_F`` computed from ``H = XᵀX`` alone: ``sqrt(tr(R H Rᵀ) / tr(W H Wᵀ))``."""
    num = squared_output_error(weight, quantized, gram)
    den = squared_output_error(weight, torch.zeros_like(weight), gram)
    return float(torch.sqrt(num.clamp(min=0) / den)) if den > 0 else float("nan")
