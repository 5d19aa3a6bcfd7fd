"""The modules UniPELT combines (Mao et al., ACL 2022, arXiv 2110.07577, §3) and the prompt layer of arXiv 2405.05493.

Every gate is the official code's: ``g = mean_t σ(W·x_t + b)`` with ``W ∈ R^{1×d}`` drawn from N(0, 0.02) and
``b = 0``, so ``g ≈ 0.5`` at the start; the mean runs over all ``T`` positions of the gate's input, padding
included, as in the official code. The modules wrap Hugging Face BERT-family layers (``BertSelfAttention``,
``BertOutput``'s LayerNorm; RoBERTa, ELECTRA … share them), where they call transformers' own attention functions,
so eager, SDPA and flash attention all work, and the same layers of tensorslim's own BERT
(:mod:`tensorslim.models.bert`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.layers.lora import LoRALinear


class Gate(nn.Module):
    """``g = mean_t σ(w·x_t + b)``: ``(B, T, d) → (B, 1)``."""

    def __init__(self, dim: int, *, device: torch.device | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, 1, device=device, dtype=dtype)
        if self.linear.weight.device.type != "meta":
            nn.init.normal_(self.linear.weight, std=0.02)  # BERT's init, as UniPELT and AdapterHub
            nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.linear(x)).mean(dim=1)  # (B, T, 1) → (B, 1)


class GatedLoRALinear(LoRALinear):
    """LoRA (arXiv 2106.09685) whose update is scaled by a gate of the layer input instead of α/r (UniPELT §3):
    ``y = W₀x + g(x)·B·A·x``; without a gate it is plain LoRA, ``y = W₀x + (α/r)·B·A·x``."""

    def __init__(self, base: nn.Linear, *, rank: int, alpha: float, dropout: float = 0.0, gate: bool = True) -> None:
        super().__init__(base, rank=rank, alpha=alpha, dropout=dropout)
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_gate = Gate(base.in_features, **factory) if gate else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.lora_gate is None:
            return super().forward(x)
        update = F.linear(F.linear(self.dropout(x), self.lora_a), self.lora_b)  # (B, T, d_out)
        return self.base(x) + update * self.lora_gate(x).unsqueeze(-1)  # gate (B, 1, 1)

    def merged(self) -> nn.Linear:
        """The base layer with ``(α/r)·B·A`` added to its weight: exact for ungated LoRA only."""
        if self.lora_gate is not None:
            raise ValueError("a gated LoRA update depends on the input (g(x)·B·A·x); allowed: merge ungated LoRA only")
        return merge_lora(self)


def merge_lora(module: LoRALinear) -> nn.Linear:
    """``module``'s base ``nn.Linear`` with the update folded in (``W ← W + (α/r)·B·A``)."""
    if module.crossing:
        raise ValueError("a LaX-LoRA latent crossing depends on another layer; allowed: merge plain LoRA only")
    base = module.base
    with torch.no_grad():
        base.weight += module.scaling * (module.lora_b @ module.lora_a)
    return base


