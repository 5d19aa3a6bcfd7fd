"""Structure for the vocabulary layers: a low-rank LM head, and optionally a low-rank token embedding (opt-in,
beyond the papers).

CoLA (arXiv 2502.10940, §3) and GaLore keep the ``V × d`` embedding and head dense; at ``60m`` (V = 32,000, d = 512)
they are more than half of the model's parameters and the head is the largest GEMM of a CoLA step. Factoring the head
at rank r turns it into ``B (A h)`` (``A`` r × d, ``B`` V × r: :class:`~tensorslim.layers.lowrank.LowRankLinear`
without activation, whose loss the LM task computes fused, as it does for a dense head), cutting its FLOPs from
``2 V d`` to ``2 r (V + d)`` per token. The token embedding is a lookup whose forward and backward cost next to
nothing, so factoring it (a ``V × r`` table lifted by an ``r → d`` projection,
:class:`~tensorslim.layers.lowrank_embedding.LowRankEmbedding`) saves parameters and optimizer state but no step
time; it is therefore a separate choice (``embedding=True``). Both work with every training method, which converts
the blocks only.

Both layers start as the truncated SVD of the weights they replace (``init="svd"``): a trained model's, or, when
training from scratch, the dense layer's own random init (its best rank-r approximation; ``A`` has orthogonal rows).
CoLA's random init (``init="random"``, every entry of both factors alike), made for the blocks, gave a head that
learned markedly slower (60m, rank 128, lr 2e-3: validation loss 6.48 at step 200 against 6.29 from the SVD of the
dense init, on the same batches; CoLA with a dense head 6.02).
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


def _conversions(model: nn.Module, rank: int, *, embedding: bool, init: str) -> list[tuple[object, object]]:
    """``(config, filter_fn)`` of the head's conversion, then the embedding's if ``embedding``; validates the model
    and the rank first."""
    require_int("factor_vocab", rank)
    if not isinstance(embedding, bool):
        raise TypeError(f"embedding={embedding!r} is invalid; allowed: True or False")
    head, table = getattr(model, "lm_head", None), getattr(model, "embed_tokens", None)
    if not isinstance(head, nn.Linear) or (embedding and not isinstance(table, nn.Embedding)):
        needs = "a dense lm_head and embed_tokens" if embedding else "a dense lm_head"
        raise ValueError(
            f"factor_vocab={rank} needs a model with {needs} (LLaMA); "
            f"{type(model).__name__} has none or they are already converted"
        )
    limit = min(head.in_features, table.embedding_dim) if embedding else head.in_features
    if rank > limit:
        raise ValueError(f"factor_vocab={rank} is out of range; allowed 1..{limit} (the model width)")
    conversions: list[tuple[object, object]] = [(SVDConfig(rank=rank, init=init), _is_head)]
    if embedding:
        embedding_init = "svd" if init == "svd" else "random"
        conversions.append((LowRankEmbeddingConfig(rank=rank, init=embedding_init), None))
    return conversions


def check_vocabulary_choice(rank: int, embedding: bool) -> None:
    """A one-line ``ValueError`` when the token embedding is to be factored without a head rank to share."""
    if embedding and not rank:
        raise ValueError("factor_embedding=True needs factor_vocab > 0 (the rank it shares with the head)")


def plan_vocabulary(model: nn.Module, rank: int, *, embedding: bool = False) -> list[ConversionReport]:
    """The reports of :func:`factor_vocabulary_` (parameters before and after), with nothing changed."""
    conversions = _conversions(model, rank, embedding=embedding, init="random")
    return [plan(model, config, filter_fn=keep) for config, keep in conversions]


def factor_vocabulary_(
    model: nn.Module, rank: int, *, embedding: bool = False, init: str = "svd"
) -> list[ConversionReport]:
    """Replace ``model.lm_head`` (and, with ``embedding``, ``model.embed_tokens``) by a rank-``rank``
    factorization, in place.

    Args:
        model: a model with an ``nn.Linear`` ``lm_head`` (and an ``nn.Embedding`` ``embed_tokens``): our LLaMA.
        rank: r, at most the model width.
        embedding: also factor the token embedding at the same rank (fewer parameters, no faster step).
        init: ``"svd"`` factorizes the layers' current weights, trained or freshly initialized (exact at full
            rank); ``"random"`` draws CoLA's init for the head and the dense scale for the table.

    Returns:
        The conversion reports: the head's, then the embedding's if ``embedding``.
    """
    if init not in ("svd", "random"):
        raise ValueError(f"init={init!r} is invalid; allowed: 'svd' or 'random'")
    conversions = _conversions(model, rank, embedding=embedding, init=init)
    # The rank is the caller's; a full-rank factorization (larger than dense) is a supported reference point.
    return [convert_(model, config, filter_fn=keep, allow_larger=True) for config, keep in conversions]
