"""Structure for the vocabulary layers: a low-rank LM head and a low-rank token embedding (opt-in, beyond the papers).

CoLA (arXiv 2502.10940, §3) and GaLore keep the ``V × d`` embedding and head dense; at ``60m`` (V = 32,000, d = 512)
they are more than half of the model's parameters and the head is the largest GEMM of a CoLA step. Factoring them
at rank r turns the head into ``B (A h)`` (``A`` r × d, ``B`` V × r: :class:`~tensorslim.layers.lowrank.LowRankLinear`
without activation, whose loss the LM task computes fused, as it does for a dense head) and the embedding into a
``V × r`` table lifted by an ``r → d`` projection (:class:`~tensorslim.layers.lowrank_embedding.LowRankEmbedding`).
Both work with every training method, which converts the blocks only.
"""

from __future__ import annotations

from torch import nn

from tensorslim._checks import require_int
from tensorslim.convert import convert_, plan
from tensorslim.layers.lowrank import SVDConfig
from tensorslim.layers.lowrank_embedding import LowRankEmbeddingConfig
from tensorslim.registry import ConversionReport


def _is_head(module: nn.Module, name: str) -> bool:
    return name == "lm_head"


def _conversions(model: nn.Module, rank: int, *, init: str) -> list[tuple[object, object]]:
    """``(config, filter_fn)`` of the two conversions; validates the model and the rank first."""
    require_int("factor_vocab", rank)
    head, table = getattr(model, "lm_head", None), getattr(model, "embed_tokens", None)
    if not isinstance(head, nn.Linear) or not isinstance(table, nn.Embedding):
        raise ValueError(
            f"factor_vocab={rank} needs a model with a dense lm_head and embed_tokens (LLaMA); "
            f"{type(model).__name__} has none or they are already converted"
        )
    limit = min(head.in_features, table.embedding_dim)
    if rank > limit:
        raise ValueError(f"factor_vocab={rank} is out of range; allowed 1..{limit} (the model width)")
    embedding_init = "svd" if init == "svd" else "random"
    return [
        (SVDConfig(rank=rank, init=init), _is_head),
        (LowRankEmbeddingConfig(rank=rank, init=embedding_init), None),
    ]


def plan_vocabulary(model: nn.Module, rank: int) -> list[ConversionReport]:
    """The reports of :func:`factor_vocabulary_` (parameters before and after), with nothing changed."""
    return [plan(model, config, filter_fn=keep) for config, keep in _conversions(model, rank, init="random")]


def factor_vocabulary_(model: nn.Module, rank: int, *, init: str = "random") -> list[ConversionReport]:
    """Replace ``model.lm_head`` and ``model.embed_tokens`` by rank-``rank`` factorizations, in place.

    Args:
        model: a model with an ``nn.Linear`` ``lm_head`` and an ``nn.Embedding`` ``embed_tokens`` (our LLaMA).
        rank: r, at most the model width.
        init: ``"random"`` for training from scratch (CoLA's init for the head, the dense scale for the table), or
            ``"svd"`` to factorize trained weights (exact at full rank).

    Returns:
        The two conversion reports (head, embedding).
    """
    if init not in ("svd", "random"):
        raise ValueError(f"init={init!r} is invalid; allowed: 'svd' or 'random'")
    conversions = _conversions(model, rank, init=init)
    # The rank is the caller's; a full-rank factorization (larger than dense) is a supported reference point.
    return [convert_(model, config, filter_fn=keep, allow_larger=True) for config, keep in conversions]
