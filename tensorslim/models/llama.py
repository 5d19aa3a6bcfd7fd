"""LLaMA-style decoder with the GaLore/CoLA model sizes.

Architecture (Touvron et al., 2023, arXiv 2302.13971, §2; the model configs of GaLore, arXiv 2403.03507, and CoLA,
arXiv 2502.10940): pre-norm RMSNorm (eps 1e-6), rotary position embeddings (θ = 10⁴), SwiGLU MLP, no biases, untied
input and output embeddings, multi-head attention without GQA. Module names follow Hugging Face's
``LlamaForCausalLM`` (``q_proj``, ``gate_proj``, ``input_layernorm`` ...) so that CoLA's and Hugging Face's
checkpoints map one to one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim._checks import check_fields, require_int
from tensorslim.functional.attention import causal_attention
from tensorslim.models.projections import linear_many
from tensorslim.models.registry import ModelFamily, register_presets


@dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    """Shape of a LLaMA decoder."""

    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    vocab_size: int = 32000
    max_seq_len: int = 1024
    rope_theta: float = 1e4
    norm_eps: float = 1e-6
    init_std: float = 0.02

    def __post_init__(self) -> None:
        check_fields(self)
        for name in ("d_model", "n_layers", "n_heads", "d_ff", "vocab_size", "max_seq_len"):
            require_int(name, getattr(self, name))
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(
                f"d_model={self.d_model} must split into n_heads={self.n_heads} heads of even size (for RoPE)"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


# The model sizes of GaLore and CoLA (their ``configs/llama_*.json``), plus a CPU-sized one.
CONFIGS: dict[str, LlamaConfig] = {
    # Not in the papers: trains in minutes on two cores; the 60M ratios (d_ff ≈ 8d/3).
    "tiny": LlamaConfig(d_model=256, n_layers=4, n_heads=4, d_ff=688, vocab_size=4096, max_seq_len=256),
    "60m": LlamaConfig(d_model=512, n_layers=8, n_heads=8, d_ff=1376),
    "130m": LlamaConfig(d_model=768, n_layers=12, n_heads=12, d_ff=2048),
    "350m": LlamaConfig(d_model=1024, n_layers=24, n_heads=16, d_ff=2736),
    "1b": LlamaConfig(d_model=2048, n_layers=24, n_heads=32, d_ff=5461),
    "7b": LlamaConfig(d_model=4096, n_layers=32, n_heads=32, d_ff=11008, max_seq_len=2048),
}


class RMSNorm(nn.Module):
    """``x / rms(x) · g`` computed in float32, as in Hugging Face's ``LlamaRMSNorm``."""

    def __init__(self, dim: int, *, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def rotary_cos_sin(
    seq_len: int, head_dim: int, *, theta: float, device: torch.device, start: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of positions ``start .. seq_len - 1``, shape ``(T, head_dim)``, in Hugging Face's half-split
    layout."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    positions = torch.arange(start, seq_len, device=device, dtype=torch.float32)
    angles = torch.outer(positions, inv_freq)  # (T, hd/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, hd)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape ``(B, H, T, hd)`` by the position angles (``rotate_half`` convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class LayerKV:
    """The rotated keys and the values of one attention layer for the tokens seen so far, each ``(B, H, P, hd)``.

    They live in buffers with room for more tokens (capacity doubled when full), so appending one decoded token
    copies that token's keys and values only, not the whole cache as a concatenation would.
    """

    def __init__(self) -> None:
        self._keys: torch.Tensor | None = None  # (B, H, capacity, hd)
        self._values: torch.Tensor | None = None
        self.length = 0

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._keys is None else self._keys[:, :, : self.length]

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._values is None else self._values[:, :, : self.length]

    @property
    def nbytes(self) -> int:
        """Bytes held, spare capacity included."""
        return sum(t.numel() * t.element_size() for t in (self._keys, self._values) if t is not None)

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the new tokens' ``(B, H, T, hd)`` keys and values; returns all of them, ``(B, H, P + T, hd)``."""
        end = self.length + keys.shape[2]
        if self._keys is None or end > self._keys.shape[2] or self._keys.dtype != keys.dtype:
            self._grow(keys, values, capacity=max(end, 2 * self.length))
        self._keys[:, :, self.length : end] = keys
        self._values[:, :, self.length : end] = values
        self.length = end
        return self.keys, self.values

    def _grow(self, keys: torch.Tensor, values: torch.Tensor, *, capacity: int) -> None:
        batch, heads, _, head_dim = keys.shape
        new_keys = keys.new_empty(batch, heads, capacity, head_dim)
        new_values = values.new_empty(batch, heads, capacity, values.shape[-1])
        if self.length:
            new_keys[:, :, : self.length] = self.keys
            new_values[:, :, : self.length] = self.values
        self._keys, self._values = new_keys, new_values


class KVCache:
    """Keys and values of every layer for incremental decoding: ``model(ids, cache=cache)`` appends to it in place,
    and the next call's positions continue from :attr:`length`."""

    def __init__(self, n_layers: int) -> None:
        require_int("n_layers", n_layers)
        self.layers = [LayerKV() for _ in range(n_layers)]

    @property
    def length(self) -> int:
        """Tokens cached so far."""
        return self.layers[0].length


def causal_mask(seq: int, past: int, *, device: torch.device) -> torch.Tensor:
    """``(T, P + T)`` boolean mask, True where query ``P + i`` may attend key ``j`` (``j <= P + i``)."""
    return torch.arange(past + seq, device=device)[None, :] <= past + torch.arange(seq, device=device)[:, None]


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.n_heads, self.head_dim = config.n_heads, config.head_dim
        d = config.d_model
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: LayerKV | None = None) -> torch.Tensor:
        batch, seq, d = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, seq, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, hd)

        # One product for q, k and v when they are TT layers (each layer on its own otherwise).
        q, k, v = linear_many(x, (self.q_proj, self.k_proj, self.v_proj))
        q, k, v = apply_rotary(heads(q), cos, sin), apply_rotary(heads(k), cos, sin), heads(v)
        if kv is None:
            y = causal_attention(q, k, v)  # (B, H, T, hd); SDPA, or matmuls where faster (bf16 on CPU)
        else:
            # SDPA's is_causal aligns the mask top-left; the new queries sit after the P cached keys. One new token
            # attends to every key: no mask.
            mask = None if seq == 1 else causal_mask(seq, kv.length, device=x.device)  # (T, P + T)
            y = F.scaled_dot_product_attention(q, *kv.append(k, v), attn_mask=mask)  # (B, H, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(batch, seq, d))


