"""Low-rank linear layers: CoLA's bottleneck auto-encoder and plain truncated-SVD factorization.

CoLA: Liu et al., 2025, "CoLA: Compute-Efficient Pre-Training of LLMs via Low-Rank Activation" (arXiv 2502.10940),
§3: every projection ``W x`` becomes ``B σ(A x)`` with σ = SiLU, rank r = d/4 by default.

Rank gates (our extension, not in CoLA): CoMERA's diagonal rank controls (Yang et al., NeurIPS 2024, arXiv 2405.14377,
§3), defined there per TT bond, put on CoLA's one bond, the rank-r latent: ``y = B (thr(g) ⊙ σ(A x))`` with
``thr(g) = g if g > threshold else 0``. A :class:`LowRankLinear` is the two-core TT ``[[A^T, B^T]]`` with modes
``(d_in, d_out)`` and ranks ``(1, r, 1)``, so CoMERA's size, penalty and truncation apply unchanged
(:mod:`tensorslim.methods.comera.gates`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim._checks import check_fields
from tensorslim.budget import Budget, RankChoices, dense_linear_flops
from tensorslim.decomp.svd import squared_singular_values, truncated_svd, whitened_svd, whitened_truncation
from tensorslim.functional.lowrank import ACTIVATIONS, low_rank_linear
from tensorslim.layers._source import (
    allocate_ranks,
    dense_linear,
    is_dense_linear,
    linear_shape,
    linear_weight,
    replacement_report,
    require_weights,
    resolve_for,
    uniform_bias_,
)
from tensorslim.layers.tt import GATE_THRESHOLD
from tensorslim.registry import Allocation, ConversionReport, LayerReport, Transform, register_transform

if TYPE_CHECKING:
    from tensorslim.compression.calibration import Calibration

Init = Literal["svd", "random"]
# A conversion whose relative error ‖W − W'‖/‖W‖ (with calibration: ‖(W − W')X‖/‖WX‖), pooled over its layers,
# passes this prints one warning. On the pretrained MiniLM, SVDConfig(rank_ratio=0.6) pooled 0.28 and kept 0.73
# embedding cosine to the original; rank_ratio=0.9 kept 0.94.
LOSSY_ERROR = 0.2


@dataclass(frozen=True, kw_only=True)
class LowRankConfig:
    """How ``convert_`` turns a dense linear layer into a :class:`LowRankLinear`.

    Attributes:
        rank: the latent size r; when None (and no budget), ``round(rank_ratio · min(d_in, d_out))``.
        rank_ratio: used only when ``rank`` and ``budget`` are None, in (0, 1].
        budget: a :class:`~tensorslim.budget.Budget` (e.g. ``Budget(params=0.5)``) from which ``convert_``/``plan``
            choose one rank per layer (by the singular-value spectra for ``init="svd"``, else uniformly); excludes
            ``rank``.
        activation: latent nonlinearity σ (``identity`` gives the classic SVD factorization).
        init: ``"svd"`` initializes from the dense weights by truncated SVD (for pretrained models);
            ``"random"`` uses CoLA's initialization (CoLA §2.1) for training from scratch.
        only_lr_act: CoLA's ``only_lr_act`` switch: when True, the gated MLPs of LLaMA-style blocks (modules with
            ``gate_proj``, ``up_proj``, ``down_proj`` and ``act_fn``) drop their own gate activation, because the
            latent activations supply the nonlinearity. The CoLA configs set it for 350M and larger.
        rank_gates: attach a rank gate to the latent at construction (CoMERA's rank controls, arXiv 2405.14377 §3,
            on CoLA's latent; see :meth:`LowRankLinear.enable_gates`). Only :class:`LowRankConfig`,
            :class:`CoLAConfig` and :class:`SVDConfig` build gated layers.
        calibration: a :class:`~tensorslim.compression.calibration.Calibration` of the model (from
            :func:`tensorslim.compression.calibrate`): ``init="svd"`` then truncates the input-whitened SVD (SVD-LLM,
            arXiv 2403.07378, §3.1), which minimizes each layer's output error on the calibration inputs, and a
            budget water-fills those output errors instead of the weight spectra. Only :class:`LowRankConfig`,
            :class:`CoLAConfig` and :class:`SVDConfig` use it.
    """

    rank: int | None = None
    rank_ratio: float = 0.25
    budget: Budget | None = None
    activation: str = "identity"
    init: Init = "svd"
    only_lr_act: bool = False
    rank_gates: bool = False
    calibration: Calibration | None = None

    def __post_init__(self) -> None:
        check_fields(self)
        if self.rank is not None and (isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1):
            raise ValueError(f"rank={self.rank!r} is invalid; allowed: None or an integer >= 1")
        if not isinstance(self.rank_ratio, int | float) or not 0 < self.rank_ratio <= 1:
            raise ValueError(f"rank_ratio={self.rank_ratio!r} is invalid; allowed: a number in (0, 1]")
        if self.budget is not None and not isinstance(self.budget, Budget):
            raise ValueError(f"budget={self.budget!r} is invalid; allowed: None or a Budget, e.g. Budget(params=0.5)")
        if self.budget is not None and self.rank is not None:
            raise ValueError(f"rank={self.rank} and budget={self.budget} both given; allowed: one of them")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r} is not supported; allowed: {sorted(ACTIVATIONS)}")
        if self.init not in ("svd", "random"):
            raise ValueError(f"init={self.init!r} is invalid; allowed: 'svd' or 'random'")
        if not isinstance(self.rank_gates, bool):
            raise ValueError(f"rank_gates={self.rank_gates!r} is invalid; allowed: True or False")
        if self.calibration is not None and not hasattr(self.calibration, "whitener"):
            raise ValueError(
                f"calibration={self.calibration!r} is invalid; allowed: None or tensorslim.compression.calibrate(...)"
            )
        if self.calibration is not None and (type(self) not in _GATEABLE_CONFIGS or self.init != "svd"):
            raise ValueError(
                f"calibration is not supported by {type(self).__name__}(init={self.init!r}); allowed: LowRankConfig, "
                "CoLAConfig or SVDConfig with init='svd'"
            )
        if self.rank_gates and type(self) not in _GATEABLE_CONFIGS:
            raise ValueError(
                f"rank_gates=True is not supported by {type(self).__name__}; allowed: LowRankConfig, CoLAConfig, "
                "SVDConfig"
            )

    def resolve_rank(self, d_in: int, d_out: int) -> int:
        """The rank for a ``d_in → d_out`` layer; raises ``ValueError`` if it exceeds ``min(d_in, d_out)``."""
        if self.budget is not None:
            raise ValueError("a budget chooses ranks across a model's layers; allowed: convert_/plan, or rank=")
        limit = min(d_in, d_out)
        rank = self.rank if self.rank is not None else max(1, round(self.rank_ratio * limit))
        if rank > limit:
            raise ValueError(f"rank={rank} is out of range for a {d_in}->{d_out} layer; allowed 1..{limit}")
        return rank


@dataclass(frozen=True, kw_only=True)
class CoLAConfig(LowRankConfig):
    """CoLA (arXiv 2502.10940 §3): ``y = B·SiLU(A x)``, r = d/4 by default."""

    activation: str = "silu"


@dataclass(frozen=True, kw_only=True)
class SVDConfig(LowRankConfig):
    """Plain low rank ``y = B A x`` (σ = identity), initialized by truncated SVD."""

    activation: str = "identity"


_GATEABLE_CONFIGS = (LowRankConfig, CoLAConfig, SVDConfig)


def _store_r_major(weight_b: torch.Tensor | None, *, r_major: bool) -> None:
    """Store ``weight_b (d_out, r)`` as the transposed view of a contiguous ``(r, d_out)`` tensor (``r_major``) or
    contiguous, in place of its data; only plain CPU parameters (not sharded, meta or fake ones)."""
    if (
        not isinstance(weight_b, nn.Parameter)
        or type(weight_b.data) is not torch.Tensor
        or weight_b.device.type != "cpu"
        or weight_b.dim() != 2
        or min(weight_b.shape) < 2
    ):
        return
    data = weight_b.data
    if r_major and data.is_contiguous():
        weight_b.data = data.t().contiguous().t()  # (d_out, r), strides (1, d_out)
    elif not r_major and not data.is_contiguous():
        weight_b.data = data.contiguous()


class LowRankLinear(nn.Module):
    """``y = B σ(A x) + b`` with ``A ∈ R^{r×d_in}``, ``B ∈ R^{d_out×r}``; the product ``B A`` is never formed.

    With a rank gate (:meth:`enable_gates`): ``y = B (thr(g) ⊙ σ(A x)) + b``, computed as ``(B·diag(thr(g))) σ(A x)``
    (the gate scales B's columns: ``d_out·r`` multiplies instead of ``tokens·r``).

    Args:
        in_features: d_in.
        out_features: d_out.
        rank: r.
        bias: whether to learn an additive bias.
        activation: σ, ``"silu"`` for CoLA, ``"identity"`` for SVD-style low rank.

    Attributes:
        gate: the rank gate ``g`` (shape ``(r,)``), or None until :meth:`enable_gates`.
        gate_threshold: a gate at or below this value is a pruned rank (CoMERA: 1e-2).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        rank: int,
        *,
        bias: bool = False,
        activation: str = "identity",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation={activation!r} is not supported; allowed: {sorted(ACTIVATIONS)}")
        if not 1 <= rank <= min(in_features, out_features):
            raise ValueError(f"rank={rank} is out of range; allowed 1..{min(in_features, out_features)}")
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        self.activation = activation
        factory = {"device": device, "dtype": dtype}
        self.weight_a = nn.Parameter(torch.empty(rank, in_features, **factory))
        self.weight_b = nn.Parameter(torch.empty(out_features, rank, **factory))
        self.bias = nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        self.register_parameter("gate", None)
        self.gate_threshold = GATE_THRESHOLD
        # (squared error, squared norm) of the approximation built by from_dense: weights, or outputs when calibrated
        self.conversion_error: tuple[float, float] | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """CoLA init (official ``ColaLayer``): both factors ~ N(0, σ²), σ = r^{-1/4}(d_in+d_out)^{-1/4}.

        The linear product then has entry variance 1/(d_in+d_out), half of Xavier-normal.
        """
        std = self.rank**-0.25 * (self.in_features + self.out_features) ** -0.25
        with torch.no_grad():
            self.weight_a.normal_(0.0, std)
            self.weight_b.normal_(0.0, std)
            if self.gated:
                self.gate.fill_(1.0)
        uniform_bias_(self.bias, self.out_features)

    @property
    def gated(self) -> bool:
        """Whether a rank gate is attached (subclasses built without ``__init__`` have none)."""
        return self._parameters.get("gate") is not None

    def enable_gates(self, *, threshold: float = GATE_THRESHOLD) -> None:
        """Attach an all-ones rank gate to the latent (CoMERA's rank controls, arXiv 2405.14377 §3); idempotent.

        Raises:
            ValueError: the layer is a subclass with its own forward (CoLA-M, LaX), which would ignore the gate.
        """
        if type(self).forward is not LowRankLinear.forward:
            raise ValueError(f"rank gates are not supported by {type(self).__name__}; allowed: LowRankLinear")
        self.gate_threshold = threshold
        if not self.gated:
            self.gate = nn.Parameter(torch.ones(self.rank, device=self.weight_b.device, dtype=self.weight_b.dtype))

    def gated_weight_b(self) -> torch.Tensor:
        """``B·diag(thr(g))`` (``B`` itself without a gate); dead ranks are exact zero columns."""
        if not self.gated:
            return self.weight_b
        return self.weight_b * F.threshold(self.gate, self.gate_threshold, 0.0)  # (d_out, r)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return low_rank_linear(x, self.weight_a, self.gated_weight_b(), self.bias, activation=self.activation)

    def train(self, mode: bool = True) -> LowRankLinear:
        """Training or eval mode; on CPU the mode also picks how ``B`` lies in memory (its values never change).

        In eval mode ``B (d_out, r)`` is stored ``r``-major, as the transposed view of a contiguous ``(r, d_out)``
        tensor. Decoding one token multiplies each ``B`` by one latent vector, and BLAS reads ``B``'s short rows
        (``r`` elements) at about half the memory bandwidth that it reaches on the ``r``-major layout: at ``350m`` that
        made ``B`` most of a CoLA token's time (2-core AMD EPYC). Training mode brings back the
        contiguous layout that the optimizer's state was made for. Each switch copies ``B`` once.
        """
        super().train(mode)
        _store_r_major(self.weight_b, r_major=not mode)
        return self

    @classmethod
    def from_dense(cls, module: nn.Module, config: LowRankConfig | None = None) -> LowRankLinear:
        """Build from an ``nn.Linear`` or GPT-2 ``Conv1D``.

        With ``config.init == "svd"`` (the default) the factors are the truncated SVD of the dense weight, so at
        full rank with σ = identity the layer reproduces the dense one exactly; the bias is copied.
        """
        config = config or SVDConfig()
        d_in, d_out = linear_shape(module)
        weight, bias = linear_weight(module)
        layer = cls(
            d_in,
            d_out,
            config.resolve_rank(d_in, d_out),
            bias=bias is not None,
            activation=config.activation,
            device=weight.device,
            dtype=weight.dtype,
        )
        if config.rank_gates:
            layer.enable_gates()
        if config.init == "svd":
            require_weights(weight, "svd")
            calibration = config.calibration
            if calibration is None:
                weight_a, weight_b = truncated_svd(weight, layer.rank)
            else:
                weight_a, weight_b = whitened_truncation(weight, calibration.whitener(module), layer.rank)
            with torch.no_grad():
                layer.weight_a.copy_(weight_a)
                layer.weight_b.copy_(weight_b)
                if bias is not None:
                    layer.bias.copy_(bias)
            layer.conversion_error = _squared_errors(module, weight_b @ weight_a, calibration)
        return layer

    def to_dense(self) -> nn.Linear:
        """The equivalent ``nn.Linear`` (``W = B·diag(thr(g))·A``); exact only when σ is the identity."""
        if self.activation != "identity":
            raise ValueError(
                f"to_dense() is exact only for activation='identity'; this layer uses {self.activation!r}, "
                "whose B·σ(A·x) has no dense equivalent"
            )
        with torch.no_grad():
            return dense_linear(self.gated_weight_b() @ self.weight_a, self.bias)

    @staticmethod
    def count_params(in_features: int, out_features: int, rank: int, *, bias: bool, gates: bool = False) -> int:
        """Parameters of a layer of this shape: ``r (d_in + d_out)`` (+ ``d_out`` for the bias, + ``r`` for a gate)."""
        return rank * (in_features + out_features) + (out_features if bias else 0) + (rank if gates else 0)

    def num_params(self) -> int:
        """Parameters of factors, gate and bias, i.e. ``sum(p.numel() for p in self.parameters())``."""
        bias = self.bias is not None
        return self.count_params(self.in_features, self.out_features, self.rank, bias=bias, gates=self.gated)

    @staticmethod
    def count_flops(in_features: int, out_features: int, rank: int, *, tokens: int) -> int:
        """Forward matmul FLOPs of a layer of this shape on ``tokens`` input rows, as ``torch.utils.flop_counter``
        counts them (2 per multiply-add; the bias add and σ are elementwise and not counted)."""
        return 2 * tokens * rank * (in_features + out_features)

    def flops(self, tokens: int) -> int:
        """Forward matmul FLOPs for ``tokens`` input rows (see :meth:`count_flops`)."""
        return self.count_flops(self.in_features, self.out_features, self.rank, tokens=tokens)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}, "
            f"activation={self.activation!r}, bias={self.bias is not None}, gates={self.gated}"
        )


