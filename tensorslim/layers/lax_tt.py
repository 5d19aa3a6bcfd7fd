"""LaX-TT: latent crossing for CoMERA's tensor-train linear layers, with optional intra-layer residuals.

LaX, "Boosting Low-Rank Training of Foundation Models via Latent Crossing" (arXiv 2505.21732), §3 "The LaX Method"
and "Variants of LaX" (the TT variant), as the official ViT code implements it (``K1seki221/Latent_Crossing``,
``vits_pretraining/timm/models/lax_vit.py``, ``TensorizedLinear``). The TT layer is
:class:`tensorslim.layers.tt.TTLinear` (CoMERA layout: input-mode cores first, ``W = L·R``).

**The latent of a TT layer** is the rank bond between the input-mode half and the output-mode half of the chain,
``r_mid = ranks[n_in]`` (the official code takes ``ranks[len(ranks)//2]``, the same bond when both halves have
equal core counts). It is the only bond where the intermediate is one r-vector per token: ``z = x·L`` with
``L = G_1 ⋯ G_d ∈ R^{d_in×r_mid}``. Inter-layer crossing (``InterRes``) acts there, exactly as in
:mod:`tensorslim.layers.lax`::

    z = LN_r(x·L + G(h_prev))      in block i > 0 (block 0: z = x·L, no crossing, no LayerNorm)
    h = σ(z)                        σ = identity in the paper's LaX-TT configs (``LatentAct: False``); h goes on
    y = h·R + b

**Intra-layer residuals** (``IntraRes``): the left half is contracted core by core; after ``j`` input cores the
intermediate is ``(B, n_{j+1}⋯n_d, r_j)``. The right half is also contracted core by core from the latent, and
after ``i`` output cores its intermediate ``(B, n_{d+1}⋯n_{d+i}, r_{d+i})`` receives the left intermediate with
``j = d − i`` (official ``RightHalfContractionIntra``: the list is reversed, so the last left step meets the first
right step). The official ungated add needs identical shapes (its configs use mirrored modes, ``[32,24 ‖ 24,32]``).
**Our generalization:** we require equal mode *products* and equal ranks and add after flattening the modes
row-major, which is the official add whenever the mode tuples are identical. The paper's LaX-TT configs turn intra
residuals on for q, k, v and the attention output only, and leave them ungated (``IntraResGate: False``); the
official gated intra path only runs for 4 cores (the 6-core call passes an extra argument), so we do not offer it.

Neither path forms the full weight: the crossing-only path uses the tiny half-products ``L`` and ``R``; the
intra-residual path contracts the token tensor through the cores one at a time (as the official code does).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tensorslim.functional.lowrank import ACTIVATIONS, activation_fn
from tensorslim.functional.tt import tt_linear_factors, tt_linear_flops
from tensorslim.layers._source import is_dense_linear
from tensorslim.layers.lax import (
    LatentCrossing,
    attach_crossings,
    check_crossing,
    crossing_flops,
    crossing_layer,
    crossing_params,
    split_block_path,
)
from tensorslim.layers.tt import TTConfig, TTLinear, plan_tt_linear, restore_tt, tt_fields
from tensorslim.registry import ConversionReport, LayerReport, Transform, register_transform


@dataclass(frozen=True, kw_only=True)
class LaXTTConfig(TTConfig):
    """TT layers (CoMERA layout) with LaX crossing at the middle bond (LaX §3, "Variants of LaX").

    Attributes:
        crossing: the kind of crossing G on the r_mid-dim latent: ``"kronecker"`` (the paper's configs),
            ``"dense"`` or ``"identity"``.
        norm_eps: epsilon of the r_mid-dimensional LayerNorm (1e-6 in the official code).
        activation: latent activation after the crossing; ``"identity"`` as the official LaX-TT configs.
        intra_res: last name components of the layers that also get intra-layer residuals (the official LaX-TT
            configs: the attention projections); each must have mirrored halves (see the module docstring).
    """

    crossing: str = "kronecker"
    norm_eps: float = 1e-6
    activation: str = "identity"
    intra_res: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        check_crossing(self.crossing)
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps={self.norm_eps!r} is invalid; allowed: a number > 0")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r} is not supported; allowed: {sorted(ACTIVATIONS)}")
        if isinstance(self.intra_res, str) or not all(isinstance(n, str) and n for n in self.intra_res):
            raise ValueError(f"intra_res={self.intra_res!r} is invalid; allowed: a tuple of layer names")


def intra_pairs(
    in_factors: tuple[int, ...], out_factors: tuple[int, ...], ranks: tuple[int, ...]
) -> list[tuple[int, int]]:
    """``(i, j)`` pairs of the intra residual: after ``i`` output cores add the left intermediate after ``j = d − i``
    input cores, for ``i = 1 … min(d_in_cores, d_out_cores) − 1``.

    Raises:
        ValueError: no pair exists, or a pair's mode products or ranks differ.
    """
    n_in, n_out = len(in_factors), len(out_factors)
    pairs = [(i, n_in - i) for i in range(1, min(n_in, n_out))]
    if not pairs:
        raise ValueError(f"intra_res needs >= 2 cores on each side; got modes {list(in_factors)}|{list(out_factors)}")
    for i, j in pairs:
        left, right = math.prod(in_factors[j:]), math.prod(out_factors[:i])
        if left != right or ranks[j] != ranks[n_in + i]:
            raise ValueError(
                f"intra_res needs mirrored halves: modes {list(in_factors)}|{list(out_factors)}, ranks {list(ranks)} "
                f"pair {n_in - j} input cores left ({left}, r={ranks[j]}) with {i} output cores ({right}, "
                f"r={ranks[n_in + i]}); allowed: equal mode products and ranks"
            )
    return pairs


def left_half_steps(x: torch.Tensor, cores: list[torch.Tensor]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """Contract ``x (B, d_in)`` through the input cores one at a time (official ``LeftHalfContractionIntra``).

    Returns:
        the latent ``(B, r_mid)`` and ``{j: (B, n_{j+1}⋯n_d, r_j)}``, the intermediate after ``j`` cores.
    """
    batch = x.shape[0]
    state = x.reshape(batch, -1, 1)  # (B, M, r_0 = 1) with M = the input modes still to contract
    steps: dict[int, torch.Tensor] = {}
    for j, core in enumerate(cores, start=1):
        r0, n, r1 = core.shape
        state = state.reshape(batch, n, state.shape[1] // n, r0)  # (B, n_j, M', r_{j-1})
        state = torch.einsum("bnmr,rns->bms", state, core)  # (B, M', r_j)
        steps[j] = state
    return state.reshape(batch, -1), steps


def right_half_steps(latent: torch.Tensor, cores: list[torch.Tensor], skips: dict[int, torch.Tensor]) -> torch.Tensor:
    """Contract ``latent (B, r_mid)`` through the output cores, adding ``skips[i] (B, P_i, r)`` after ``i`` cores
    (official ``RightHalfContractionIntra``). Returns ``(B, d_out)``."""
    batch = latent.shape[0]
    state = latent.unsqueeze(1)  # (B, P = 1, r_mid)
    for i, core in enumerate(cores, start=1):
        r0, n, r1 = core.shape
        state = (state.reshape(-1, r0) @ core.reshape(r0, n * r1)).reshape(batch, -1, r1)  # (B, P·n_i, r_i)
        if i in skips:
            state = state + skips[i].reshape(state.shape)
    return state.reshape(batch, -1)


def intra_flops(
    in_factors: tuple[int, ...], out_factors: tuple[int, ...], ranks: tuple[int, ...], *, tokens: int
) -> int:
    """Matmul FLOPs of the core-by-core path: ``2·B·M·n·r_{k-1}·r_k`` per step (left) and ``2·B·P·r_{k-1}·n·r_k``
    (right), with ``M`` the input modes left after the step and ``P`` the output modes before it."""
    total, rest = 0, math.prod(in_factors)
    for k, n in enumerate(in_factors):
        rest //= n
        total += 2 * tokens * rest * n * ranks[k] * ranks[k + 1]
    produced, n_in = 1, len(in_factors)
    for k, n in enumerate(out_factors):
        total += 2 * tokens * produced * ranks[n_in + k] * n * ranks[n_in + k + 1]
        produced *= n
    return total


class LaXTTLinear(LatentCrossing, TTLinear):
    """A :class:`TTLinear` whose middle-bond latent crosses to the same layer type in the next block (LaX §3).

    Same ``cores``/``gates`` (CoMERA's rank gates)/``bias`` as :class:`TTLinear`; a crossing layer adds
    ``crossing`` (G) and ``norm`` (on ``r_mid``). Crossings are switched on by
    :func:`~tensorslim.layers.lax.attach_crossings` (``convert_`` does it).

    Args:
        shape: ``in_factors, out_factors, ranks`` as :class:`TTLinear`.
        activation: latent activation σ (official LaX-TT: identity).
        crossing: the kind of crossing G used when the layer crosses.
        norm_eps: epsilon of LN_r.
        intra_res: add the intra-layer residuals (needs mirrored halves, see :func:`intra_pairs`).
        tt_args: ``bias``, ``device``, ``dtype`` as :class:`TTLinear`.
    """

    def __init__(
        self,
        *shape: tuple[int, ...],
        activation: str = "identity",
        crossing: str = "kronecker",
        norm_eps: float = 1e-6,
        intra_res: bool = False,
        **tt_args: Any,
    ) -> None:
        check_crossing(crossing)
        activation_fn(activation)  # validates the name
        super().__init__(*shape, **tt_args)
        self.activation = activation
        self.intra_res = False
        if intra_res:
            self.enable_intra_res()
        self._init_crossing(crossing, norm_eps)

    @property
    def latent_rank(self) -> int:
        """``r_mid``: the bond between the input-mode and output-mode halves, where the latent lives."""
        return self.ranks[self.n_in]

    def enable_intra_res(self) -> None:
        """Switch on the intra-layer residuals (no parameters); raises ``ValueError`` unless the halves mirror."""
        intra_pairs(self.in_factors, self.out_factors, self.ranks)
        self.intra_res = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cores = self.effective_cores()
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)  # (B, d_in)
        if self.intra_res:
            latent, steps = left_half_steps(x2, cores[: self.n_in])  # (B, r_mid)
            skips = {i: steps[j] for i, j in intra_pairs(self.in_factors, self.out_factors, self.ranks)}
            out = right_half_steps(self._cross(latent), cores[self.n_in :], skips)  # (B, d_out)
        else:
            left, right = tt_linear_factors(cores, n_in=self.n_in)  # (d_in, r_mid), (r_mid, d_out): tiny
            out = self._cross(x2 @ left) @ right  # (B, d_out)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*lead, self.out_features)

    @classmethod
    def from_dense(cls, module: nn.Module, config: TTConfig | None = None) -> LaXTTLinear:
        """Cores as :meth:`TTLinear.from_dense` (TT-SVD or CoMERA's random init); crossings come later."""
        config = config or LaXTTConfig()
        base = TTLinear.from_dense(module, config)
        shape = (base.in_factors, base.out_factors, base.ranks)
        activation = getattr(config, "activation", "identity")
        take = ("cores", "gates", "gate_threshold")
        return crossing_layer(cls, base, shape, config, activation=activation, take=take)

    def to_dense(self) -> nn.Linear:
        if self.crosses or self.intra_res or self.activation != "identity":
            raise ValueError(
                "to_dense() is undefined for a LaX-TT layer with crossing, intra_res or a latent activation"
            )
        return super().to_dense()

    def num_params(self) -> int:
        """TT parameters plus the crossing and LayerNorm of a crossing layer (intra residuals have none)."""
        extra = crossing_params(self.crossing_kind, self.latent_rank) if self.crosses else 0
        return super().num_params() + extra

    def flops(self, tokens: int) -> int:
        """Matmul FLOPs: the TT path (half-products, or core by core with ``intra_res``) plus the crossing."""
        if self.intra_res:
            base = intra_flops(self.in_factors, self.out_factors, self.ranks, tokens=tokens)
        else:
            base = tt_linear_flops(self.in_factors, self.out_factors, self.ranks, tokens=tokens)
        extra = crossing_flops(self.crossing_kind, self.latent_rank, tokens=tokens) if self.crosses else 0
        return base + extra

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, activation={self.activation!r}, crossing={self.crossing_kind!r}, "
            f"crosses={self.crosses}, intra_res={self.intra_res}"
        )


def _wants_intra(name: str, config: LaXTTConfig) -> bool:
    return name.rsplit(".", 1)[-1] in config.intra_res


def plan_lax_tt(name: str, module: nn.Module, config: LaXTTConfig) -> LayerReport:
    """``convert_``'s report row: the TT row, checked for ``intra_res``, plus the crossing in blocks > 0 (an
    estimate that :func:`finalize_lax_tt` replaces by the built layer's count)."""
    row = plan_tt_linear(name, module, config)
    d_in, d_out = row.old_shape
    in_factors, out_factors, ranks = config.resolve(d_in, d_out)
    if _wants_intra(name, config):
        try:
            intra_pairs(in_factors, out_factors, ranks)
        except ValueError as error:
            raise ValueError(f"layer {name!r}: {error}") from None
    loc = split_block_path(name)
    if loc is None or loc[0] == 0:
        return row
    added = crossing_params(config.crossing, ranks[len(in_factors)])
    return dataclasses.replace(row, params_after=row.params_after + added)


def finalize_lax_tt(model: nn.Module, config: LaXTTConfig, report: ConversionReport) -> None:
    """``convert_``'s model-level step: intra residuals on the named layers, crossings, exact books."""
    converted = {row.name for row in report.layers}
    for name in converted:
        if _wants_intra(name, config):
            model.get_submodule(name).enable_intra_res()
    attach_crossings(model, LaXTTLinear)
    report.layers[:] = [
        dataclasses.replace(row, params_after=model.get_submodule(row.name).num_params()) for row in report.layers
    ]


def describe_lax_tt(model: nn.Module, name: str, layer: LaXTTLinear) -> tuple[LaXTTConfig, dict[str, Any]]:
    """The config that rebuilds ``layer`` (its intra-layer residual named by the layer's own name), its rank-gate
    threshold and whether it crosses (``convert_`` attaches crossings)."""
    config = LaXTTConfig(
        **tt_fields(layer),
        crossing=layer.crossing_kind,
        norm_eps=layer.norm_eps,
        activation=layer.activation,
        intra_res=(name.rsplit(".", 1)[-1],) if layer.intra_res else (),
    )
    return config, {"gate_threshold": layer.gate_threshold, "crosses": layer.crosses}


register_transform(
    LaXTTConfig,
    Transform(
        is_dense_linear,
        plan_lax_tt,
        LaXTTLinear.from_dense,
        finalize_lax_tt,
        layer_type=LaXTTLinear,
        describe=describe_lax_tt,
        restore=restore_tt,
    ),
)
