"""CoMERA's TT-matrix (TTM) embedding with the optimized lookup.

CoMERA (Yang et al., NeurIPS 2024, arXiv 2405.14377), "optimized tensorized embedding" (paper Fig. p.5) and the
official ``layers.py``. The table ``E ∈ R^{V'×D}`` (``V' = ∏ m_k ≥ V`` rows, the extra rows are padding that is
never indexed) is a TTM with 4-way cores ``F_k ∈ R^{r_{k-1}×m_k×n_k×r_k}``:
``E[(i_1..i_d),(j_1..j_d)] = F_1[:,i_1,j_1,:] … F_d[:,i_d,j_d,:]``, row id ↦ ``(i_1..i_d)`` row-major mixed radix.

Deviations from the official ``TensorizedEmbedding_order4``: any order ≥ 2 (the official optimized layer is order 4
only and its generic fallback calls undefined functions), index arithmetic on the ids' device instead of
CUDA-pinned buffers, and ids ≥ ``num_embeddings`` are rejected rather than silently reading padding rows.
``padding_idx`` of a source ``nn.Embedding`` is not enforced (its row is approximated like any other).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from tensorslim.decomp.shapes import check_factors, factorize, pad_and_factorize
from tensorslim.decomp.tt import ttm_svd, ttm_to_full
from tensorslim.functional.threads import one_thread_graph
from tensorslim.functional.tt import (
    apply_gates,
    best_split,
    ttm_lookup_chain,
    ttm_lookup_flops,
    ttm_lookup_halves,
)
from tensorslim.layers._source import require_weights
from tensorslim.layers.tt import GATE_THRESHOLD, GatedCores, check_tt_config, resolve_ranks
from tensorslim.registry import LayerReport, Transform, register_transform

Init = Literal["ttm_svd", "random"]
Lookup = Literal["halves", "chain"]


@dataclass(frozen=True, kw_only=True)
class TTEmbeddingConfig:
    """How ``convert_`` turns an ``nn.Embedding`` into a :class:`TTEmbedding`.

    Attributes:
        rank: maximum internal TTM rank (CoMERA hard-codes 32 for the embedding) or a full rank list.
        n_cores: number of cores when the factors are automatic (CoMERA: 4).
        row_factors: explicit row modes with ``∏ ≥ num_embeddings`` (CoMERA: 16·20·10·10 for 30,522 rows).
        col_factors: explicit column modes with ``∏ = embedding_dim`` (CoMERA: 4·4·8·6 for 768).
        init: ``"ttm_svd"`` decomposes the dense table; ``"random"`` is CoMERA's init (target std 1.0).
        lookup: ``"halves"`` (§1.5 half-tables + unique ids) or ``"chain"`` (per-id core chain).
        rank_gates: attach rank gates at construction (§2.1).
    """

    rank: int | tuple[int, ...] = 32
    n_cores: int = 4
    row_factors: tuple[int, ...] | None = None
    col_factors: tuple[int, ...] | None = None
    init: Init = "ttm_svd"
    lookup: Lookup = "halves"
    rank_gates: bool = False

    def __post_init__(self) -> None:
        check_tt_config(self, decomposed="ttm_svd")
        if self.lookup not in ("halves", "chain"):
            raise ValueError(f"lookup={self.lookup!r} is invalid; allowed: 'halves' or 'chain'")

    def resolve(self, num_embeddings: int, dim: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """``(row_factors, col_factors, ranks)``; raises a one-line ``ValueError`` on a mismatch."""
        n = len(self.row_factors or self.col_factors or ()) or self.n_cores
        rows = tuple(self.row_factors) if self.row_factors else pad_and_factorize(num_embeddings, n)
        cols = tuple(self.col_factors) if self.col_factors else factorize(dim, n, order="ascending")
        check_factors("row_factors", rows, at_least=num_embeddings, exact=False)
        check_factors("col_factors", cols, at_least=dim)
        if len(rows) != len(cols):
            raise ValueError(f"row_factors={list(rows)} and col_factors={list(cols)} must have the same length")
        return rows, cols, resolve_ranks(self.rank, tuple(m * n for m, n in zip(rows, cols, strict=True)))


class TTEmbedding(GatedCores):
    """An embedding table stored as TTM cores; rows are computed without forming the table.

    Args:
        num_embeddings: real vocabulary size ``V`` (ids must be < V).
        row_factors: row modes, ``∏ ≥ V``.
        col_factors: column modes, ``∏ = embedding_dim``.
        ranks: full rank list with boundary 1s.
        lookup: ``"halves"`` or ``"chain"`` (see :class:`TTEmbeddingConfig`).
        unique: deduplicate ids before computing rows (CoMERA ``use_unique=True``).

    Attribute ``check_ids`` (default True) rejects ids outside ``[0, V)``; the check reads the ids' range on the
    host, so a captured CUDA graph runs with it off (:func:`tensorslim.methods.comera.static.static_lookups`).
    """

    def __init__(
        self,
        num_embeddings: int,
        row_factors: tuple[int, ...],
        col_factors: tuple[int, ...],
        ranks: tuple[int, ...],
        *,
        lookup: Lookup = "halves",
        unique: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        check_factors("row_factors", tuple(row_factors), at_least=num_embeddings, exact=False)
        self.num_embeddings = num_embeddings
        self.row_factors, self.col_factors = tuple(row_factors), tuple(col_factors)
        self.embedding_dim = math.prod(self.col_factors)
        ranks = resolve_ranks(
            tuple(ranks), tuple(m * n for m, n in zip(self.row_factors, self.col_factors, strict=True))
        )
        self.lookup, self.unique = lookup, unique
        self.check_ids = True
        factory = {"device": device, "dtype": dtype}
        self.cores = nn.ParameterList(
            nn.Parameter(torch.empty(r0, m, n, r1, **factory))
            for r0, m, n, r1 in zip(ranks[:-1], self.row_factors, self.col_factors, ranks[1:], strict=True)
        )
        self.gates = nn.ParameterList()
        self.gate_threshold = GATE_THRESHOLD
        self.split = best_split(self.row_factors, self.col_factors, ranks)
        self.reset_parameters()

    @property
    def ranks(self) -> tuple[int, ...]:
        return (1, *(core.shape[-1] for core in self.cores))

    def reset_parameters(self, *, target_sdv: float = 1.0) -> None:
        """CoMERA init (``layers.py`` L129): ``F_k ~ N(0,1)/√r_k · target_sdv^{1/order}``."""
        scale = target_sdv ** (1.0 / len(self.cores))
        with torch.no_grad():
            for core in self.cores:
                core.normal_().mul_(scale / math.sqrt(core.shape[-1]))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"ids must be an integer tensor, got {ids.dtype}")
        # Padding rows exist only to make the modes factor; reading one is a caller bug (as nn.Embedding would be).
        if self.check_ids and ids.numel() and ids.device.type != "meta":
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or high >= self.num_embeddings:
                raise IndexError(f"ids must lie in [0, {self.num_embeddings}); got range [{low}, {high}]")
        ids = ids.long()
        unique = self.unique and ids.device.type != "meta"  # torch.unique has no meta kernel (books on meta models)
        n_cores = len(self.cores)

        def lookup(*tensors: torch.Tensor) -> tuple[torch.Tensor]:
            cores = apply_gates(list(tensors[:n_cores]), list(tensors[n_cores:]), threshold=self.gate_threshold)
            if self.lookup == "chain":
                return (ttm_lookup_chain(ids, cores, unique=unique),)  # (*ids.shape, D)
            return (ttm_lookup_halves(ids, cores, split=self.split, unique=unique),)  # (*ids.shape, D)

        # Half-tables of a few thousand numbers and one tiny GEMM per group of ids: on one thread in forward and in
        # backward, as the TT linear layers' contractions (tensorslim.layers.tt.tt_factors).
        return one_thread_graph(lookup, *self.cores, *self.gates)[0]

    @classmethod
    def from_dense(cls, module: nn.Embedding, config: TTEmbeddingConfig | None = None) -> TTEmbedding:
        """Build from an ``nn.Embedding``: TTM-SVD of the (zero-padded) table or CoMERA's random init."""
        config = config or TTEmbeddingConfig()
        weight = module.weight  # (V, D)
        rows, cols, ranks = config.resolve(module.num_embeddings, module.embedding_dim)
        layer = cls(
            module.num_embeddings, rows, cols, ranks, lookup=config.lookup, device=weight.device, dtype=weight.dtype
        )
        if config.init == "ttm_svd":
            require_weights(weight, "ttm_svd")
            with torch.no_grad():
                for param, core in zip(layer.cores, ttm_svd(weight, rows, cols, ranks[1:-1]), strict=True):
                    param.copy_(core)
        if config.rank_gates:
            layer.enable_gates()
        return layer

    def full_table(self) -> torch.Tensor:
        """The padded table ``(∏ m_k, D)`` (debug only)."""
        return ttm_to_full(self.effective_cores())

    def to_dense(self) -> nn.Embedding:
        """The equivalent ``nn.Embedding`` (padding rows dropped, gates folded in)."""
        dense = nn.Embedding(
            self.num_embeddings, self.embedding_dim, device=self.cores[0].device, dtype=self.cores[0].dtype
        )
        with torch.no_grad():
            dense.weight.copy_(self.full_table()[: self.num_embeddings])
        return dense

    def num_params(self) -> int:
        """Core and gate parameters, ``Σ r_{k-1} m_k n_k r_k`` + gates."""
        return sum(p.numel() for p in self.cores) + sum(g.numel() for g in self.gates)

    def flops(self, tokens: int) -> int:
        """Forward matmul FLOPs when the ``tokens`` ids are all distinct (with repeats and ``unique=True`` only
        distinct ids cost a GEMM): the two half-table chains plus one ``N_1×r×N_2`` GEMM per id."""
        if self.lookup != "halves":
            raise NotImplementedError("flops() is defined for lookup='halves'")
        return ttm_lookup_flops(self.row_factors, self.col_factors, self.ranks, split=self.split, rows=tokens)

    def extra_repr(self) -> str:
        return (
            f"num_embeddings={self.num_embeddings}, row_factors={list(self.row_factors)}, "
            f"col_factors={list(self.col_factors)}, ranks={list(self.ranks)}, lookup={self.lookup!r}"
        )