class MLP(nn.Module):
    """SwiGLU: ``down(act(gate(x)) ⊙ up(x))``; CoLA's ``only_lr_act`` replaces ``act_fn`` by the identity."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.up_proj = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.down_proj = nn.Linear(config.d_ff, config.d_model, bias=False)
        self.act_fn: nn.Module = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = linear_many(x, (self.gate_proj, self.up_proj))  # one product when both are TT layers
        return self.down_proj(self.act_fn(gate) * up)


class Block(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: LayerKV | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(nn.Module):
    """Token ids ``(B, T)`` → next-token logits ``(B, T, vocab)``."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Hugging Face's LLaMA init: every ``nn.Linear`` and ``nn.Embedding`` ~ N(0, 0.02²), norms at 1."""
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def new_cache(self) -> KVCache:
        """An empty cache for incremental decoding with this model."""
        return KVCache(self.config.n_layers)

    def forward(
        self, input_ids: torch.Tensor, *, cache: KVCache | None = None, return_hidden: bool = False
    ) -> torch.Tensor:
        """Logits ``(B, T, V)`` of ``input_ids`` ``(B, T)``.

        With ``cache`` (from :meth:`new_cache`), ``input_ids`` continue the cached tokens: their positions start at
        ``cache.length``, they attend to the cached keys too, and their keys and values are appended to ``cache``.
        With ``return_hidden``, the final normed hidden states ``(B, T, d)`` that ``lm_head`` reads, instead of the
        logits: the LM task feeds them with ``lm_head.weight`` to a fused head and loss.
        """
        past = 0 if cache is None else cache.length
        length = past + input_ids.shape[1]
        if length > self.config.max_seq_len:
            raise ValueError(f"sequence length {length} exceeds max_seq_len={self.config.max_seq_len}")
        if cache is not None and len(cache.layers) != len(self.layers):
            raise ValueError(f"cache has {len(cache.layers)} layers; allowed: the model's {len(self.layers)}")
        x = self.embed_tokens(input_ids)  # (B, T, d); any embedding layer (a TT embedding has no .weight)
        seq = past + x.shape[1]  # the positions come from the embeddings: a soft prompt may have added rows
        cos, sin = rotary_cos_sin(seq, self.config.head_dim, theta=self.config.rope_theta, device=x.device, start=past)
        for i, block in enumerate(self.layers):
            x = block(x, cos, sin) if cache is None else block(x, cos, sin, cache.layers[i])
        hidden = self.norm(x)  # (B, T, d)
        return hidden if return_hidden else self.lm_head(hidden)  # (B, T, V)


def _build(config: LlamaConfig, *, task: str) -> LlamaForCausalLM:
    return LlamaForCausalLM(config)


LLAMA = ModelFamily(name="llama", tasks=("lm",), build=_build, head_names=("lm_head",))

_HELP = {
    "tiny": "LLaMA 256-d, 4 layers, vocab 4096 (CPU-sized, not in the papers)",
    "60m": "LLaMA 60M (GaLore/CoLA): 512-d, 8 layers, 8 heads",
    "130m": "LLaMA 130M (GaLore/CoLA): 768-d, 12 layers, 12 heads",
    "350m": "LLaMA 350M (GaLore/CoLA): 1024-d, 24 layers, 16 heads",
    "1b": "LLaMA 1B (GaLore/CoLA): 2048-d, 24 layers, 32 heads",
    "7b": "LLaMA 7B (GaLore/CoLA): 4096-d, 32 layers, 32 heads, context 2048",
}
register_presets(LLAMA, CONFIGS, _HELP)
