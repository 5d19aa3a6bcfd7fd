"""LoRA adapters on a frozen model, plain or with LaX latent crossing between consecutive layers' adapters.

LoRA: Hu et al., 2021 (arXiv 2106.09685), §4.1: ``y = W₀x + (α/r)·B·A·x`` with ``W₀`` frozen, ``A`` Kaiming-uniform,
``B = 0`` (peft's defaults), so training starts from the pretrained function.

LaX-LoRA (LaX, arXiv 2505.21732, abstract and "Variants of LaX"): the paper applies latent crossing to LoRA on
LLaMA-7/13B, but **its LoRA code is unreleased** ("Coming Soon" in ``K1seki221/Latent_Crossing``). What follows is
our reconstruction: for the adapter of layer type ℓ in block i > 0, with ``h = A·x``::

    h' = h + G(h'_prev)              h'_prev: the adapter latent of layer ℓ in block i−1 (after its own crossing)
    y  = W₀x + (α/r)·B·h'

with the gates of :mod:`tensorslim.layers.lax` (identity, dense r×r, Kronecker) and **no LayerNorm** on the adapter
latent (the paper's formula has none, and a LayerNorm would rescale the small early latents of a fresh adapter).
Block 0 has no crossing. Because ``B = 0`` at init, LaX-LoRA also starts exactly at the pretrained model.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim._checks import check_fields
from tensorslim.layers.lax import (
    CROSSINGS,
    KroneckerCrossing,
    LatentStore,
    LatentStream,
    crossing_params,
    ensure_store,
    make_crossing,
    split_block_path,
    stream_neighbours,
)
from tensorslim.layers.lowrank import LowRankLinear
from tensorslim.registry import ConversionReport, LayerReport, Transform, register_transform


@dataclass(frozen=True, kw_only=True)
class LoRAConfig:
    """Which layers get adapters and how.

    Attributes:
        rank: adapter rank r.
        alpha: scaling numerator; the update is ``(alpha / rank)·B·A·x``.
        dropout: dropout on the adapter's input.
        targets: last name components of the layers to adapt (BERT: ``query``, ``value``): ``nn.Linear`` layers,
            or the CoLA/SVD :class:`~tensorslim.layers.lowrank.LowRankLinear` layers of a converted model.
        lax_gate: None for plain LoRA; ``"identity"``, ``"dense"`` or ``"kronecker"`` for LaX-LoRA.
    """

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("query", "value")
    lax_gate: str | None = None

    def __post_init__(self) -> None:
        check_fields(self)
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"rank={self.rank!r} is invalid; allowed: an integer >= 1")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout={self.dropout!r} is invalid; allowed: [0, 1)")
        if not self.targets:
            raise ValueError("targets=() is invalid; allowed: a non-empty tuple of layer names")
        if self.lax_gate is not None and self.lax_gate not in CROSSINGS:
            raise ValueError(f"lax_gate={self.lax_gate!r} is unknown; allowed: None or one of {list(CROSSINGS)}")


# The layers LoRA adapts: dense linears, and low-rank layers (LoRA on a CoLA or SVD model).
ADAPTABLE = (nn.Linear, LowRankLinear)


def check_rank(name: str, rank: int, d_in: int, d_out: int) -> None:
    """Raise ``ValueError`` unless an adapter of ``rank`` fits layer ``name`` (``d_in -> d_out``)."""
    if not 1 <= rank <= min(d_in, d_out):
        raise ValueError(f"rank={rank} does not fit {name} ({d_in} -> {d_out}); allowed: 1..{min(d_in, d_out)}")


class LoRALinear(LatentStream, nn.Module):
    """A frozen ``nn.Linear`` (or CoLA/SVD layer) plus a trainable low-rank update, optionally crossing latents
    (LaX-LoRA).

    Args:
        base: the pretrained layer (kept as ``self.base``, frozen): an ``nn.Linear`` or a ``LowRankLinear``, whose
            output the update is added to (``y = base(x) + (α/r)·B·A·x``).
        rank, alpha, dropout: see :class:`LoRAConfig`.
    """

    def __init__(self, base: nn.Linear | LowRankLinear, *, rank: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        check_rank("the adapted layer", rank, base.in_features, base.out_features)
        self.base = base.requires_grad_(False)
        self.rank, self.scaling = rank, alpha / rank
        weight = next(base.parameters())
        factory = {"device": weight.device, "dtype": weight.dtype}
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features, **factory))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, **factory))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.gate: nn.Module | None = None
        self._init_stream()

    @property
    def crossing(self) -> bool:
        return self.gate is not None

    def join(self, store: LatentStore, stream: str, *, gate: str | None) -> None:
        """Publish the adapter latent under ``stream``; with a ``gate`` also add the previous block's latent."""
        self._join_stream(store, stream)
        if gate is not None:
            self.gate = make_crossing(gate, self.rank, device=self.lora_a.device, dtype=self.lora_a.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        latent = F.linear(self.dropout(x), self.lora_a)  # (..., r)
        if self.gate is not None:
            latent = latent + self.gate(self._previous_latent())
        return self.base(x) + self.scaling * F.linear(self._publish(latent), self.lora_b)  # (..., d_out)

    def extra_repr(self) -> str:
        return f"rank={self.rank}, scaling={self.scaling:g}, crossing={self.crossing}"


def apply_lora_(model: nn.Module, config: LoRAConfig) -> dict[str, Any]:
    """Freeze ``model`` and put adapters on the target layers in place; with ``lax_gate``, cross their latents.

    LoRA is a family of :mod:`tensorslim.registry`: this is ``convert_(model, config)`` (``plan`` previews it,
    ``save_pretrained`` records it), reported as a dict.

    Returns:
        ``{"layers": [names], "crossing": [names], "trainable": n, "lax_added": n}``.

    Raises:
        ValueError: no layer matches ``config.targets``, or the rank does not fit one of them.
    """
    from tensorslim.convert import convert_

    if not isinstance(config, LoRAConfig):
        raise TypeError(f"config of type {type(config).__name__} is invalid; allowed: LoRAConfig")
    report = convert_(model, config)
    adapters = [model.get_submodule(layer.name) for layer in report.layers]
    crossing = [layer.name for layer, adapter in zip(report.layers, adapters, strict=True) if adapter.crossing]
    lax_added = len(crossing) * crossing_params(config.lax_gate, config.rank, norm=False) if config.lax_gate else 0
    return {
        "layers": [layer.name for layer in report.layers],
        "crossing": crossing,
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "lax_added": lax_added,
    }


def _select_targets(model: nn.Module, config: LoRAConfig) -> list[tuple[str, nn.Module]]:
    """The layers ``config.targets`` names (by their last name component), as they are: dense or low rank."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, ADAPTABLE) and name.rsplit(".", 1)[-1] in config.targets
    ]


def _check_targets(model: nn.Module, config: LoRAConfig, targets: list[tuple[str, nn.Module]]) -> None:
    if not targets:
        raise ValueError(f"targets={config.targets!r} match no nn.Linear or LowRankLinear of {type(model).__name__}")


def _plan_adapter(name: str, module: nn.Module, config: LoRAConfig) -> LayerReport:
    """An adapter's books: ``r·(d_in + d_out)`` more parameters, plus a crossing in a numbered block > 0 (an estimate
    :func:`_finish` corrects to the built model)."""
    check_rank(name, config.rank, module.in_features, module.out_features)
    before = sum(p.numel() for p in module.parameters())
    added = config.rank * (module.in_features + module.out_features)
    loc = split_block_path(name)
    if config.lax_gate is not None and loc is not None and loc[0] > 0:
        added += crossing_params(config.lax_gate, config.rank, norm=False)
    return LayerReport(
        name=name,
        kind=type(module).__name__,
        old_shape=(module.in_features, module.out_features),
        new_shape=f"+ {module.in_features}->{config.rank}->{module.out_features}",
        rank=config.rank,
        params_before=before,
        params_after=before + added,
    )


def _build_adapter(module: nn.Module, config: LoRAConfig) -> LoRALinear:
    return LoRALinear(module, rank=config.rank, alpha=config.alpha, dropout=config.dropout)


def _freeze(model: nn.Module, config: LoRAConfig) -> None:
    """LoRA trains its adapters only: the model is frozen before they are built."""
    del config
    model.requires_grad_(False)


def _finish(model: nn.Module, config: LoRAConfig, report: ConversionReport) -> None:
    """Cross the adapters' latents and book the built model."""
    adapters = {layer.name: model.get_submodule(layer.name) for layer in report.layers}
    if config.lax_gate is not None:
        _wire_crossings(model, adapters, config.lax_gate)
    report.layers[:] = [
        dataclasses.replace(layer, params_after=sum(p.numel() for p in adapters[layer.name].parameters()))
        for layer in report.layers
    ]


