"""``equip_memory_(model, MemoryConfig)``: give every attention layer of a model a bounded K/V memory, in place.

Supported attention layers: our LLaMA's (:mod:`tensorslim.models.llama`), Hugging Face's ``LlamaAttention`` (causal:
a stream of calls, each call's tokens attend the memory then join it) and Hugging Face's ``BertSelfAttention``
(bidirectional: with ``wait = w`` each query attends once the ``w`` tokens after it have arrived, Attendre's Q
memory, arXiv 2401.04881 §3). The projections stay the same modules under the same names, so a state dict loads
into an equipped model unchanged.

Within one call the input is read ``chunk`` tokens at a time; the memory persists across calls (a long document fed
call by call, or generation token by token) until :func:`reset_memory_`. Hugging Face's own KV cache is not used:
call Hugging Face models with ``use_cache=False`` (:mod:`tensorslim.tasks.longctx.streaming` does).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tensorslim.layers.memory.config import MemoryConfig
from tensorslim.layers.memory.store import KVStore
from tensorslim.models.llama import Attention, apply_rotary
from tensorslim.registry import LayerReport, Transform, register_transform

Rope = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # (x, positions) -> cos, sin
ALLOWED = "tensorslim LLaMA, Hugging Face LlamaForCausalLM/LlamaModel, Hugging Face BERT (e.g. MiniLM)"


class MemoryAttention(nn.Module):
    """Multi-head attention over a :class:`KVStore`, with the projections of the layer it replaces.

    Args:
        projections: ``(q, k, v)`` linear maps ``d -> H·hd``, ``d -> H_kv·hd``, ``d -> H_kv·hd``.
        heads, kv_heads, head_dim: the layer's head layout.
        scale: the softmax scale (``hd^-1/2``).
        rope: rotary tables for positions, or None for models whose positions are in the input (BERT).
        config: the memory.
    """

    def __init__(
        self,
        projections: tuple[nn.Module, nn.Module, nn.Module],
        *,
        heads: int,
        kv_heads: int,
        head_dim: int,
        scale: float,
        rope: Rope | None,
        config: MemoryConfig,
    ) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = projections
        self.heads, self.kv_heads, self.head_dim, self.scale = heads, kv_heads, head_dim, scale
        self.rope = rope
        self.store = KVStore(config)

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        """The attention output ``(B, T, H·hd)`` of the next ``T`` tokens ``x`` ``(B, T, d)`` of the stream."""
        batch, seq, _ = x.shape
        store, chunk = self.store, self.store.config.chunk
        positions = store.next_positions(seq, device=x.device)  # (T,)
        q = self.q_proj(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = self.k_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, H_kv, T, hd)
        v = self.v_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.rope is not None:
            cos, sin = self.rope(x, positions)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        outputs: list[torch.Tensor] = []
        waiting = 0  # queries of this call inserted but not yet answered (the Q memory)
        for start in range(0, seq, chunk):
            end = min(start + chunk, seq)
            store.insert(k[:, :, start:end], v[:, :, start:end])
            # A query at position p is answered once the tokens up to p + wait have arrived.
            ready = max(0, end - store.config.wait) if end < seq else end
            if ready > waiting:
                outputs.append(store.attend(q[:, :, waiting:ready], positions[waiting:ready], scale=self.scale))
                waiting = ready
            store.evict()
        out = torch.cat(outputs, dim=2)  # (B, H, T, hd)
        return out.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim)


class LlamaMemoryAttention(MemoryAttention):
    """Drop-in for :class:`tensorslim.models.llama.Attention`: ignores the block's cos/sin (positions come from the
    memory's stream) and has no use for the KV cache."""

    def __init__(self, inner: Attention, *, rope_theta: float, config: MemoryConfig) -> None:
        head_dim = inner.head_dim
        inv_freq = 1.0 / rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)

        def rope(x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            # The formula of llama.rotary_cos_sin, evaluated at the stream positions only.
            angles = torch.outer(positions.float(), inv_freq.to(x.device))  # (T, hd/2)
            angles = torch.cat([angles, angles], dim=-1)
            return angles.cos(), angles.sin()

        super().__init__(
            (inner.q_proj, inner.k_proj, inner.v_proj),
            heads=inner.n_heads,
            kv_heads=inner.n_heads,
            head_dim=head_dim,
            scale=head_dim**-0.5,
            rope=rope,
            config=config,
        )
        self.o_proj = inner.o_proj

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: object = None) -> torch.Tensor:
        if kv is not None:
            raise ValueError("a model with a memory takes no KV cache; allowed: model(ids) call after call")
        return self.o_proj(self.attend(x))


