"""Calibration: the Gram matrix ``G = Σ x xᵀ`` of every linear layer's inputs on a few batches of the user's data.

One forward pass of the original model over the calibration batches gives each layer's ``G`` (float64). It is all
that activation-aware compression needs: the squared output error of any replacement ``W'`` on those inputs is
``tr((W − W') G (W − W')ᵀ)``, and the whitening factor of SVD-LLM (arXiv 2403.07378, §3.1) is ``G``'s Cholesky
factor. Padding tokens are left out when a batch carries an ``attention_mask``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from tensorslim.decomp.svd import whitening_factor
from tensorslim.functional.threads import one_thread
from tensorslim.layers._source import is_dense_linear, linear_shape, linear_weight

Batch = torch.Tensor | Mapping[str, Any]


class Calibration:
    """Per-layer input Gram matrices of one model, keyed by the layer modules themselves.

    Build it with :func:`calibrate`. Give it to a low-rank config (``SVDConfig(calibration=cal)``) to initialise
    from the input-whitened SVD, or to :func:`tensorslim.compression.compress`.

    Attributes:
        damping: the relative ridge of :func:`~tensorslim.decomp.svd.whitening_factor`.
        rows: calibration rows (tokens) each layer saw.
    """

    def __init__(self, grams: dict[nn.Module, torch.Tensor], rows: dict[nn.Module, int], *, damping: float) -> None:
        if not damping >= 0:
            raise ValueError(f"damping={damping!r} is invalid; allowed: a number >= 0")
        self._grams, self.rows, self.damping = grams, rows, damping
        self._whiteners: dict[nn.Module, torch.Tensor] = {}

    def __contains__(self, module: nn.Module) -> bool:
        return module in self._grams

    def __len__(self) -> int:
        return len(self._grams)

    def __repr__(self) -> str:
        return f"Calibration(layers={len(self)}, damping={self.damping})"

    def gram(self, module: nn.Module, *, name: str = "") -> torch.Tensor:
        """``G = Σ x xᵀ`` ``(d_in, d_in)`` (float64) of ``module``'s calibration inputs.

        Raises:
            ValueError: the layer took no input during calibration.
        """
        if module not in self._grams:
            raise ValueError(
                f"layer {name or type(module).__name__!r} has no calibration inputs; allowed: a layer of the model "
                "that calibrate() ran (and that the calibration batches reach)"
            )
        return self._grams[module]

    def whitener(self, module: nn.Module, *, name: str = "") -> torch.Tensor:
        """The Cholesky factor ``S`` of ``G + λI`` (cached): see :func:`~tensorslim.decomp.svd.whitening_factor`."""
        if module not in self._whiteners:
            self._whiteners[module] = whitening_factor(self.gram(module, name=name), damping=self.damping)
        return self._whiteners[module]

    def output_error(self, module: nn.Module, weight: torch.Tensor, *, name: str = "") -> float:
        """Squared output error ``tr(ΔW G ΔWᵀ)`` on the calibration inputs if ``module``'s weight became
        ``weight`` (``(d_out, d_in)``, ``nn.Linear`` layout)."""
        delta = linear_weight(module)[0].detach().to(torch.float64) - weight.detach().to(torch.float64)
        return float(((delta @ self.gram(module, name=name)) * delta).sum())

    def output_energy(self, module: nn.Module, *, name: str = "") -> float:
        """``tr(W G Wᵀ) = ‖W X‖_F²``: the squared norm of the layer's (bias-free) outputs on the calibration inputs."""
        weight = linear_weight(module)[0].detach().to(torch.float64)
        return float(((weight @ self.gram(module, name=name)) * weight).sum())


def _rows(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The input rows ``(n, d_in)`` of one call; the padded tokens left out when the mask fits ``x``'s leading axes."""
    if mask is not None and x.ndim == 3 and tuple(x.shape[:2]) == tuple(mask.shape):
        return x[mask.bool()]
    return x.reshape(-1, x.shape[-1])


def _forward(model: nn.Module, batch: Batch) -> None:
    if isinstance(batch, torch.Tensor):
        model(batch)
    elif isinstance(batch, Mapping):
        model(**batch)
    else:
        raise TypeError(f"calibration batch of type {type(batch).__name__} is invalid; allowed: a tensor or a dict")


@torch.no_grad()
def calibrate(
    model: nn.Module,
    batches: Iterable[Batch],
    *,
    filter_fn: Callable[[nn.Module, str], bool] | None = None,
    damping: float = 1e-4,
    progress: bool = True,
) -> Calibration:
    """Run ``model`` over ``batches`` and collect the input Gram matrix of each dense linear layer.

    Args:
        model: the original model (not changed; run in eval mode, then put back in its mode).
        batches: model inputs, each a tensor (``model(batch)``) or a dict (``model(**batch)``); a dict's
            ``attention_mask`` drops padded tokens from the Gram matrices.
        filter_fn: ``(module, name) -> bool`` choosing the layers to watch (default: every ``nn.Linear``/``Conv1D``).
        damping: relative ridge of the whitening factors (see :func:`~tensorslim.decomp.svd.whitening_factor`).
        progress: show a progress bar over the batches.

    Raises:
        ValueError: no batch, or no layer saw an input.
    """
    layers = {
        module: name
        for name, module in model.named_modules()
        if is_dense_linear(module) and (filter_fn is None or filter_fn(module, name))
    }
    grams = {m: torch.zeros(linear_shape(m)[0], linear_shape(m)[0], dtype=torch.float64) for m in layers}
    rows = dict.fromkeys(layers, 0)
    state: dict[str, torch.Tensor | None] = {"mask": None}

    def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
        x = _rows(args[0].detach(), state["mask"]).to(torch.float64)  # (n, d_in)
        with one_thread():  # a float64 product of this size gains nothing from threads that may spin-wait
            grams[module] += (x.T @ x).cpu()
        rows[module] += len(x)

    from tqdm.auto import tqdm

    handles = [module.register_forward_pre_hook(hook) for module in layers]
    was_training = model.training
    model.eval()
    seen = 0
    try:
        for batch in tqdm(batches, desc="calibration", unit="batch", disable=not progress):
            state["mask"] = batch.get("attention_mask") if isinstance(batch, Mapping) else None
            _forward(model, batch)
            seen += 1
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    if seen == 0:
        raise ValueError("calibrate() got no batch; allowed: one or more model inputs")
    grams = {m: g for m, g in grams.items() if rows[m] > 0}
    if not grams:
        raise ValueError(
            "no dense linear layer saw an input during calibration; allowed: a model with nn.Linear layers"
        )
    return Calibration(grams, {m: rows[m] for m in grams}, damping=damping)