def is_embedding(module: nn.Module) -> bool:
    return isinstance(module, nn.Embedding)


def token_tables(model: nn.Module) -> list[nn.Module]:
    """What a default conversion tensorizes: the token table (the embedding with the most rows), as CoMERA does;
    position and token-type tables are small and stay dense."""
    tables = [module for module in model.modules() if isinstance(module, nn.Embedding)]
    return [max(tables, key=lambda table: table.num_embeddings)] if tables else []


def plan_tt_embedding(name: str, module: nn.Module, config: TTEmbeddingConfig) -> LayerReport:
    """The ``convert_`` report row for replacing an ``nn.Embedding`` by a :class:`TTEmbedding`."""
    try:
        rows, cols, ranks = config.resolve(module.num_embeddings, module.embedding_dim)
    except ValueError as error:
        raise ValueError(f"layer {name!r}: {error}") from None
    cores = sum(r0 * m * n * r1 for r0, m, n, r1 in zip(ranks[:-1], rows, cols, ranks[1:], strict=True))
    return LayerReport(
        name=name,
        kind=type(module).__name__,
        old_shape=(module.num_embeddings, module.embedding_dim),
        new_shape=f"TTM {list(rows)}x{list(cols)} r={list(ranks)}",
        rank=max(ranks),
        params_before=module.num_embeddings * module.embedding_dim,
        params_after=cores + (sum(ranks[1:-1]) if config.rank_gates else 0),
    )


