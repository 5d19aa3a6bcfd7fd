"""Calibration: the Gram matrix ``G = Σ x xᵀ`` of every linear layer's inputs on a few batches of the user's data.

One forward pass of the original model over the calibration batches gives each layer's ``G`` (float64). It is all
that activation-aware compression needs: the squared output error of any replacement ``W'`` on those inputs is
``tr((W − W') G (W − W')ᵀ)``, and the whitening factor of SVD-LLM (arXiv 2403.07378, §3.1) is ``G``'s Cholesky
factor. Padding tokens are left out when a batch carries an ``attention_mask``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from tensorslim.decomp.svd import whitening_factor
from tensorslim.functional.threads import one_thread
from tensorslim.layers._source import is_dense_linear, linear_weight
from tensorslim.quant.calibration import dense_target, padding_free, run_model, squared_output_error, stream_grams

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
        return float(
            squared_output_error(linear_weight(module)[0].detach(), weight.detach(), self.gram(module, name=name))
        )

    def output_energy(self, module: nn.Module, *, name: str = "") -> float:
        """``tr(W G Wᵀ) = ‖W X‖_F²``: the squared norm of the layer's (bias-free) outputs on the calibration inputs."""
        weight = linear_weight(module)[0].detach()
        return float(squared_output_error(weight, torch.zeros_like(weight), self.gram(module, name=name)))


def _rows(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The input rows ``(n, d_in)`` of one call; the padded tokens left out when the mask fits ``x``'s leading axes."""
    x = padding_free(x, mask)
    return x.reshape(-1, x.shape[-1])


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
        name: dense_target(name, module)
        for name, module in model.named_modules()
        if is_dense_linear(module) and (filter_fn is None or filter_fn(module, name))
    }
    was_training = model.training
    model.eval()
    try:
        stats, seen = stream_grams(model, layers, batches, drop_padding=True, progress=progress)
    finally:
        model.train(was_training)
    if seen == 0:
        raise ValueError("calibrate() got no batch; allowed: one or more model inputs")
    reached = {layers[name].module: s for name, s in stats.items() if s.rows > 0}
    if not reached:
        raise ValueError(
            "no dense linear layer saw an input during calibration; allowed: a model with nn.Linear layers"
        )
    return Calibration(
        {m: s.gram for m, s in reached.items()}, {m: s.rows for m, s in reached.items()}, damping=damping
    )


class _Enough(Exception):
    """Raised by a hook to end a forward pass once every watched layer has seen its input."""


def _run_until(model: nn.Module, batch: Batch, hooks: dict[nn.Module, Callable[[torch.Tensor], None]]) -> None:
    """Run ``model`` on ``batch`` until every module of ``hooks`` has received its first input (later calls and the
    rest of the network are skipped); each hook gets that input."""
    waiting = set(hooks)

    def pre_hook(module: nn.Module, args: tuple[Any, ...]) -> None:
        if module in waiting:
            hooks[module](args[0])
            waiting.discard(module)
            if not waiting:
                raise _Enough

    handles = [module.register_forward_pre_hook(pre_hook) for module in hooks]
    try:
        run_model(model, batch)
    except _Enough:
        pass
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def call_groups(model: nn.Module, batch: Batch, names: Iterable[str]) -> list[list[str]]:
    """The named layers in the order of their first call on ``batch``, grouped when consecutive layers take the same
    input tensor (an attention block's query, key and value): the order in which sequential calibration compresses
    them. Layers that ``batch`` never reaches are left out."""
    modules = dict(model.named_modules())
    wanted = {modules[name]: name for name in names}
    groups: list[list[str]] = []
    last: list[torch.Tensor | None] = [None]

    def seen(module: nn.Module) -> Callable[[torch.Tensor], None]:
        def record(x: torch.Tensor) -> None:
            if groups and last[0] is x:
                groups[-1].append(wanted[module])
            else:
                groups.append([wanted[module]])
                last[0] = x

        return record

    was_training = model.training
    model.eval()
    try:
        _run_until(model, batch, {module: seen(module) for module in wanted})
    finally:
        model.train(was_training)
    return groups


@torch.no_grad()
def first_inputs(model: nn.Module, batches: Iterable[Batch], names: Sequence[str]) -> list[dict[str, torch.Tensor]]:
    """Per batch, the rows ``(n, d_in)`` of each named layer's first input (padding left out, in the model's dtype;
    layers that take the same input tensor share its rows). Each forward pass stops once every named layer has seen
    its input."""
    modules = dict(model.named_modules())
    return [_batch_inputs(model, batch, {name: modules[name] for name in names}) for batch in batches]


def _batch_inputs(model: nn.Module, batch: Batch, modules: dict[str, nn.Module]) -> dict[str, torch.Tensor]:
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    rows: dict[str, torch.Tensor] = {}
    by_input: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # the input is kept so that its id stays unique

    def keep(name: str) -> Callable[[torch.Tensor], None]:
        def record(x: torch.Tensor) -> None:
            by_input.setdefault(id(x), (x, _rows(x, mask)))
            rows[name] = by_input[id(x)][1]

        return record

    _run_until(model, batch, {module: keep(name) for name, module in modules.items()})
    return rows


@torch.no_grad()
def paired_grams(
    reference: Sequence[dict[str, torch.Tensor]], compressed: nn.Module, batches: Sequence[Batch], names: Sequence[str]
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """For each named layer, ``G = Σ x xᵀ`` of its inputs ``x`` in ``compressed`` and ``C = Σ x_f xᵀ`` against the
    original model's inputs ``x_f`` on the same tokens (float64): the statistics of sequential calibration
    (:func:`~tensorslim.decomp.svd.aligned_target`).

    Args:
        reference: :func:`first_inputs` of the original model on ``batches`` (covering ``names``).

    Raises:
        ValueError: a named layer was not reached.
    """
    grams: dict[str, torch.Tensor] = {}
    cross: dict[str, torch.Tensor] = {}
    for original_rows, rows in zip(reference, first_inputs(compressed, batches, names), strict=True):
        for name in names:
            if name not in rows or name not in original_rows:
                raise ValueError(f"layer {name!r} took no input; allowed: layers that the calibration batches reach")
            x, x_f = rows[name].to(torch.float64), original_rows[name].to(torch.float64)
            with one_thread():
                grams[name] = grams.get(name, 0) + x.T @ x
                cross[name] = cross.get(name, 0) + x_f.T @ x
    return {name: (grams[name], cross[name]) for name in names}
