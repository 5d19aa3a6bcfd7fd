"""A BERT-style post-LN encoder: CoMERA's six-encoder transformer (``bert6``) with MLM and classification heads.

Architecture as CoMERA's (Yang et al., NeurIPS 2024, arXiv 2405.14377) official ``Transformer_tensor_sublayers.py``
/ ``Transformer_tensor.py``:
learned word, position (512) and token-type (2) embeddings summed and layer-normed; post-LN blocks
(``x = LN(x + Attn(x))``, ``x = LN(x + FFN(x))``) with GELU, LayerNorm eps 1e-9 and dropout 0.1; the classifier takes
the first ([CLS]) token through ``fc1`` (tanh) and ``fc2``. The MLM head (dense + GELU + LN + decoder, untied) follows
BERT; CoMERA's released code has no MLM head (its code-model pre-training is not released). Registered as the
``bert`` family (tasks ``mlm``, ``classify``) with the models ``bert-tiny``, ``bert-small`` and ``bert6``.

Shapes only: CoMERA's tensorization of these models is the ``comera`` method's
(:func:`tensorslim.methods.comera.tensorize.comera_`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim._checks import check_fields, require_int
from tensorslim.functional.dropout import Dropout, attention
from tensorslim.models.projections import linear_many
from tensorslim.models.registry import ModelFamily, register_presets

# How the classifier summarizes the sequence: CoMERA / BERT take the first ([CLS]) token; "mean" (our addition)
# averages the unmasked tokens, which learns topic classification from scratch on a small corpus much sooner.
POOLINGS = ("cls", "mean")


@dataclass(frozen=True, kw_only=True)
class BertConfig:
    """Shape of the encoder (defaults: CoMERA's six-encoder model, ``run_MNLI.sh``)."""

    vocab_size: int = 30522
    d_model: int = 768
    n_layers: int = 6
    n_heads: int = 12
    d_ff: int = 3072
    max_seq_len: int = 512
    type_vocab_size: int = 2
    norm_eps: float = 1e-9
    dropout: float = 0.1
    n_classes: int = 3
    pooling: str = "cls"

    def __post_init__(self) -> None:
        check_fields(self)
        for name in (
            "vocab_size",
            "d_model",
            "n_layers",
            "n_heads",
            "d_ff",
            "max_seq_len",
            "n_classes",
            "type_vocab_size",
        ):
            require_int(name, getattr(self, name))
        if not self.norm_eps > 0:  # LayerNorm divides by sqrt(var + eps): 0 or less can divide by zero or a negative
            raise ValueError(f"norm_eps={self.norm_eps!r} is invalid; allowed: a finite number > 0")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout={self.dropout!r} is invalid; allowed: a number in [0, 1)")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling={self.pooling!r} is unknown; allowed: {list(POOLINGS)}")


BERT_PRESETS: dict[str, BertConfig] = {
    "bert6": BertConfig(),
    # CPU-sized (not in the paper): same layout, fewer and narrower layers, for the small-scale experiment and tests.
    # The CPU-sized models pool by the mean: from scratch on BBC News (docs/comera.md, bert-small, 1,200 steps)
    # [CLS] pooling reached 70.9 % dense / 45.3 % CoMERA accuracy, mean pooling 81.1 % / 91.2 %.
    "bert-small": BertConfig(
        vocab_size=4097, d_model=192, n_layers=2, n_heads=4, d_ff=768, max_seq_len=128, pooling="mean"
    ),
    "bert-tiny": BertConfig(
        vocab_size=1000, d_model=96, n_layers=2, n_heads=4, d_ff=384, max_seq_len=128, pooling="mean"
    ),
}


def get_bert_preset(name: str) -> BertConfig:
    if name not in BERT_PRESETS:
        raise ValueError(f"preset={name!r} is unknown; allowed: {list(BERT_PRESETS)}")
    return BERT_PRESETS[name]


class SelfAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        d = config.d_model
        self.n_heads = config.n_heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        return self.attend(*self.heads(x), key_mask)

    def heads(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Queries, keys and values of ``x`` ``(B, T, d)``, each ``(B, h, T, d/h)``."""
        b, t, d = x.shape
        # One product for q, k and v when they are TT layers (CoMERA): x is read once for the three.
        return [
            y.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2)
            for y in linear_many(x, (self.q, self.k, self.v))
        ]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        """The output projection of softmax attention; ``key_mask`` ``(B, T_k)``: True (or 1) = attend."""
        p = self.dropout if self.training else 0.0
        out = attention(q, k, v, key_mask=key_mask, dropout_p=p)  # (B, h, T, d/h)
        b, _, t, _ = out.shape
        return self.o(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, config.d_ff)
        self.fc2 = nn.Linear(config.d_ff, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class EncoderLayer(nn.Module):
    """Post-LN block (BERT / CoMERA): residual, dropout, then LayerNorm."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attn = SelfAttention(config)
        self.norm1 = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.ffn = FeedForward(config)
        self.norm2 = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.drop = Dropout(config.dropout)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        x = self.norm1(x + self.drop(self.attn(x, key_mask)))
        return self.norm2(x + self.drop(self.ffn(x)))


class Embeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(config.vocab_size, config.d_model)
        self.position = nn.Embedding(config.max_seq_len, config.d_model)
        self.token_type = nn.Embedding(config.type_vocab_size, config.d_model)
        self.norm = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.drop = Dropout(config.dropout)

    def forward(self, ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        words = self.word(ids)  # (B, T, d); a soft prompt (tensorslim.layers.adapters) may add rows to it
        batch, length = words.shape[:2]
        x = words + self.position(torch.arange(length, device=ids.device))[None]
        types = ids.new_zeros(batch, length) if token_type_ids is None else token_type_ids
        return self.drop(self.norm(x + self.token_type(types)))


class BertEncoder(nn.Module):
    """Embeddings + ``n_layers`` post-LN blocks; returns hidden states ``(B, T, d)``."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_layers))

    def forward(
        self,
        ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = self.embeddings(ids, token_type_ids)
        for layer in self.layers:
            x = layer(x, attention_mask)
        return x


class BertForMaskedLM(nn.Module):
    """Encoder + BERT MLM head (dense, GELU, LN, untied decoder); returns logits ``(B, T, V)``.

    ``positions`` (a ``(B, T)`` boolean mask) restricts the head to the chosen positions, the only ones the MLM loss
    reads (15 % of them in BERT's masking): logits ``(N, V)`` for the N True positions in row-major order. This is
    ModernBERT's sparse prediction (arXiv 2412.13663; Hugging Face's ``sparse_prediction``). With a 30k vocabulary the
    head and its log-softmax over every position were a large share of a ``bert6`` step, and of a CoMERA one most.
    """

    predicts_positions = True  # the mlm task passes ``positions=labels != -100``

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.encoder = BertEncoder(config)
        self.transform = nn.Linear(config.d_model, config.d_model)
        self.transform_norm = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size)

    def forward(
        self,
        ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden = self.encoder(ids, attention_mask=attention_mask)  # (B, T, d)
        if positions is not None:
            hidden = hidden[positions]  # (N, d)
        return self.lm_head(self.transform_norm(F.gelu(self.transform(hidden))))  # (B, T, V) or (N, V)


class BertForSequenceClassification(nn.Module):
    """Encoder + CoMERA's classifier: first token → ``fc1`` → tanh → dropout → ``fc2``; returns ``(B, n_classes)``.

    With ``config.pooling == "mean"`` (not in CoMERA) the mean of the unmasked tokens replaces the first token.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.encoder = BertEncoder(config)
        self.classifier = nn.ModuleDict(
            {"fc1": nn.Linear(config.d_model, config.d_model), "fc2": nn.Linear(config.d_model, config.n_classes)}
        )
        self.drop = Dropout(config.dropout)

    def forward(self, ids: torch.Tensor, *, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.encoder(ids, attention_mask=attention_mask)  # (B, T, d)
        if self.encoder.config.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            keep = torch.ones_like(ids) if attention_mask is None else attention_mask
            weights = keep.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)
        return self.classifier["fc2"](self.drop(torch.tanh(self.classifier["fc1"](pooled))))


def _build(config: BertConfig, *, task: str) -> nn.Module:
    return BertForMaskedLM(config) if task == "mlm" else BertForSequenceClassification(config)


# The MLM decoder and the classifier's last layer (d × n_classes) stay dense by default; ``fc1`` (d × d) is a block.
BERT = ModelFamily(name="bert", tasks=("mlm", "classify"), build=_build, head_names=("lm_head", "classifier.fc2"))
_HELP = {
    "bert-tiny": "BERT 96-d, 2 layers, vocab 1000, mean pooling (tests)",
    "bert-small": "BERT 192-d, 2 layers, vocab 4097, mean pooling (CPU-sized)",
    "bert6": "CoMERA's six-encoder BERT (arXiv 2405.14377): 768-d, 12 heads, vocab 30522",
}
register_presets(BERT, BERT_PRESETS, _HELP)