class PrefixEncoder(nn.Module):
    """Prefix keys and values of ``n_layers`` layers from ``length`` embeddings (Li & Liang, arXiv 2101.00190, §4.3):
    ``P = Linear₂(tanh(Linear₁(E)))`` with ``E ∈ R^{length×d}``, ``P ∈ R^{length×(n_layers·2·d)}``; with
    ``mlp_dim=None`` ``P`` is trained directly. The layout is peft's (layer, key/value, head, head_dim).

    Every weight is drawn from N(0, 0.02) and every bias is zero, BERT's init, which the official UniPELT code gives
    these modules (they live in ``BertEncoder``, so ``init_weights`` reaches them). The prefixes then start near zero.
    PyTorch's default init (``E`` from N(0, 1)) starts them at about ±0.3 and, at the learning rates LoRA and the
    adapter need, sent prefix tuning and UniPELT to the majority class on BBC titles. The prefixes are computed in
    every forward, with or without gradients: on a MiniLM-shaped BERT they cost about 1 % of a one-sequence forward,
    too little for a cache that would have to notice every way a weight can change (``.data`` writes included)."""

    def __init__(
        self, *, length: int, dim: int, n_layers: int, n_heads: int, mlp_dim: int | None, device=None, dtype=None
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.length, self.dim, self.n_layers, self.n_heads = length, dim, n_layers, n_heads
        out = n_layers * 2 * dim
        self.embedding = nn.Embedding(length, dim if mlp_dim is not None else out, **factory)
        self.transform = (
            nn.Sequential(nn.Linear(dim, mlp_dim, **factory), nn.Tanh(), nn.Linear(mlp_dim, out, **factory))
            if mlp_dim is not None
            else None
        )
        if self.embedding.weight.device.type != "meta":
            for module in self.modules():
                if isinstance(module, nn.Linear | nn.Embedding):
                    nn.init.normal_(module.weight, std=0.02)
                if isinstance(module, nn.Linear):
                    nn.init.zeros_(module.bias)

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of adapted layer ``index``, each ``(heads, length, head_dim)``."""
        rows = slice(index * 2 * self.dim, (index + 1) * 2 * self.dim)
        if self.transform is None:
            flat = self.embedding.weight[:, rows]
        else:
            first, _, second = self.transform
            # Only this layer's rows of the second Linear: the same numbers as slicing the full output.
            flat = F.linear(torch.tanh(first(self.embedding.weight)), second.weight[rows], second.bias[rows])
        kv = flat.view(self.length, 2, self.n_heads, self.dim // self.n_heads).permute(1, 2, 0, 3)
        return kv[0], kv[1]  # (H, n, hd) each


def extend_mask(mask: torch.Tensor | None, length: int) -> torch.Tensor | None:
    """An attention mask ``(B, 1, T_q, T_k)`` (boolean: True attends; additive: 0 attends) with ``length`` visible
    key columns put in front; None (every key visible) stays None."""
    if mask is None:
        return None
    visible = True if mask.dtype == torch.bool else 0.0
    front = torch.full((*mask.shape[:-1], length), visible, dtype=mask.dtype, device=mask.device)
    return torch.cat([front, mask], dim=-1)


def linear_weight(linear: nn.Module) -> torch.Tensor:
    """The weight of a linear layer, or of the base layer a LoRA wraps (the width, device and dtype to follow)."""
    return linear.base.weight if isinstance(linear, LoRALinear) else linear.weight


class PrefixAttention(nn.Module):
    """What both prefix attentions share: the layer's gate and its gated prefixes before the keys and values
    (UniPELT §3, prefix part): ``K' = [g·P_K; K]``, ``V' = [g·P_V; V]``. Queries keep their positions (prefixes
    are not tokens of the sequence)."""

    def __init__(self, inner: nn.Module, encoder: PrefixEncoder, index: int, *, projection: nn.Module, gate: bool):
        super().__init__()
        self.inner = inner
        self.index = index
        self.__dict__["encoder"] = encoder  # shared by every layer; registered once, on the model
        weight = linear_weight(projection)
        self.prefix_gate = Gate(weight.shape[1], device=weight.device, dtype=weight.dtype) if gate else None

    def prefixed(
        self, hidden_states: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``key``, ``value`` ``(B, H, T, hd)`` with this layer's (gated) prefixes in front: ``(B, H, n + T, hd)``."""
        batch = hidden_states.shape[0]
        prefix_k, prefix_v = self.encoder.layer(self.index)  # (H, n, hd)
        prefix_k = prefix_k.expand(batch, -1, -1, -1)
        prefix_v = prefix_v.expand(batch, -1, -1, -1)
        if self.prefix_gate is not None:
            gate = self.prefix_gate(hidden_states).view(batch, 1, 1, 1)
            prefix_k, prefix_v = prefix_k * gate, prefix_v * gate
        return torch.cat([prefix_k.to(key.dtype), key], dim=2), torch.cat([prefix_v.to(value.dtype), value], dim=2)


class PrefixSelfAttention(PrefixAttention):
    """A Hugging Face BERT-family self-attention with gated prefixes, its mask extended so every query sees them."""

    def __init__(self, inner: nn.Module, encoder: PrefixEncoder, index: int, *, gate: bool) -> None:
        super().__init__(inner, encoder, index, projection=inner.query, gate=gate)

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, cache=None, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        from transformers.models.bert.modeling_bert import eager_attention_forward

        if cache is not None:
            raise ValueError("prefix tuning here is for encoders; allowed: cache=None")
        inner = self.inner
        batch, length = hidden_states.shape[:2]
        heads = (batch, length, -1, inner.attention_head_size)
        query = inner.query(hidden_states).view(heads).transpose(1, 2)  # (B, H, T, hd)
        key = inner.key(hidden_states).view(heads).transpose(1, 2)
        value = inner.value(hidden_states).view(heads).transpose(1, 2)
        key, value = self.prefixed(hidden_states, key, value)  # (B, H, n + T, hd)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(inner.config._attn_implementation, eager_attention_forward)
        kwargs.pop("encoder_hidden_states", None)
        output, weights = attention(
            inner,
            query,
            key,
            value,
            extend_mask(attention_mask, self.encoder.length),
            dropout=inner.dropout.p if self.training else 0.0,
            scaling=inner.scaling,
            **kwargs,
        )
        return output.reshape(batch, length, -1).contiguous(), weights


class PrefixNativeAttention(PrefixAttention):
    """The self-attention of tensorslim's own BERT (:class:`tensorslim.models.bert.SelfAttention`) with gated
    prefixes; its ``(B, T)`` key mask gets ``n`` visible columns in front."""

    def __init__(self, inner: nn.Module, encoder: PrefixEncoder, index: int, *, gate: bool) -> None:
        super().__init__(inner, encoder, index, projection=inner.q, gate=gate)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        inner = self.inner
        query, key, value = inner.heads(x)  # (B, H, T, hd)
        key, value = self.prefixed(x, key, value)
        if key_mask is not None:
            key_mask = torch.cat([key_mask.new_ones(x.shape[0], self.encoder.length), key_mask], dim=1)
        return inner.attend(query, key, value, key_mask)


class BottleneckNorm(nn.Module):
    """The LayerNorm closing a post-LN feed-forward block, with a gated bottleneck adapter before it, AdapterHub's
    ``seq_bn`` (Pfeiffer) order. The block computes ``LN(s)`` with ``s = h + r`` (``h`` the dropped-out FFN output,
    ``r`` the block input); adapted, ``z = LN(s)`` and ``out = LN(s + g(z)·U·relu(D·z + b_D) + b_U)``, the layer's
    own LayerNorm applied twice. ``U = 0`` at the start, so the adapted layer starts exactly as the pretrained one
    (AdapterHub draws ``U`` small instead). Wraps Hugging Face's ``BertOutput.LayerNorm`` and our BERT's ``norm2``."""

    def __init__(self, inner: nn.LayerNorm, *, reduction: int, gate: bool) -> None:
        super().__init__()
        self.inner = inner
        weight = inner.weight
        dim = weight.shape[0]
        factory = {"device": weight.device, "dtype": weight.dtype}
        hidden = max(1, dim // reduction)
        self.down = nn.Linear(dim, hidden, **factory)
        self.up = nn.Linear(hidden, dim, **factory)
        if weight.device.type != "meta":
            nn.init.kaiming_uniform_(self.down.weight, a=math.sqrt(5))
            nn.init.zeros_(self.up.weight)
            nn.init.zeros_(self.up.bias)
        self.adapter_gate = Gate(dim, **factory) if gate else None

    def forward(self, summed: torch.Tensor) -> torch.Tensor:
        z = self.inner(summed)  # (B, T, d)
        adapted = self.up(F.relu(self.down(z)))
        if self.adapter_gate is not None:
            adapted = adapted * self.adapter_gate(z).unsqueeze(-1)  # gate (B, 1, 1)
        return self.inner(summed + adapted)


class PromptEmbedding(nn.Module):
    """``length`` trainable virtual-token embeddings (Lester et al., arXiv 2104.08691) put into the input embeddings
    with the attention mask extended by ones: before them (peft's ``PromptTuningConfig`` order, AdapterHub's
    ``combine="prefix"``), or with ``after_first`` after the first token (AdapterHub's ``"prefix_after_bos"``), so a
    BERT classifier's pooler still reads ``[CLS]`` at position 0."""

    def __init__(self, length: int, dim: int, *, after_first: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(length, dim, device=device, dtype=dtype))
        self.after_first = after_first

    @property
    def length(self) -> int:
        return self.weight.shape[0]

    def insert(self, embeds: torch.Tensor) -> torch.Tensor:
        """``(B, T, d) → (B, n + T, d)``."""
        return self.around(embeds, self.weight.expand(embeds.shape[0], -1, -1).to(embeds.dtype))

    def around(self, rows: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
        """``prompt`` ``(B, n, …)`` put into ``rows`` ``(B, T, …)`` where the prompt goes (masks, token types)."""
        cut = 1 if self.after_first else 0
        return torch.cat([rows[:, :cut], prompt, rows[:, cut:]], dim=1)

    def remove(self, rows: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`around`: ``(B, n + T, …) → (B, T, …)``, the rows at the prompt's positions dropped."""
        cut = 1 if self.after_first else 0
        return torch.cat([rows[:, :cut], rows[:, cut + self.length :]], dim=1)