def plan_low_rank(name: str, module: nn.Module, config: LowRankConfig) -> LayerReport:
    """The ``convert_`` report row for replacing a dense linear layer by a :class:`LowRankLinear` (nothing built)."""
    d_in, d_out = linear_shape(module)
    rank = resolve_for(name, module, config.resolve_rank)
    return replacement_report(
        name,
        module,
        new_shape=f"{d_in}->{rank}->{d_out}",
        rank=rank,
        params_after=LowRankLinear.count_params(
            d_in, d_out, rank, bias=module.bias is not None, gates=config.rank_gates
        ),
    )


def low_rank_choices(name: str, module: nn.Module, config: LowRankConfig, *, spectrum: bool) -> RankChoices:
    """A dense linear layer's cost at each rank 1..min(d_in, d_out) as a :class:`LowRankLinear` under
    ``config.budget``, and the squared error each rank step removes when ``spectrum``: ``σ_{r+1}²`` of the weight
    (Eckart–Young), or with ``config.calibration`` of the whitened weight ``W S``, which is the squared output error
    on the calibration inputs (SVD-LLM, arXiv 2403.07378, Theorem 3.2), divided by the layer's squared output norm
    ``‖W X‖²``."""
    budget = config.budget
    d_in, d_out = linear_shape(module)
    has_bias = module.bias is not None
    ranks = range(1, min(d_in, d_out) + 1)
    if budget.kind in ("params", "bytes"):
        size = linear_weight(module)[0].element_size() if budget.kind == "bytes" else 1
        costs = [LowRankLinear.count_params(d_in, d_out, r, bias=has_bias) * size for r in ranks]
        dense = (d_in * d_out + (d_out if has_bias else 0)) * size
    else:
        costs = [LowRankLinear.count_flops(d_in, d_out, r, tokens=budget.tokens) / budget.tokens for r in ranks]
        dense = dense_linear_flops(d_in, d_out)
    gains = None
    if spectrum:
        weight = linear_weight(module)[0]
        calibration = config.calibration
        if calibration is None:
            spectrum_sq = squared_singular_values(weight)
        else:
            # relative to the layer's own output energy: each layer's output error counts as a share of its signal
            # (our choice; absolute errors starved the small-output projections and lost embedding cosine on MiniLM)
            energy = max(calibration.output_energy(module, name=name), torch.finfo(torch.float64).tiny)
            spectrum_sq = whitened_svd(weight, calibration.whitener(module, name=name))[1] ** 2 / energy
        gains = spectrum_sq[1 : len(costs)].tolist()
    return RankChoices(costs, dense, gains)


