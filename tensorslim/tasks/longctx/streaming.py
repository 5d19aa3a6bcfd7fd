"""Reading a long document through an equipped model: chunked prefill, then token-by-token decoding, evicting all
the way (the memory stays bounded for any length, unlike a growing KV cache).

A model is called on one chunk at a time; each call's tokens attend the memory and join it (see
:mod:`tensorslim.layers.memory.equip`). Hugging Face models are called with ``use_cache=False``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.layers.memory.equip import memory_stores, reset_memory_
from tensorslim.tasks.base import logits_of


def _call(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Logits ``(B, T, V)`` of the next tokens ``ids`` ``(B, T)`` of the stream."""
    if type(model).__module__.startswith("transformers."):
        return logits_of(model(input_ids=ids, use_cache=False))
    return logits_of(model(ids))


def _chunk(model: nn.Module, chunk: int | None) -> int:
    stores = memory_stores(model)
    if chunk is not None:
        return chunk
    if not stores:
        raise ValueError(f"model {type(model).__name__} has no memory; allowed: a model after equip_memory_")
    return stores[0].config.chunk


@torch.no_grad()
def stream_logits(model: nn.Module, ids: torch.Tensor, *, chunk: int | None = None) -> torch.Tensor:
    """Logits ``(B, N, V)`` of a whole stream ``ids`` ``(B, N)`` read ``chunk`` tokens per call (default: the
    memory's chunk), from an empty memory."""
    reset_memory_(model)
    step = _chunk(model, chunk)
    return torch.cat([_call(model, ids[:, s : s + step]) for s in range(0, ids.shape[1], step)], dim=1)


@dataclass(frozen=True)
class StreamResult:
    """What reading one stream cost and gave.

    Attributes:
        nll: per predicted token negative log-likelihood ``(B, N - 1)``.
        peak_entries: the most memory entries one attention step attended, over layers (0 without memory).
        entries: memory entries held at the end, per layer.
    """

    nll: torch.Tensor
    peak_entries: int
    entries: int

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.nll.mean().item(), 700.0))


@torch.no_grad()
def stream_nll(model: nn.Module, ids: torch.Tensor, *, chunk: int | None = None) -> StreamResult:
    """Next-token losses of ``ids`` ``(B, N)`` read chunk by chunk, keeping one chunk of logits at a time."""
    reset_memory_(model)
    step = _chunk(model, chunk)
    losses = []
    for start in range(0, ids.shape[1], step):
        logits = _call(model, ids[:, start : start + step])  # (B, c, V)
        targets = ids[:, start + 1 : start + step + 1]  # the last position of the stream has no target
        losses.append(
            F.cross_entropy(
                logits[:, : targets.shape[1]].flatten(0, 1).float(), targets.flatten(), reduction="none"
            ).view(targets.shape)
        )
    stores = memory_stores(model)
    return StreamResult(
        nll=torch.cat(losses, dim=1),
        peak_entries=max((s.peak for s in stores), default=0),
        entries=max((s.size for s in stores), default=0),
    )


@torch.no_grad()
def generate(model: nn.Module, prompt: torch.Tensor, *, max_new_tokens: int) -> torch.Tensor:
    """Greedy continuation ``(B, max_new_tokens)`` of ``prompt`` ``(B, P)``: the prompt is read chunk by chunk, then
    each new token is one call of one token, so every decoding step evicts as prefill does."""
    reset_memory_(model)
    step = _chunk(model, None)
    logits = None
    for start in range(0, prompt.shape[1], step):
        logits = _call(model, prompt[:, start : start + step])
    assert logits is not None, "the prompt must hold at least one token"
    new = []
    for _ in range(max_new_tokens):
        token = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
        new.append(token)
        logits = _call(model, token)
    return torch.cat(new, dim=1)
