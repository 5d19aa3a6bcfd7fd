"""Choices measured end to end: the model's output error against the original's on the calibration inputs.

A layer's own calibration output error is a myopic guide: the same relative error costs a layer that feeds a
sensitive part of the network more than one whose error the rest of the model absorbs, and errors compound. ASVD
(arXiv 2312.05821, §3.3, sensitivity-based truncation rank searching) therefore measures, for every layer and every
candidate size, the end-to-end calibration loss with that one layer compressed and the rest dense, and allocates the
budget by those measurements. :func:`sensitivities` does that for a grid of each layer's candidates and scales the
per-layer errors of the candidates between grid points by the measured end-to-end-to-layer ratio of the nearest one
(ours: it keeps the fine rank grid at a fraction of the forward passes). :func:`best_plan` then measures whole plans
end to end, e.g. the sensitivity allocation, the per-layer allocation and each single family alone, and keeps the
one whose compressed model agrees best with the original on the calibration inputs.

The loss is ``1 −`` the mean cosine between the compressed and the original model's per-example outputs
(mean-pooled last hidden states of an encoder, else the flattened logits): the quantity the held-out benchmark
reports, measured on calibration inputs only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.compression.build import replacement
from tensorslim.compression.calibration import Batch, Calibration
from tensorslim.compression.choose import Candidate
from tensorslim.functional.threads import one_thread
from tensorslim.quant.distill import mean_pooled
from tensorslim.registry import set_submodule

# Low-rank candidates measured end to end per layer: those nearest these shares of the layer's dense parameters.
PROBE_SHARES = (0.2, 0.4, 0.6, 0.8)
# The single-layer swaps run on the first calibration batches that hold this many tokens (a forward pass per swap).
PROBE_TOKENS = 1024


def first_tokens(batches: Sequence[Batch], tokens: int) -> list[Batch]:
    """The shortest prefix of ``batches`` holding at least ``tokens`` tokens (unpadded, when a batch has a mask)."""
    kept, seen = [], 0
    for batch in batches:
        if seen >= tokens:
            break
        kept.append(batch)
        mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
        ids = batch.get("input_ids") if isinstance(batch, Mapping) else batch
        seen += int(mask.sum()) if mask is not None else (ids.numel() if isinstance(ids, torch.Tensor) else 1)
    return kept


def outputs(model: nn.Module, batch: Batch) -> torch.Tensor:
    """One vector per example: the mean-pooled last hidden state of an encoder, else the flattened output."""
    out = model(**batch) if isinstance(batch, Mapping) else model(batch)
    hidden = getattr(out, "last_hidden_state", None)
    if hidden is not None:
        mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
        mask = torch.ones(hidden.shape[:2]) if mask is None else mask
        return mean_pooled(hidden.float(), mask)
    logits = getattr(out, "logits", out)
    return logits.float().reshape(len(logits), -1)


def cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine of two ``(N, D)`` outputs, summed in float64: a causal LM's flattened logits have millions of
    entries per example, over which float32 sums err by ~1e-4, more than a small swap changes the cosine."""
    return F.cosine_similarity(a.double(), b.double(), dim=-1)


@torch.no_grad()
def agreement(model: nn.Module, reference: nn.Module, batches: Sequence[Batch]) -> float:
    """Mean cosine between ``model``'s and ``reference``'s per-example outputs on ``batches`` (for an encoder: the
    mean-pooled sentence embeddings)."""
    return torch.cat([cosines(outputs(model, b), outputs(reference, b)) for b in batches]).mean().item()


class EndToEnd:
    """The original model's outputs on calibration batches, and the loss of the same model with layers swapped.

    Args:
        model: the model whose layers get swapped (its outputs now are the reference).
        batches: calibration inputs.
    """

    def __init__(self, model: nn.Module, batches: Sequence[Batch]) -> None:
        self.model, self.batches = model, list(batches)
        with torch.no_grad():
            self.reference = [outputs(model, b) for b in self.batches]

    @torch.no_grad()
    def loss(self) -> float:
        """``1 −`` the mean cosine of the model's outputs now to the reference outputs, at least 0 (computed on one
        thread: many small forward passes, where threads that spin-wait for each other on a busy machine cost up to
        10×)."""
        with one_thread():
            now = [cosines(outputs(self.model, b), ref) for b, ref in zip(self.batches, self.reference, strict=True)]
        # Rounding can still leave 1 − cos a hair below 0; a negative error would rank the worst swap as the best.
        return max(0.0, 1.0 - torch.cat(now).mean().item())

    def swapped_loss(self, module: nn.Module, new: nn.Module) -> float:
        """:meth:`loss` with ``module``'s output replaced by ``new``'s on the same input (one layer compressed)."""

        def hook(_: nn.Module, args: tuple[Any, ...], __: torch.Tensor) -> torch.Tensor:
            return new(args[0])

        handle = module.register_forward_hook(hook)
        try:
            return self.loss()
        finally:
            handle.remove()


