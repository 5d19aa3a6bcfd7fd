"""A low-rank token embedding: a ``V × r`` table followed by an ``r → d`` projection.

Beyond the papers: CoLA (arXiv 2502.10940, §3) and GaLore keep the embedding dense; CoMERA (arXiv 2405.14377,
"optimized tensorized embedding") tensorizes it as a TT matrix (:mod:`tensorslim.layers.tt_embedding`). This family
is the two-factor case of the same idea, ``E = T P`` with ``T ∈ R^{V×r}`` and ``P ∈ R^{r×d}``: a lookup reads ``r``
numbers per token and one ``(tokens, r) × (r, d)`` GEMM lifts them to the model width, so the embedding's parameters,
gradient and optimizer state shrink from ``V d`` to ``r (V + d)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim._checks import check_fields, require_int
from tensorslim.decomp.svd import truncated_svd
from tensorslim.layers._source import require_weights
from tensorslim.layers.tt_embedding import is_embedding, token_tables
from tensorslim.registry import LayerReport, Transform, register_transform

Init = Literal["svd", "random"]


@dataclass(frozen=True, kw_only=True)
class LowRankEmbeddingConfig:
    """How ``convert_`` turns an ``nn.Embedding`` into a :class:`LowRankEmbedding`.

    Attributes:
        rank: the table's width r, ``1 ≤ r ≤ min(V, d)``.
        init: ``"svd"`` factorizes the dense table by truncated SVD (exact at full rank); ``"random"`` draws both
            factors so that the product has the dense init's entry scale (for training from scratch).
        init_std: the entry standard deviation of the product under ``init="random"`` (LLaMA's 0.02).
    """

    rank: int
    init: Init = "svd"
    init_std: float = 0.02

    def __post_init__(self) -> None:
        check_fields(self)
        require_int("rank", self.rank)
        if self.init not in ("svd", "random"):
            raise ValueError(f"init={self.init!r} is invalid; allowed: 'svd' or 'random'")
        if isinstance(self.init_std, bool) or not isinstance(self.init_std, int | float) or not self.init_std > 0:
            raise ValueError(f"init_std={self.init_std!r} is invalid; allowed: a number > 0")

    def resolve_rank(self, num_embeddings: int, dim: int) -> int:
        """The rank for a ``num_embeddings × dim`` table; raises ``ValueError`` if it exceeds ``min(V, d)``."""
        limit = min(num_embeddings, dim)
        if self.rank > limit:
            raise ValueError(f"rank={self.rank} is out of range for a {num_embeddings}x{dim} table; allowed 1..{limit}")
        return self.rank


class LowRankEmbedding(nn.Module):
    """``E[ids] = T[ids] Pᵀ`` with the table ``T`` (``weight_a``, ``(V, r)``) and the projection ``P`` (``weight_b``,
    ``(d, r)``, ``nn.Linear`` layout); the ``(V, d)`` table is never formed."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        rank: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if not 1 <= rank <= min(num_embeddings, embedding_dim):
            raise ValueError(f"rank={rank} is out of range; allowed 1..{min(num_embeddings, embedding_dim)}")
        self.num_embeddings, self.embedding_dim, self.rank = num_embeddings, embedding_dim, rank
        factory = {"device": device, "dtype": dtype}
        self.weight_a = nn.Parameter(torch.empty(num_embeddings, rank, **factory))  # (V, r)
        self.weight_b = nn.Parameter(torch.empty(embedding_dim, rank, **factory))  # (d, r)
        self.reset_parameters()

    def reset_parameters(self, *, std: float = 0.02) -> None:
        """Both factors ~ N(0, σ²) with ``σ = (std² / r)^{1/4}``: the product's entries then have standard deviation
        ``std``, and the two factors the same scale (as CoLA's init balances its two factors, arXiv 2502.10940
        §2.1)."""
        factor_std = (std**2 / self.rank) ** 0.25
        with torch.no_grad():
            self.weight_a.normal_(0.0, factor_std)
            self.weight_b.normal_(0.0, factor_std)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.linear(F.embedding(ids, self.weight_a), self.weight_b)  # (..., r) -> (..., d)

    @classmethod
    def from_dense(cls, module: nn.Embedding, config: LowRankEmbeddingConfig | None = None) -> LowRankEmbedding:
        """Build from an ``nn.Embedding``: truncated SVD of its table, or the random init of ``config``."""
        if config is None:
            raise ValueError("config=None is invalid; allowed: a LowRankEmbeddingConfig (it names the rank)")
        weight = module.weight  # (V, d)
        rank = config.resolve_rank(module.num_embeddings, module.embedding_dim)
        layer = cls(module.num_embeddings, module.embedding_dim, rank, device=weight.device, dtype=weight.dtype)
        if config.init == "random":
            layer.reset_parameters(std=config.init_std)
            return layer
        require_weights(weight, "svd")
        # The table as a d -> V linear map: W (V, d) ≈ B (V, r) · A (r, d), i.e. T = B and P = Aᵀ.
        projection, table = truncated_svd(weight, rank)
        with torch.no_grad():
            layer.weight_a.copy_(table)
            layer.weight_b.copy_(projection.t())
        return layer

    def to_dense(self) -> nn.Embedding:
        """The equivalent ``nn.Embedding`` (table ``T Pᵀ``)."""
        dense = nn.Embedding(
            self.num_embeddings, self.embedding_dim, device=self.weight_a.device, dtype=self.weight_a.dtype
        )
        with torch.no_grad():
            dense.weight.copy_(self.weight_a @ self.weight_b.t())
        return dense

    @staticmethod
    def count_params(num_embeddings: int, embedding_dim: int, rank: int) -> int:
        """``r (V + d)``."""
        return rank * (num_embeddings + embedding_dim)

    def num_params(self) -> int:
        """Parameters of both factors, i.e. ``sum(p.numel() for p in self.parameters())``."""
        return self.count_params(self.num_embeddings, self.embedding_dim, self.rank)

    def flops(self, tokens: int) -> int:
        """Forward matmul FLOPs for ``tokens`` ids: the projection's ``2 · tokens · r · d`` (the lookup is a copy),
        as ``torch.utils.flop_counter`` counts them."""
        return 2 * tokens * self.rank * self.embedding_dim

    def extra_repr(self) -> str:
        return f"num_embeddings={self.num_embeddings}, embedding_dim={self.embedding_dim}, rank={self.rank}"


def plan_lowrank_embedding(name: str, module: nn.Module, config: LowRankEmbeddingConfig) -> LayerReport:
    """The ``convert_`` report row for replacing an ``nn.Embedding`` by a :class:`LowRankEmbedding`."""
    try:
        rank = config.resolve_rank(module.num_embeddings, module.embedding_dim)
    except ValueError as error:
        raise ValueError(f"layer {name!r}: {error}") from None
    return LayerReport(
        name=name,
        kind=type(module).__name__,
        old_shape=(module.num_embeddings, module.embedding_dim),
        new_shape=f"{module.num_embeddings}x{rank}->{module.embedding_dim}",
        rank=rank,
        params_before=module.num_embeddings * module.embedding_dim,
        params_after=LowRankEmbedding.count_params(module.num_embeddings, module.embedding_dim, rank),
    )


def describe_lowrank_embedding(
    model: nn.Module, name: str, layer: LowRankEmbedding
) -> tuple[LowRankEmbeddingConfig, dict[str, Any]]:
    """The config that rebuilds ``layer`` (nothing read from weights)."""
    return LowRankEmbeddingConfig(rank=layer.rank, init="random"), {}


register_transform(
    LowRankEmbeddingConfig,
    Transform(
        is_embedding,
        plan_lowrank_embedding,
        LowRankEmbedding.from_dense,
        layer_type=LowRankEmbedding,
        describe=describe_lowrank_embedding,
        default_targets=token_tables,
    ),
)