def allocate_low_rank(model: nn.Module, candidates: list[tuple[str, nn.Module]], config: LowRankConfig) -> Allocation:
    """One rank per candidate layer under ``config.budget`` (see :mod:`tensorslim.budget`): water-filling of the
    weights' spectra for ``init="svd"`` on real weights, else the one uniform rank that fits."""
    return allocate_ranks(
        candidates,
        config,
        decomposing_init="svd",
        choices=lambda name, module, spectrum: low_rank_choices(name, module, config, spectrum=spectrum),
    )


def drop_glu_activation(model: nn.Module, config: LowRankConfig, report: ConversionReport) -> None:
    """CoLA's ``only_lr_act`` switch (the official CoLA configs, arXiv 2502.10940): gated MLPs (modules with
    ``act_fn``) whose ``gate_proj`` and ``up_proj`` both became low rank lose their own activation, because the
    latent activations supply the nonlinearity."""
    if not config.only_lr_act:
        return
    converted = {layer.name for layer in report.layers}
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if hasattr(module, "act_fn") and f"{prefix}gate_proj" in converted and f"{prefix}up_proj" in converted:
            module.act_fn = nn.Identity()


def drops_glu(model: nn.Module, name: str) -> bool:
    """Whether layer ``name`` sits in a gated MLP whose activation :func:`drop_glu_activation` dropped."""
    parent = model.get_submodule(name.rpartition(".")[0])
    return isinstance(getattr(parent, "act_fn", None), nn.Identity) and all(
        isinstance(getattr(parent, proj, None), LowRankLinear) for proj in ("gate_proj", "up_proj")
    )


