"""GPT-2 (Radford et al., 2019, "Language Models are Unsupervised Multitask Learners", §2.3 "Model").

A pre-LN decoder: learned position embeddings, ``x + attn(ln_1(x))`` then ``x + mlp(ln_2(x))``, a final LayerNorm
(eps 1e-5), GELU (tanh approximation, ``gelu_new``), fused ``c_attn`` q/k/v projection, causal attention, output head
tied to the token embedding, N(0, 0.02²) init with the residual projections ``c_proj`` scaled by 1/√(2·n_layers)
(§2.3). Module names equal Hugging Face's ``GPT2LMHeadModel`` (``transformer.h.N.attn.c_attn`` ...), but every
projection is an ``nn.Linear`` (HF's ``Conv1D`` stores the transposed weight), so conversions treat it as any linear
layer; :meth:`GPT2ForCausalLM.from_hf_state_dict` and :meth:`GPT2ForCausalLM.to_hf_state_dict` transpose between the
two. Registered as the ``gpt2`` family (task ``lm``) with the models ``gpt2-tiny`` and ``gpt2-small`` (124M).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim._checks import check_fields, require_int
from tensorslim.models.registry import ModelFamily, register_presets

# Hugging Face Conv1D weights, stored (in, out): the projections inside the blocks.
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
_TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh")


@dataclass(frozen=True, kw_only=True)
class GPT2Config:
    """Shape of a GPT-2 decoder (``vocab_size``/``max_seq_len`` are HF's ``vocab_size``/``n_positions``)."""

    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    vocab_size: int = 50257
    max_seq_len: int = 1024
    norm_eps: float = 1e-5
    dropout: float = 0.0
    init_std: float = 0.02

    def __post_init__(self) -> None:
        check_fields(self)
        for name in ("d_model", "n_layers", "n_heads", "d_ff", "vocab_size", "max_seq_len"):
            require_int(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout={self.dropout!r} is invalid; allowed: a number in [0, 1)")

    @classmethod
    def from_hf(cls, hf_config: object) -> GPT2Config:
        """The shape of a ``transformers.GPT2Config`` (dropout 0: our models train without it by default)."""
        activation = hf_config.activation_function
        if activation not in _TANH_GELUS:
            raise ValueError(f"activation_function={activation!r} is unsupported; allowed: {list(_TANH_GELUS)}")
        return cls(
            d_model=hf_config.n_embd,
            n_layers=hf_config.n_layer,
            n_heads=hf_config.n_head,
            d_ff=hf_config.n_inner or 4 * hf_config.n_embd,
            vocab_size=hf_config.vocab_size,
            max_seq_len=hf_config.n_positions,
            norm_eps=hf_config.layer_norm_epsilon,
            init_std=hf_config.initializer_range,
        )


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.d_model, 3 * config.d_model)  # q, k, v stacked by rows
        self.c_proj = nn.Linear(config.d_model, config.d_model)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d = x.shape
        q, k, v = (
            t.view(batch, seq, self.n_heads, d // self.n_heads).transpose(1, 2)  # (B, H, T, hd)
            for t in self.c_attn(x).split(d, dim=2)
        )
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)  # (B, H, T, hd)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(batch, seq, d)))


class MLP(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.d_model, config.d_ff)
        self.c_proj = nn.Linear(config.d_ff, config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    """Embeddings and blocks: token ids ``(B, T)`` → final-normed hidden states ``(B, T, d)``."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.wpe = nn.Embedding(config.max_seq_len, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model, eps=config.norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.drop(self.wte(input_ids) + self.wpe(positions))  # (B, T, d)
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class GPT2ForCausalLM(nn.Module):
    """Token ids ``(B, T)`` → next-token logits ``(B, T, vocab)``; ``lm_head`` shares ``transformer.wte``'s weight."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.config = config
        self.transformer = GPT2Model(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2's init (§2.3, as Hugging Face's): N(0, 0.02²) weights, zero biases, ``c_proj`` / √(2·n_layers)."""
        std = self.config.init_std
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                scale = math.sqrt(2 * self.config.n_layers) if name.endswith("c_proj") else 1.0
                nn.init.normal_(module.weight, mean=0.0, std=std / scale)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        if seq > self.config.max_seq_len:
            raise ValueError(f"sequence length {seq} exceeds max_seq_len={self.config.max_seq_len}")
        return self.lm_head(self.transformer(input_ids))  # (B, T, V)

    @classmethod
    def from_hf_state_dict(cls, state_dict: Mapping[str, torch.Tensor], config: GPT2Config) -> GPT2ForCausalLM:
        """A model of shape ``config`` with the weights of a Hugging Face ``GPT2LMHeadModel`` state dict."""
        model = cls(config)
        model.load_hf_state_dict(state_dict)
        return model

    def load_hf_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load a Hugging Face ``GPT2LMHeadModel`` (or ``GPT2Model``) state dict: Conv1D weights are transposed,
        the attention-mask buffers of older versions dropped and the tied ``lm_head`` filled from ``wte``."""
        ours: dict[str, torch.Tensor] = {}
        for key, value in state_dict.items():
            key = key if key.startswith(("transformer.", "lm_head.")) else f"transformer.{key}"  # a bare GPT2Model
            if key.endswith((".attn.bias", ".attn.masked_bias")):
                continue
            ours[key] = value.t() if key.endswith(_CONV1D) else value
        ours.setdefault("lm_head.weight", ours["transformer.wte.weight"])
        self.load_state_dict(ours)

    def to_hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The state dict in Hugging Face ``GPT2LMHeadModel``'s layout (Conv1D weights transposed back)."""
        return {key: value.t() if key.endswith(_CONV1D) else value for key, value in self.state_dict().items()}


def _build(config: GPT2Config, *, task: str) -> GPT2ForCausalLM:
    return GPT2ForCausalLM(config)


GPT2 = ModelFamily(name="gpt2", tasks=("lm",), build=_build, head_names=("lm_head",))
GPT2_PRESETS: dict[str, GPT2Config] = {
    "gpt2-tiny": GPT2Config(d_model=128, n_layers=2, n_heads=4, d_ff=512, vocab_size=4096, max_seq_len=256),
    "gpt2-small": GPT2Config(d_model=768, n_layers=12, n_heads=12, d_ff=3072),
}
_HELP = {
    "gpt2-tiny": "GPT-2 128-d, 2 layers, vocab 4096 (CPU-sized, tests)",
    "gpt2-small": "GPT-2 small (124M): 768-d, 12 layers, 12 heads, vocab 50257, context 1024",
}
register_presets(GPT2, GPT2_PRESETS, _HELP)
