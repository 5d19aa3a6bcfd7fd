"""Causal language modelling: next-token cross-entropy on packed sequences (the CoLA/GaLore pre-training task).

Validation loss is the mean cross-entropy over every predicted token of a fixed held-out set (the reference code
divides the summed batch losses by n + 1; we divide by n).

On our LLaMA with its plain ``nn.Linear`` head, or a factored head ``B (A h)`` (``--factor-vocab``), the head and the
loss run fused in token chunks (:func:`tensorslim.functional.cross_entropy.linear_cross_entropy`, arXiv 2411.09009
§4), so the ``(B, T, V)`` logits are never formed; any other model or head (otherwise converted, quantized, hooked,
Hugging Face's) takes the logits path.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.functional.cross_entropy import linear_cross_entropy
from tensorslim.layers.lowrank import LowRankLinear
from tensorslim.models.llama import LlamaForCausalLM
from tensorslim.tasks.base import Autocast, Task, TaskData, logits_of, mean_over_batches, model_tokenizer, register_task


def causal_lm_loss(logits: torch.Tensor, input_ids: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy: position t predicts token t+1. logits ``(B, T, V)``, ids ``(B, T)``.

    The last position has no target and is ignored, rather than sliced off: slicing ``logits[:, :-1]`` would copy
    the whole ``(B, T, V)`` tensor, which at a 32k vocabulary costs as much memory traffic as a small layer.
    """
    targets = next_token_targets(input_ids)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction=reduction, ignore_index=-100)


def next_token_targets(input_ids: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` targets: token t+1 at position t, -100 (``ignore_index``) at the last position."""
    return F.pad(input_ids[:, 1:], (0, 1), value=-100)


def _plain_factored(head: nn.Module) -> bool:
    """A bias-free, ungated :class:`LowRankLinear` without activation on plain tensors: logits ``B (A h)``."""
    return (
        type(head) is LowRankLinear
        and head.activation == "identity"
        and head.bias is None
        and not head.gated
        and type(head.weight_a.data) is torch.Tensor
        and type(head.weight_b.data) is torch.Tensor
    )


def fused_head(model: nn.Module) -> nn.Linear | LowRankLinear | None:
    """``model``'s LM head when the loss may read the model's hidden states and the head's weights directly: our
    LLaMA, not sharded by FSDP2, with a plain bias-free ``nn.Linear`` head (or a plain factored one, see
    :func:`_plain_factored`), no hooks on it and plain weights. None otherwise."""
    head = getattr(model, "lm_head", None)
    plain_dense = type(head) is nn.Linear and head.bias is None and type(head.weight.data) is torch.Tensor
    if (
        not isinstance(model, LlamaForCausalLM)
        or any(cls.__name__ == "FSDPModule" for cls in type(model).__mro__)  # FSDP2 gathers the head's weight itself
        or not (plain_dense or _plain_factored(head))
        or head._forward_hooks
        or head._forward_pre_hooks
        or nn.modules.module._global_forward_hooks
        or nn.modules.module._global_forward_pre_hooks
    ):
        return None
    return head


def lm_loss(model: nn.Module, input_ids: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy of ``model`` on ``input_ids`` ``(B, T)``: fused head and loss where
    :func:`fused_head` allows it, else :func:`causal_lm_loss` of the model's logits."""
    head = fused_head(model)
    if head is None:
        return causal_lm_loss(logits_of(model(input_ids)), input_ids, reduction=reduction)
    hidden = model(input_ids, return_hidden=True)  # (B, T, d)
    targets = next_token_targets(input_ids)
    if isinstance(head, nn.Linear):
        return linear_cross_entropy(hidden, head.weight, targets, reduction=reduction)
    latent = F.linear(hidden, head.weight_a)  # (B, T, r): a factored head's chunked loss runs over B (V, r) only
    return linear_cross_entropy(latent, head.weight_b, targets, reduction=reduction)


@register_task
class CausalLM(Task):
    """Causal language modelling on packed text (default data: the Python standard library's source)."""

    name = "lm"

    def build_data(self, config: Any, *, model_name: str) -> TaskData:
        from tensorslim.data import BatchStream, build_lm_data
        from tensorslim.models.registry import get_model

        preset = get_model(model_name)
        data = build_lm_data(
            config.data,
            tokenizer=config.tokenizer or model_tokenizer(model_name),
            vocab_size=config.vocab_size or preset.config.vocab_size,
            seq_len=config.seq_len,
            max_val_blocks=config.eval_blocks,
            text_field=config.text_field,
        )
        return TaskData(
            train=BatchStream(data.train, batch_size=config.batch_size, seed=config.seed),
            validation=data.validation,
            tokenizer=data.tokenizer,
            model_overrides={"vocab_size": data.tokenizer.vocab_size, "max_seq_len": config.seq_len},
            tokens_per_batch=config.batch_size * config.seq_len,
        )

    def loss(self, model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        return lm_loss(model, batch)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data: TaskData, *, batch_size: int, autocast: Autocast) -> dict[str, float]:
        blocks: torch.Tensor = data.validation  # (N, T)

        def summed(batch: torch.Tensor) -> tuple[torch.Tensor, int]:
            with autocast():
                return lm_loss(model, batch, reduction="sum"), batch.shape[0] * (batch.shape[1] - 1)

        loss = mean_over_batches((blocks,), summed, batch_size=batch_size, device=next(model.parameters()).device)
        return {"val_loss": loss, "val_perplexity": math.exp(min(loss, 700.0))}