def describe_tt_embedding(model: nn.Module, name: str, layer: TTEmbedding) -> tuple[TTEmbeddingConfig, dict[str, Any]]:
    """The config that rebuilds ``layer`` with its current ranks, and the lookup switches a config does not hold."""
    config = TTEmbeddingConfig(
        rank=tuple(layer.ranks),
        n_cores=len(layer.cores),
        row_factors=tuple(layer.row_factors),
        col_factors=tuple(layer.col_factors),
        init="random",
        lookup=layer.lookup,
        rank_gates=len(layer.gates) > 0,
    )
    return config, {"gate_threshold": layer.gate_threshold, "unique": layer.unique, "check_ids": layer.check_ids}


def restore_tt_embedding(layer: TTEmbedding, state: dict[str, Any]) -> None:
    """Set the rank-gate threshold and lookup switches :func:`describe_tt_embedding` recorded."""
    layer.gate_threshold, layer.unique, layer.check_ids = state["gate_threshold"], state["unique"], state["check_ids"]


register_transform(
    TTEmbeddingConfig,
    Transform(
        is_embedding,
        plan_tt_embedding,
        TTEmbedding.from_dense,
        layer_type=TTEmbedding,
        describe=describe_tt_embedding,
        restore=restore_tt_embedding,
        default_targets=token_tables,
    ),
)