def probe_indices(choices: Sequence[Candidate]) -> list[int]:
    """The candidates of one layer that :func:`sensitivities` measures: every non-low-rank one but dense, and the
    low-rank ones nearest :data:`PROBE_SHARES` of the dense parameters."""
    dense = choices[0].params
    low_rank = [i for i, c in enumerate(choices) if c.family == "lowrank"]
    picked = {min(low_rank, key=lambda i: abs(choices[i].params - share * dense)) for share in PROBE_SHARES if low_rank}
    others = [i for i, c in enumerate(choices) if c.family not in ("dense", "lowrank")]
    return sorted(picked | set(others))


def sensitivities(
    end_to_end: EndToEnd,
    names: Sequence[str],
    options: Sequence[Sequence[Candidate]],
    calibration: Calibration,
    *,
    progress: bool = True,
) -> list[list[Candidate]]:
    """``options`` with each candidate's ``error`` replaced by its end-to-end loss with that layer alone compressed
    (ASVD, arXiv 2312.05821, §3.3).

    The candidates of :func:`probe_indices` are measured; every other one gets its own per-layer error times the
    ratio (end-to-end loss / per-layer error) measured at the nearest probed candidate of its family. Dense stays 0.
    """
    from tqdm.auto import tqdm

    modules = dict(end_to_end.model.named_modules())
    total = sum(len(probe_indices(c)) for c in options)
    bar = tqdm(total=total, desc="end-to-end sensitivity", unit="swap", disable=not progress)
    measured: list[list[Candidate]] = []
    for name, choices in zip(names, options, strict=True):
        module = modules[name]
        gram = calibration.gram(module, name=name)
        losses = {}
        for i in probe_indices(choices):
            new = replacement(module, choices[i], gram, damping=calibration.damping)
            losses[i] = end_to_end.swapped_loss(module, new)
            bar.update()
        measured.append([_scaled(i, choices, losses) for i in range(len(choices))])
    bar.close()
    return measured


def _scaled(index: int, choices: Sequence[Candidate], losses: dict[int, float]) -> Candidate:
    cand = choices[index]
    if cand.family == "dense" or index in losses:
        return dataclasses.replace(cand, error=losses.get(index, 0.0))
    same = [i for i in losses if choices[i].family == cand.family]
    if not same:
        return cand
    near = min(same, key=lambda i: abs(choices[i].params - cand.params))
    ratio = losses[near] / max(choices[near].error, torch.finfo(torch.float64).tiny)
    return dataclasses.replace(cand, error=cand.error * ratio)


@contextmanager
def built(model: nn.Module, choices: Mapping[str, Candidate], calibration: Calibration) -> Iterator[None]:
    """``model`` with its non-dense ``choices`` built (each fitted to the original inputs), put back on exit."""
    modules = dict(model.named_modules())
    kept = {name: modules[name] for name, c in choices.items() if c.family != "dense"}
    try:
        for name, module in kept.items():
            gram = calibration.gram(module, name=name)
            set_submodule(model, name, replacement(module, choices[name], gram, damping=calibration.damping))
        yield
    finally:
        for name, module in kept.items():
            set_submodule(model, name, module)


def best_plan(
    end_to_end: EndToEnd,
    plans: Mapping[str, Mapping[str, Candidate]],
    calibration: Calibration,
) -> tuple[str, dict[str, float]]:
    """The plan whose model has the least end-to-end calibration loss, and every plan's loss (in ``plans``' order;
    the first plan wins ties)."""
    losses = {}
    for name, choices in plans.items():
        with built(end_to_end.model, choices, calibration):
            losses[name] = end_to_end.loss()
    return min(losses, key=losses.__getitem__), losses