def low_rank_fields(model: nn.Module, name: str, layer: LowRankLinear) -> dict[str, Any]:
    """The :class:`LowRankConfig` fields that rebuild the built ``layer`` (shared by the families built on it)."""
    return {
        "rank": layer.rank,
        "activation": layer.activation,
        "init": "random",
        "only_lr_act": drops_glu(model, name),
        "rank_gates": layer.gated,
    }


def describe_low_rank(model: nn.Module, name: str, layer: LowRankLinear) -> tuple[LowRankConfig, dict[str, Any]]:
    """The config that rebuilds ``layer``: CoLA's for a SiLU latent, SVD's for none, else the base config."""
    config_type = {"silu": CoLAConfig, "identity": SVDConfig}.get(layer.activation, LowRankConfig)
    return config_type(**low_rank_fields(model, name, layer)), {"gate_threshold": layer.gate_threshold}


def restore_low_rank(layer: LowRankLinear, state: dict[str, Any]) -> None:
    """Set the rank-gate threshold :func:`describe_low_rank` recorded (saves from before rank gates hold none)."""
    layer.gate_threshold = state.get("gate_threshold", GATE_THRESHOLD)


def _squared_errors(module: nn.Module, approx: torch.Tensor, calibration: Calibration | None) -> tuple[float, float]:
    """``(‖W − W'‖², ‖W‖²)`` of the approximation ``W'`` of ``module``'s weight, or with a calibration the same for
    the outputs on its inputs (``tr(ΔW G ΔWᵀ)``, ``tr(W G Wᵀ)``)."""
    if calibration is not None:
        return calibration.output_error(module, approx), calibration.output_energy(module)
    weight = linear_weight(module)[0].detach().to(torch.float64)
    return float((weight - approx.to(torch.float64)).square().sum()), float(weight.square().sum())


