"""LaX (Latent Crossing): low-rank layers that receive the latent of the same layer type in the previous block.

LaX, "Boosting Low-Rank Training of Foundation Models via Latent Crossing" (arXiv 2505.21732), §3 "The LaX Method",
"Variants of LaX" and "LaX Gates"; the official ViT code (``K1seki221/Latent_Crossing``). For the low-rank layer of
type ℓ (q, k, v, o, gate_proj, up_proj, down_proj in LLaMA) in block i > 0::

    z = LN_r(x·A + G(h_prev))        h_prev: the latent of layer ℓ in block i−1, shape (..., r)
    h = σ(z)                          σ = SiLU for LaX-CoLA, identity for LaX-SVD; h is passed on to block i+1
    y = h·B (+ b)

``G`` is the **crossing** (the paper's "LaX gate"; named crossing here so that it is never confused with CoMERA's
rank gates or a GLU's gate projection). Block 0 (and any layer whose type has no predecessor in the block before)
has **no crossing and no LayerNorm**: it is the plain low-rank layer, as in the official code where ``first=True``
switches both off. Crossing kinds: ``identity``; ``dense`` (``nn.Linear(r, r)`` with bias); ``kronecker``
(``G(h) = Dᵀ·H·E`` per token with ``H`` the a×b reshape of h, a·b = r the most balanced factor pair, a² + b²
parameters), the kind of the paper's LaX configs.

With the crossing set to zero a crossing layer computes ``B σ(LN_r(x·A))``: the LayerNorm stays, so LaX with G = 0
equals the plain low-rank model **with an r-dimensional LayerNorm on the latents of blocks i > 0**, not the plain
model itself.

The latents travel through a per-model :class:`LatentStore`, cleared by a forward pre-hook (and post-hook) on the
root module, so no model code changes. The tensor-train variant (inter- and intra-layer residuals) is in
:mod:`tensorslim.layers.lax_tt`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.functional.lowrank import activation_fn
from tensorslim.layers._source import is_dense_linear
from tensorslim.layers.lowrank import (
    CoLAConfig,
    LowRankConfig,
    LowRankLinear,
    SVDConfig,
    drop_glu_activation,
    low_rank_fields,
    plan_low_rank,
)
from tensorslim.registry import ConversionReport, LayerReport, Transform, register_transform

CROSSINGS: tuple[str, ...] = ("identity", "dense", "kronecker")


def check_crossing(crossing: str) -> None:
    """Raise a one-line ``ValueError`` unless ``crossing`` is one of :data:`CROSSINGS`."""
    if crossing not in CROSSINGS:
        raise ValueError(f"crossing={crossing!r} is unknown; allowed: {list(CROSSINGS)}")


@dataclass(frozen=True, kw_only=True)
class LaXConfig(LowRankConfig):
    """Low-rank layers with latent crossing (LaX §3).

    Attributes:
        crossing: the kind of crossing G: ``"kronecker"`` (the paper's configs), ``"dense"`` or ``"identity"``.
        norm_eps: epsilon of the r-dimensional LayerNorm (1e-6 in the official code).
    """

    crossing: str = "kronecker"
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        super().__post_init__()
        check_crossing(self.crossing)
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps={self.norm_eps!r} is invalid; allowed: a number > 0")


@dataclass(frozen=True, kw_only=True)
class LaXCoLAConfig(CoLAConfig, LaXConfig):
    """LaX-CoLA: CoLA's latent SiLU after the crossing (LaX §3, "Variants of LaX")."""


@dataclass(frozen=True, kw_only=True)
class LaXSVDConfig(SVDConfig, LaXConfig):
    """LaX-SVD: no latent activation."""


def balanced_factors(rank: int) -> tuple[int, int]:
    """The most balanced ``(a, b)`` with ``a · b = rank`` and ``a <= b`` (64 → (8, 8), 96 → (8, 12))."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank={rank!r} is invalid; allowed: an integer >= 1")
    a = max(d for d in range(1, math.isqrt(rank) + 1) if rank % d == 0)
    return a, rank // a


class KroneckerCrossing(nn.Module):
    """``G(h) = Dᵀ·H·E`` with ``H = h.view(a, b)``, i.e. ``(D ⊗ E)ᵀ h`` (LaX §3 "LaX Gates", ``TenserizedGate``).

    Args:
        rank: r = a·b, split by :func:`balanced_factors`.
    """

    def __init__(self, rank: int, *, device: Any = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.a, self.b = balanced_factors(rank)
        self.weight_d = nn.Parameter(torch.empty(self.a, self.a, device=device, dtype=dtype))
        self.weight_e = nn.Parameter(torch.empty(self.b, self.b, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # The official ``TenserizedGate`` uses kaiming_uniform_ on both factors.
        nn.init.kaiming_uniform_(self.weight_d, a=math.sqrt(5))
        nn.init.kaiming_uniform_(self.weight_e, a=math.sqrt(5))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        # Two explicit GEMMs (not einsum, whose path may turn a size-1 factor into an uncounted multiply), so the
        # cost is exactly 2·r·(a+b) per token, as :func:`crossing_flops` books it.
        grid = h.unflatten(-1, (self.a, self.b))  # (..., a, b)
        mixed = grid @ self.weight_e  # (..., a, b): H·E
        out = (mixed.transpose(-1, -2) @ self.weight_d).transpose(-1, -2)  # (..., a, b): Dᵀ·H·E
        return out.flatten(-2)  # (..., r)

    def extra_repr(self) -> str:
        return f"a={self.a}, b={self.b}"


def make_crossing(kind: str, rank: int, *, device: Any = None, dtype: torch.dtype | None = None) -> nn.Module:
    """The r×r crossing G of one layer: ``identity``, ``dense`` or ``kronecker``."""
    if kind == "identity":
        return nn.Identity()
    if kind == "dense":
        return nn.Linear(rank, rank, bias=True, device=device, dtype=dtype)
    if kind == "kronecker":
        return KroneckerCrossing(rank, device=device, dtype=dtype)
    raise ValueError(f"crossing={kind!r} is unknown; allowed: {list(CROSSINGS)}")


def crossing_params(kind: str, rank: int, *, norm: bool = True) -> int:
    """Parameters LaX adds to a crossing layer: the crossing G (0, r² + r, or a² + b²) plus, with ``norm``, the
    LayerNorm's 2r."""
    check_crossing(kind)
    if kind == "kronecker":
        a, b = balanced_factors(rank)
        mixing = a * a + b * b
    else:
        mixing = {"identity": 0, "dense": rank * rank + rank}[kind]
    return mixing + (2 * rank if norm else 0)


def crossing_flops(kind: str, rank: int, *, tokens: int) -> int:
    """Matmul FLOPs of the crossing G on ``tokens`` latents: 0, 2r² per token (dense), 2r(a+b) (Kronecker)."""
    if kind == "identity":
        return 0
    if kind == "dense":
        return 2 * tokens * rank * rank
    a, b = balanced_factors(rank)
    return 2 * tokens * rank * (a + b)


class LatentStore:
    """The latest latent of every stream (``"layers.*.self_attn.q_proj"`` ...) during one forward pass."""

    def __init__(self) -> None:
        self.latents: dict[str, torch.Tensor] = {}

    def reset(self) -> None:
        self.latents.clear()

    def put(self, stream: str, latent: torch.Tensor) -> None:
        self.latents[stream] = latent

    def get(self, stream: str) -> torch.Tensor:
        if stream not in self.latents:
            raise RuntimeError(
                f"LaX stream {stream!r} has no latent from the previous block; call the whole model (whose forward "
                "pre-hook resets the store), and run blocks in order"
            )
        return self.latents[stream]


def _reset_store(module: nn.Module, *args: Any) -> None:
    # Looks the store up on the module (not in a closure) so that deep copies get their own store.
    module._lax_store.reset()


def ensure_store(model: nn.Module) -> LatentStore:
    """The model's :class:`LatentStore`, created with its reset hooks on first use."""
    store = getattr(model, "_lax_store", None)
    if store is None:
        store = LatentStore()
        model._lax_store = store
        model.register_forward_pre_hook(_reset_store)
        model.register_forward_hook(_reset_store)
    return store


def split_block_path(name: str) -> tuple[int, str] | None:
    """``"model.layers.3.mlp.up_proj"`` → ``(3, "model.layers.*.mlp.up_proj")``; None outside numbered blocks."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return int(part), ".".join([*parts[:i], "*", *parts[i + 1 :]])
    return None


def stream_neighbours(names: Iterable[str]) -> list[tuple[str, int, str, str | None]]:
    """``(name, block, stream, previous)`` for every name inside a numbered block (:func:`split_block_path`), where
    ``previous`` is the name of the same stream's layer in the block before (None where there is none)."""
    located = {name: split_block_path(name) for name in names}
    by_place = {loc: name for name, loc in located.items() if loc is not None}
    neighbours = []
    for name, loc in located.items():
        if loc is not None:
            block, stream = loc
            neighbours.append((name, block, stream, by_place.get((block - 1, stream))))
    return neighbours


class LatentStream:
    """A layer whose latent is one stream of a :class:`LatentStore`: it publishes its latent for the same stream's
    layer in the next block and reads the one of the block before (LaX layers, and LoRA adapters that cross).

    The layer calls :meth:`_init_stream` in its ``__init__``; its ``join`` calls :meth:`_join_stream`.
    """

    def _init_stream(self) -> None:
        self.stream: str | None = None
        self._store: LatentStore | None = None

    def _join_stream(self, store: LatentStore, stream: str) -> None:
        self._store, self.stream = store, stream

    def _previous_latent(self) -> torch.Tensor:
        """The latent the same stream's layer in the block before published during this forward pass."""
        return self._store.get(self.stream)

    def _publish(self, latent: torch.Tensor) -> torch.Tensor:
        """``latent``, published for the next block when the layer has joined a stream."""
        if self._store is not None:
            self._store.put(self.stream, latent)
        return latent


class LatentCrossing(LatentStream):
    """What every LaX layer adds to its factorization: the crossing ``σ(LN_r(z + G(h_prev)))`` of its latent ``z``
    (LaX §3), wired by :func:`attach_crossings` through a shared :class:`LatentStore`.

    The layer sets :attr:`latent_rank` (the width of ``z``) and calls :meth:`_init_crossing` in its ``__init__``.
    """

    latent_rank: int
    activation: str

    def _init_crossing(self, crossing: str, norm_eps: float) -> None:
        self.crossing_kind, self.norm_eps = crossing, norm_eps
        self.crossing: nn.Module | None = None
        self.norm: nn.LayerNorm | None = None
        self._init_stream()

    @property
    def crosses(self) -> bool:
        """Whether this layer adds the previous block's latent (False in block 0)."""
        return self.norm is not None

    def join(self, store: LatentStore, stream: str, *, cross: bool) -> None:
        """Publish this layer's latent to ``store`` under ``stream``; with ``cross`` also read the previous one."""
        self._join_stream(store, stream)
        if cross and not self.crosses:
            factor = next(self.parameters())  # type: ignore[attr-defined]
            factory = {"device": factor.device, "dtype": factor.dtype}
            self.crossing = make_crossing(self.crossing_kind, self.latent_rank, **factory)
            self.norm = nn.LayerNorm(self.latent_rank, eps=self.norm_eps, **factory)

    def _cross(self, latent: torch.Tensor) -> torch.Tensor:
        """``σ(LN(z + G(h_prev)))`` (or ``σ(z)`` in block 0), published for the next block. ``latent``: (..., r)."""
        if self.norm is not None:
            latent = self.norm(latent + self.crossing(self._previous_latent()))
        return self._publish(activation_fn(self.activation)(latent))


class LaXLinear(LatentCrossing, LowRankLinear):
    """``y = B σ(LN_r(A x + G(h_prev))) + b`` (crossing) or ``B σ(A x) + b`` (first block); LaX §3.

    Same ``weight_a``/``weight_b``/``bias`` as :class:`LowRankLinear`; a crossing layer adds ``crossing`` (G) and
    ``norm``. Crossings are switched on by :func:`attach_crossings` (``convert_`` does it), which knows the block
    structure.

    Args:
        shape: ``in_features, out_features, rank`` as :class:`LowRankLinear`.
        crossing: the kind of crossing G used when the layer crosses.
        norm_eps: epsilon of LN_r.
        low_rank_args: ``bias``, ``activation``, ``device``, ``dtype`` as :class:`LowRankLinear`.
    """

    def __init__(self, *shape: int, crossing: str = "kronecker", norm_eps: float = 1e-6, **low_rank_args: Any) -> None:
        check_crossing(crossing)
        super().__init__(*shape, **low_rank_args)
        self._init_crossing(crossing, norm_eps)

    @property
    def latent_rank(self) -> int:
        """The width of the latent that crosses: the rank (as :attr:`LaXTTLinear.latent_rank` is its middle bond)."""
        return self.rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        latent = self._cross(F.linear(x, self.weight_a))  # (..., r)
        return F.linear(latent, self.weight_b, self.bias)  # (..., d_out)

    @classmethod
    def from_dense(cls, module: nn.Module, config: LowRankConfig | None = None) -> LaXLinear:
        """Factors as :meth:`LowRankLinear.from_dense` (SVD or CoLA init); the crossing comes later."""
        config = config or LaXSVDConfig()
        base = LowRankLinear.from_dense(module, config)
        shape = (base.in_features, base.out_features, base.rank)
        return crossing_layer(cls, base, shape, config, activation=base.activation, take=("weight_a", "weight_b"))

    def to_dense(self) -> nn.Linear:
        if self.crosses:
            raise ValueError("to_dense() is undefined for a crossing LaX layer: its output depends on h_prev")
        return super().to_dense()

    def num_params(self) -> int:
        extra = crossing_params(self.crossing_kind, self.rank) if self.crosses else 0
        return super().num_params() + extra

    def flops(self, tokens: int) -> int:
        """Matmul FLOPs: the factors plus the crossing (dense: 2r² per token; Kronecker: 2r(a+b) per token)."""
        extra = crossing_flops(self.crossing_kind, self.rank, tokens=tokens) if self.crosses else 0
        return super().flops(tokens) + extra

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, crossing={self.crossing_kind!r}, crosses={self.crosses}"


def crossing_layer(
    cls: type[nn.Module],
    base: nn.Module,
    shape: tuple[Any, ...],
    config: object,
    *,
    activation: str,
    take: tuple[str, ...],
) -> nn.Module:
    """A LaX layer ``cls(*shape)`` on the meta device that takes over ``base``'s factors (the attributes ``take``
    and the bias): the factorization is ``base``'s own; the crossing, from ``config``'s kind and epsilon (LaX's
    defaults where the config has none), is switched on later by :func:`attach_crossings`."""
    layer = cls(
        *shape,
        bias=base.bias is not None,
        activation=activation,
        crossing=getattr(config, "crossing", "kronecker"),
        norm_eps=getattr(config, "norm_eps", 1e-6),
        device="meta",
    )
    for name in (*take, "bias"):
        setattr(layer, name, getattr(base, name))
    return layer


def attach_crossings(model: nn.Module, layer_type: type[nn.Module] = LaXLinear) -> dict[str, int]:
    """Wire every ``layer_type`` layer of ``model`` (:class:`LaXLinear`, or
    :class:`~tensorslim.layers.lax_tt.LaXTTLinear`) to a shared :class:`LatentStore`.

    A layer crosses iff a layer of the same type and stream (same path with the block index replaced by ``*``)
    exists in the block before it. Installs forward pre/post hooks on ``model`` that clear the store.

    Returns:
        ``{qualified name: block index}`` of the crossing layers.

    Raises:
        ValueError: a stream whose latent rank changes between consecutive blocks.
    """
    layers = {name: m for name, m in model.named_modules() if isinstance(m, layer_type)}
    store = ensure_store(model)
    crossing: dict[str, int] = {}
    for name, block, stream, previous in stream_neighbours(layers):
        layer = layers[name]
        if previous is not None and layers[previous].latent_rank != layer.latent_rank:
            raise ValueError(
                f"latent rank mismatch in LaX stream {stream!r}: block {block - 1} has r={layers[previous].latent_rank}"
                f", block {block} has r={layer.latent_rank}; allowed: equal latent ranks along a stream"
            )
        layer.join(store, stream, cross=previous is not None)
        if previous is not None:
            crossing[name] = block
    return crossing


def plan_lax(name: str, module: nn.Module, config: LaXConfig) -> LayerReport:
    """``convert_``'s report row; counts the crossing when the layer sits in a numbered block > 0 (an estimate that
    :func:`finalize_lax` corrects to the built model)."""
    row = plan_low_rank(name, module, config)
    loc = split_block_path(name)
    if loc is None or loc[0] == 0:
        return row
    return dataclasses.replace(row, params_after=row.params_after + crossing_params(config.crossing, row.rank))


def finalize_lax(model: nn.Module, config: LaXConfig, report: ConversionReport) -> None:
    """``convert_``'s model-level step: CoLA's ``only_lr_act``, the crossings, exact parameter books."""
    drop_glu_activation(model, config, report)
    attach_crossings(model)
    report.layers[:] = [
        dataclasses.replace(row, params_after=model.get_submodule(row.name).num_params()) for row in report.layers
    ]


def describe_lax(model: nn.Module, name: str, layer: LaXLinear) -> tuple[LaXConfig, dict[str, Any]]:
    """The config that rebuilds ``layer``; the state records whether it crosses (``convert_`` attaches crossings)."""
    config_type = {"silu": LaXCoLAConfig, "identity": LaXSVDConfig}.get(layer.activation, LaXConfig)
    fields = low_rank_fields(model, name, layer)
    return config_type(**fields, crossing=layer.crossing_kind, norm_eps=layer.norm_eps), {"crosses": layer.crosses}


register_transform(
    LaXConfig,
    Transform(
        is_dense_linear, plan_lax, LaXLinear.from_dense, finalize_lax, layer_type=LaXLinear, describe=describe_lax
    ),
)