def crossing_kind(gate: nn.Module) -> str:
    """The ``lax_gate`` name of a built crossing."""
    if isinstance(gate, KroneckerCrossing):
        return "kronecker"
    return "dense" if isinstance(gate, nn.Linear) else "identity"


def _describe_adapter(model: nn.Module, name: str, layer: LoRALinear) -> tuple[LoRAConfig, dict[str, Any]]:
    """One config for every adapter of the model, so that one call rebuilds them all (and their crossings).

    Raises:
        ValueError: adapters of different rank, scaling, dropout or crossing (no one config rebuilds them), or a gated
            adapter (the adapters family's).
    """
    if type(layer) is not LoRALinear:
        raise ValueError(
            f"{name} is a {type(layer).__name__}; allowed here: LoRALinear (save adapters with save_adapters)"
        )
    adapters = {n: m for n, m in model.named_modules() if type(m) is LoRALinear}
    kinds = {crossing_kind(m.gate) for m in adapters.values() if m.gate is not None}
    shapes = {(m.rank, m.scaling, getattr(m.dropout, "p", 0.0)) for m in adapters.values()}
    if len(shapes) > 1 or len(kinds) > 1:
        raise ValueError(
            f"LoRA adapters with different rank/scaling/dropout {sorted(shapes)} or crossings {sorted(kinds)}; "
            "allowed: one LoRAConfig for the whole model"
        )
    targets = tuple(sorted({n.rsplit(".", 1)[-1] for n in adapters}))
    config = LoRAConfig(
        rank=layer.rank,
        alpha=layer.scaling * layer.rank,
        dropout=shapes.pop()[2],
        targets=targets,
        lax_gate=next(iter(kinds), None),
    )
    return config, {"scaling": layer.scaling}


def _restore_scaling(layer: LoRALinear, state: dict[str, Any]) -> None:
    """``alpha / rank`` exactly as saved (``alpha`` is recorded as ``scaling · rank``)."""
    layer.scaling = state["scaling"]


def _wire_crossings(model: nn.Module, adapters: dict[str, LoRALinear], gate: str) -> list[str]:
    store = ensure_store(model)
    crossing = []
    for name, _block, stream, previous in stream_neighbours(adapters):
        adapters[name].join(store, stream, gate=None if previous is None else gate)
        if previous is not None:
            crossing.append(name)
    return crossing


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Only the trainable tensors (adapters and gates), for small checkpoints."""
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    return {name: t for name, t in model.state_dict().items() if name in trainable}


register_transform(
    LoRAConfig,
    Transform(
        accepts=lambda module: isinstance(module, ADAPTABLE),
        plan_layer=_plan_adapter,
        build=_build_adapter,
        finalize=_finish,
        layer_type=LoRALinear,
        describe=_describe_adapter,
        restore=_restore_scaling,
        select=_select_targets,
        check=_check_targets,
        grows=True,
        freezes=True,
        prepare=_freeze,
        wraps=("base",),
    ),
)