class HFLlamaMemoryAttention(MemoryAttention):
    """Drop-in for Hugging Face's ``LlamaAttention`` (returns ``(output, None)``; the mask and cache are unused)."""

    def __init__(self, inner: nn.Module, *, rotary: nn.Module, config: MemoryConfig) -> None:
        hf = inner.config

        def rope(x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            cos, sin = rotary(x, positions[None])  # (1, T, hd): the model's own rotary embedding
            return cos[:, None], sin[:, None]

        super().__init__(
            (inner.q_proj, inner.k_proj, inner.v_proj),
            heads=hf.num_attention_heads,
            kv_heads=hf.num_key_value_heads,
            head_dim=inner.head_dim,
            scale=inner.scaling,
            rope=rope,
            config=config,
        )
        self.o_proj = inner.o_proj

    def forward(self, hidden_states: torch.Tensor, *args: object, **kwargs: object) -> tuple[torch.Tensor, None]:
        return self.o_proj(self.attend(hidden_states)), None


class BertMemoryAttention(MemoryAttention):
    """Drop-in for Hugging Face's ``BertSelfAttention`` (no padding: the attention mask is unused). Each call is one
    document, read from an empty memory."""

    def __init__(self, inner: nn.Module, *, config: MemoryConfig) -> None:
        heads = inner.num_attention_heads
        super().__init__(
            (inner.query, inner.key, inner.value),
            heads=heads,
            kv_heads=heads,
            head_dim=inner.attention_head_size,
            scale=inner.scaling,
            rope=None,
            config=config,
        )

    def forward(self, hidden_states: torch.Tensor, *args: object, **kwargs: object) -> tuple[torch.Tensor, None]:
        # An encoder call reads one whole document: nothing streams from the previous call (its batch, its
        # positions and its autograd graph belong to other documents).
        self.store.reset()
        return self.attend(hidden_states), None


@dataclass(frozen=True)
class MemoryReport:
    """What :func:`equip_memory_` changed.

    Attributes:
        layers: qualified names of the attention modules replaced.
        kind: ``"causal"`` (LLaMA) or ``"bidirectional"`` (BERT).
        config: the memory.
    """

    layers: tuple[str, ...]
    kind: str
    config: MemoryConfig

    def __str__(self) -> str:
        c = self.config
        return (
            f"{len(self.layers)} {self.kind} attention layers with a memory of {c.capacity} entries "
            f"(policy {c.policy}, sinks {c.sinks}, chunk {c.chunk}, wait {c.wait})"
        )


def _hf_class(module_path: str, name: str) -> type | None:
    """A transformers class, only if transformers is already loaded (a model of it exists); never imports it."""
    module = sys.modules.get(module_path)
    return getattr(module, name, None)


def attention_kind(module: nn.Module) -> str | None:
    """``"causal"`` or ``"bidirectional"`` for an attention layer a memory can replace, else None."""
    if isinstance(module, Attention):
        return "causal"
    hf_llama = _hf_class("transformers.models.llama.modeling_llama", "LlamaAttention")
    if hf_llama is not None and isinstance(module, hf_llama):
        return "causal"
    hf_bert = _hf_class("transformers.models.bert.modeling_bert", "BertSelfAttention")
    if hf_bert is not None and isinstance(module, hf_bert):
        return "bidirectional"
    return None


def _build_memory(model: nn.Module, name: str, module: nn.Module, config: MemoryConfig) -> MemoryAttention:
    """The memory attention that replaces the attention layer ``module`` of ``model``."""
    del name
    if isinstance(module, Attention):
        return LlamaMemoryAttention(module, rope_theta=model.config.rope_theta, config=config)
    if attention_kind(module) == "causal":  # Hugging Face LLaMA: the model's own rotary embedding
        rotary = next(m for m in model.modules() if type(m).__name__ == "LlamaRotaryEmbedding")
        return HFLlamaMemoryAttention(module, rotary=rotary, config=config)
    return BertMemoryAttention(module, config=config)


def _select_attention(model: nn.Module, config: MemoryConfig) -> list[tuple[str, nn.Module]]:
    del config
    return [(name, module) for name, module in model.named_modules() if attention_kind(module) is not None]


def _check_memory(model: nn.Module, config: MemoryConfig, found: list[tuple[str, nn.Module]]) -> None:
    """The whole model first: not equipped yet, an attention layer to equip, ``wait`` only where queries may wait."""
    if memory_stores(model):
        raise ValueError(f"model {type(model).__name__} already has a memory; allowed: a model not yet equipped")
    if not found:
        raise ValueError(f"model {type(model).__name__} has no attention layer we can equip; allowed: {ALLOWED}")
    kind = attention_kind(found[0][1])
    if kind == "causal" and config.wait:
        raise ValueError(f"wait={config.wait} needs a bidirectional model; allowed: wait=0 for causal {kind} models")


def _plan_memory(name: str, module: nn.Module, config: MemoryConfig) -> LayerReport:
    """A memory adds no parameter: the projections stay the same modules."""
    query = getattr(module, "q_proj", None) or module.query
    params = sum(p.numel() for p in module.parameters())
    return LayerReport(
        name=name,
        kind=type(module).__name__,
        old_shape=(query.in_features, query.out_features),
        new_shape=f"memory of {config.capacity} entries ({config.policy})",
        rank=0,
        params_before=params,
        params_after=params,
    )


def _describe_memory(model: nn.Module, name: str, layer: MemoryAttention) -> tuple[MemoryConfig, dict[str, Any]]:
    """The memory's config; what it holds is the state of a stream, which a saved model starts without."""
    del model, name
    return layer.store.config, {}


def equip_memory_(model: nn.Module, config: MemoryConfig) -> MemoryReport:
    """Replace every attention layer of ``model`` by one with the bounded memory ``config``; returns the report.

    The memory is a family of :mod:`tensorslim.registry`: this is ``convert_(model, config)`` (``plan`` previews it,
    ``save_pretrained`` records it and ``load_pretrained`` rebuilds it), reported as a :class:`MemoryReport`.

    Raises:
        ValueError: the model has no attention layer we can equip, is already equipped, or is causal and
            ``config.wait > 0`` (a causal model's queries cannot wait for later tokens).
    """
    from tensorslim.convert import convert_

    if not isinstance(config, MemoryConfig):
        raise TypeError(f"config of type {type(config).__name__} is invalid; allowed: MemoryConfig")
    kinds = {name: attention_kind(module) for name, module in _select_attention(model, config)}
    report = convert_(model, config)
    layers = tuple(layer.name for layer in report.layers)
    return MemoryReport(layers=layers, kind=kinds[layers[0]], config=config)


def memory_stores(model: nn.Module) -> list[KVStore]:
    """The memories of an equipped model, one per attention layer, in module order (empty if not equipped)."""
    return [module.store for module in model.modules() if isinstance(module, MemoryAttention)]


def reset_memory_(model: nn.Module) -> None:
    """Empty every memory of ``model``: the next call starts a new stream at position 0."""
    for store in memory_stores(model):
        store.reset()


register_transform(
    MemoryConfig,
    Transform(
        accepts=lambda module: attention_kind(module) is not None,
        plan_layer=_plan_memory,
        build=None,
        build_in=_build_memory,
        layer_type=MemoryAttention,
        describe=_describe_memory,
        select=_select_attention,
        check=_check_memory,
        transparent=True,
    ),
)
