"""Every model keeps its books: parameters and FLOPs, counted the same way for every method."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


@dataclass(frozen=True)
class ParamCount:
    """Parameter totals. ``non_embedding`` excludes the input embeddings and the output head, as the CoLA and
    GaLore tables do."""

    total: int
    embedding: int

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding


def count_params(model: nn.Module) -> ParamCount:
    """Count unique parameters; input embeddings (every ``nn.Embedding`` and ``get_input_embeddings()``, which may
    be a factored table) and the output head (``get_output_embeddings()`` or ``lm_head``) are the embedding part."""
    total = sum(p.numel() for p in model.parameters())
    embedding_modules = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    get_input = getattr(model, "get_input_embeddings", None)
    if callable(get_input) and isinstance(get_input(), nn.Module):
        embedding_modules.append(get_input())
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else getattr(model, "lm_head", None)
    if isinstance(head, nn.Module):
        embedding_modules.append(head)
    seen: set[int] = set()
    embedding = 0
    for module in embedding_modules:
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                embedding += p.numel()
    return ParamCount(total=total, embedding=embedding)


def count_flops(model: nn.Module, input_ids: torch.Tensor, *, backward: bool = False) -> int:
    """FLOPs of one forward (and backward, if asked) on ``input_ids``, counted by ``torch.utils.flop_counter``.

    Works on ``meta``-device models, so the books of a 7B model cost no memory.
    """
    with FlopCounterMode(display=False) as counter:
        out = model(input_ids)
        if backward:
            logits = out if isinstance(out, torch.Tensor) else out.logits  # a Hugging Face model's output
            logits.float().sum().backward()
    return counter.get_total_flops()


def flops_per_token(model: nn.Module, *, seq_len: int, batch: int = 1, backward: bool = False) -> float:
    """Forward (or forward+backward) FLOPs per token at sequence length ``seq_len``.

    A model whose input is not token ids (the U-Net) says what to count on with ``example_input(batch=, seq_len=)``;
    its FLOPs are then per element of that input's last two dimensions (per pixel).
    """
    example = getattr(model, "example_input", None)
    if callable(example):
        inputs = example(batch=batch, seq_len=seq_len)
        return count_flops(model, inputs, backward=backward) / (batch * inputs.shape[-1] * inputs.shape[-2])
    device = next(model.parameters()).device
    ids = torch.zeros(batch, seq_len, dtype=torch.long, device=device)
    return count_flops(model, ids, backward=backward) / (batch * seq_len)