def warn_if_lossy(model: nn.Module, report: ConversionReport) -> None:
    """One warning line when the converted layers' pooled relative error ``√(Σ‖ΔW‖² / Σ‖W‖²)`` (of the outputs on
    the calibration inputs when calibrated) passes :data:`LOSSY_ERROR`, naming the worst layer and the remedies."""
    errors = {}
    for row in report.layers:
        error = getattr(model.get_submodule(row.name), "conversion_error", None)
        if error is not None:
            errors[row.name] = error
    if not errors:
        return
    pooled = math.sqrt(sum(e for e, _ in errors.values()) / max(sum(n for _, n in errors.values()), 1e-300))
    if pooled <= LOSSY_ERROR:
        return
    worst = max(errors, key=lambda name: errors[name][0] / max(errors[name][1], 1e-300))
    worst_error = math.sqrt(errors[worst][0] / max(errors[worst][1], 1e-300))
    warnings.warn(
        f"{report.method} changed the converted layers by a relative error of {pooled:.2f} (worst {worst!r}: "
        f"{worst_error:.2f}); the model may have lost most of its quality: calibrate (SVDConfig(calibration=...)), "
        "raise the rank, or use tensorslim.compress with healing",
        LossyConversionWarning,
        stacklevel=4,  # the caller of convert_
    )


class LossyConversionWarning(UserWarning):
    """A conversion from pretrained weights lost more than :data:`LOSSY_ERROR` of them (relative error)."""


def finish_low_rank(model: nn.Module, config: LowRankConfig, report: ConversionReport) -> None:
    """After the layers are replaced: CoLA's ``only_lr_act`` switch, then the warning of :func:`warn_if_lossy`."""
    drop_glu_activation(model, config, report)
    warn_if_lossy(model, report)


register_transform(
    LowRankConfig,
    Transform(
        is_dense_linear,
        plan_low_rank,
        LowRankLinear.from_dense,
        finish_low_rank,
        allocate_low_rank,
        layer_type=LowRankLinear,
        describe=describe_low_rank,
        restore=restore_low_rank,
    ),
)
