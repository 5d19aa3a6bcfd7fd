"""The layer registry: which transform plans and builds the replacement for each config type, and its reports.

Modelled on torchao's ``quantize_``: a config is plain data, and a :class:`Transform` registered for its type plans
and builds the replacement layer. Each layer family registers its own config type(s) beside its code
(``register_transform(CoLAConfig, Transform(...))`` at the bottom of the family's module), so a new family is one
file. The same record says which layer class the family builds and how a built layer is described as a config (plus
the state a config cannot carry) and restored, which is what ``save_pretrained``/``load_pretrained`` read. This module
imports no layer: ``import tensorslim.layers`` registers every family, and importing a family's
module registers that family.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from torch import nn

T = TypeVar("T")


@dataclass(frozen=True)
class LayerReport:
    """What happens (or would happen) to one layer."""

    name: str
    kind: str  # type of the original module
    old_shape: tuple[int, int]  # (d_in, d_out)
    new_shape: str  # e.g. "768->192->768"
    rank: int
    params_before: int
    params_after: int


@dataclass(frozen=True)
class BudgetUse:
    """How a budgeted conversion spent its budget, counted by the layers' own books.

    Attributes:
        kind: ``"params"`` or ``"flops"`` (forward FLOPs per token).
        allocation: ``"spectrum"`` (water-filling of the singular-value spectra) or ``"uniform"`` (one rank).
        dense: the cost of the converted layers as they are.
        limit: the budget in the same unit.
        used: the cost of the layers at their chosen ranks (never above ``limit``).
    """

    kind: str
    allocation: str
    dense: float
    limit: float
    used: float

    def line(self) -> str:
        """One line: what was used against the budget and the dense cost."""
        unit = {"params": "params", "flops": "FLOPs/token", "bytes": "bytes"}[self.kind]
        return (
            f"budget ({self.kind}, {self.allocation} ranks): {self.used:,.0f} of {self.limit:,.0f} {unit} used "
            f"({self.used / self.limit:.1%} of the budget, {self.used / self.dense:.1%} of dense {self.dense:,.0f})"
        )


@dataclass(frozen=True)
class Allocation:
    """The outcome of a transform's ``allocate`` step: one config per layer, each with its chosen rank."""

    configs: dict[str, object]  # qualified layer name -> the config that layer is planned and built with
    use: BudgetUse


@dataclass
class ConversionReport:
    """Per-layer books of a conversion plus the whole model's parameter count before and after."""

    method: str
    layers: list[LayerReport] = field(default_factory=list)
    model_params_before: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (layer, why it stays as it is)
    applied: bool = False  # False: a plan (dry run); True: the layers were replaced
    budget: BudgetUse | None = None  # set when the config carried a budget
    model_trainable_before: int = 0
    freezes: bool = False  # the family freezes the model and trains only what it adds (LoRA)
    kept_trainable: int = 0  # parameters a freezing family keeps trainable (a task head)

    @property
    def params_before(self) -> int:
        return sum(layer.params_before for layer in self.layers)

    @property
    def params_after(self) -> int:
        return sum(layer.params_after for layer in self.layers)

    @property
    def model_params_after(self) -> int:
        return self.model_params_before - self.params_before + self.params_after

    @property
    def model_trainable_after(self) -> int:
        """Trainable parameters once applied: only what the family adds when it freezes the model, else the trainable
        ones before with each replaced layer's parameters exchanged for its replacement's."""
        if self.freezes:
            return self.params_after - self.params_before + self.kept_trainable
        return self.model_trainable_before - self.params_before + self.params_after

    def table(self) -> str:
        """A plain-text table, one row per converted layer plus totals."""
        rows = [f"{'layer':<48} {'kind':<10} {'shape':<22} {'rank':>5} {'params':>12} {'-> params':>12}"]
        for layer in self.layers:
            shape = f"{layer.old_shape[0]}->{layer.old_shape[1]}"
            rows.append(
                f"{layer.name:<48} {layer.kind:<10} {shape:<22} {layer.rank:>5} "
                f"{layer.params_before:>12,} {layer.params_after:>12,}"
            )
        rows += [f"kept as is: {name} ({why})" for name, why in self.skipped]
        if self.budget is not None:
            rows.append(self.budget.line())
        verb = "converted" if self.applied else "to convert (plan)"
        rows.append(
            f"{len(self.layers)} layers {verb} with {self.method}: {self.params_before:,} -> "
            f"{self.params_after:,} params; model {self.model_params_before:,} -> {self.model_params_after:,}, "
            f"trainable {self.model_trainable_before:,} -> {self.model_trainable_after:,}"
        )
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.table()


@dataclass(frozen=True)
class Transform:
    """How one config family plans and builds replacements.

    Attributes:
        accepts: whether a module is a candidate for this transform.
        plan_layer: ``(qualified name, module, config) -> LayerReport``, computed without building anything.
        build: ``(module, config) -> replacement module``.
        finalize: optional model-level step ``(model, config, report)`` after all layers are replaced; it may
            correct the report's rows to the built model.
        allocate: optional model-level pre-pass ``(model, candidates, config) -> Allocation`` run by ``plan`` when
            the config carries a budget: it chooses each candidate's rank (``candidates`` are ``(name, module)``
            pairs) so that the converted layers fit the budget. Families without it refuse budgets.
        layer_type: the class ``build`` returns (or a tuple of the classes of a family that puts in several); a built
            layer belongs to the family whose ``layer_type`` is its class or nearest base class (see
            :func:`transform_for_layer`).
        describe: ``(model, qualified name, layer) -> (config, state)``: a config that rebuilds ``layer`` with every
            shape explicit and ``init="random"`` (nothing is read from weights), and the JSON-able state the config
            cannot carry (gate thresholds ...). Every registered family has one (the contract matrix checks it).
        restore: optional ``(layer, state)``: sets that state on a layer rebuilt from the config.
        default_targets: optional ``model -> modules``: the candidates a conversion without ``filter_fn`` takes
            (e.g. only the token table of the embeddings); None takes every candidate that is not an output head.
        select: optional ``(model, config) -> [(name, module)]``: the candidates the config itself names (LoRA's
            target names, the attention layers a memory replaces); it replaces the walk over ``accepts`` and the
            output-head rule, ``filter_fn`` still narrows it.
        check: optional model-level validation ``(model, config, candidates)`` run by ``plan`` after the layers are
            planned (a model equipped already, no layer to adapt, a setting the model's kind cannot take).
        build_in: optional ``(model, qualified name, module, config) -> replacement``, used instead of ``build`` by a
            family whose layer needs more of the model than the module it replaces (rotary tables, the model's config).
        grows: the family adds parameters by design (adapters, learned scales): the larger-than-dense refusal does not
            apply to it.
        freezes: the family freezes the model and trains only what it adds (LoRA); the report books what is trainable.
        keeps_trainable: optional ``(model, config) -> parameters`` a freezing family keeps trainable (a task head).
        prepare: optional model-level step ``(model, config)`` before the first layer is built (freezing the model).
        wraps: the attributes under which a built layer keeps the module it replaced (LoRA's ``base``, an adapter's
            ``inner``), the first the layer has; that module's own record is saved under the built layer's name and
            rebuilt first.
        transparent: a built layer keeps the replaced module's children under their names (a memory keeps the
            attention's projections), so their records are saved as they are and rebuilt first.
        shell: optional ``state -> layer``: an empty layer of the layout ``describe`` recorded, for loading weights
            into, for a family whose config cannot rebuild a layer without data (quantized codes: the solver leaves
            no trace); ``load_pretrained`` puts it in place of building.
        owns: optional ``layer -> bool`` for a family that changes layers in place (QAT's parametrizations of TT
            cores): a layer it owns is described by it although its class belongs to another family, whose record
            comes first.
    """

    accepts: Callable[[nn.Module], bool]
    plan_layer: Callable[[str, nn.Module, object], LayerReport]
    build: Callable[[nn.Module, object], nn.Module] | None
    finalize: Callable[[nn.Module, object, ConversionReport], None] | None = None
    allocate: Callable[[nn.Module, list[tuple[str, nn.Module]], object], Allocation] | None = None
    layer_type: type[nn.Module] | tuple[type[nn.Module], ...] | None = None
    describe: Callable[[nn.Module, str, nn.Module], tuple[object, dict[str, Any]]] | None = None
    restore: Callable[[nn.Module, dict[str, Any]], None] | None = None
    default_targets: Callable[[nn.Module], list[nn.Module]] | None = None
    select: Callable[[nn.Module, object], list[tuple[str, nn.Module]]] | None = None
    check: Callable[[nn.Module, object, list[tuple[str, nn.Module]]], None] | None = None
    build_in: Callable[[nn.Module, str, nn.Module, object], nn.Module] | None = None
    grows: bool = False
    freezes: bool = False
    keeps_trainable: Callable[[nn.Module, object], list[nn.Parameter]] | None = None
    prepare: Callable[[nn.Module, object], None] | None = None
    wraps: tuple[str, ...] = ()
    transparent: bool = False
    shell: Callable[[dict[str, Any]], nn.Module] | None = None
    owns: Callable[[nn.Module], bool] | None = None

    def __post_init__(self) -> None:
        if (self.build is None) == (self.build_in is None):
            raise ValueError("a Transform needs exactly one of build and build_in")

    def replacement(self, model: nn.Module, name: str, module: nn.Module, config: object) -> nn.Module:
        """The layer that replaces ``module`` (at ``name`` in ``model``) under ``config``."""
        if self.build_in is not None:
            return self.build_in(model, name, module, config)
        return self.build(module, config)


TRANSFORMS: dict[type, Transform] = {}


def register_transform(config_type: type, transform: Transform) -> None:
    """Register ``transform`` for ``config_type`` (and, through :func:`registered_for`, its subclasses).

    Raises:
        ValueError: ``config_type`` already has a different transform.
    """
    known = TRANSFORMS.get(config_type)
    if known is not None and known != transform:
        raise ValueError(f"config type {config_type.__name__} already has a transform; allowed: one per config type")
    TRANSFORMS[config_type] = transform


def registered_for(registry: dict[type, T], config: object, *, what: str) -> T:
    """The registry entry of ``config``'s class or its nearest registered base class.

    Raises:
        TypeError: neither the class nor any base class is registered.
    """
    for cls in type(config).__mro__:
        if cls in registry:
            return registry[cls]
    known = sorted(cls.__name__ for cls in registry)
    raise TypeError(f"config of type {type(config).__name__} has no registered {what}; known: {known}")


def transform_for(config: object) -> Transform:
    """The :class:`Transform` registered for ``config``'s type (or its nearest registered base class)."""
    return registered_for(TRANSFORMS, config, what="transform")


def transform_for_layer(layer: nn.Module, *, in_place: bool = True) -> Transform | None:
    """The :class:`Transform` whose ``layer_type`` is ``layer``'s class or its nearest base class (a LaX-TT layer is
    LaX-TT's, not TT's); None for a module no registered family builds.

    With ``in_place`` a family that changed the layer in place (its ``owns`` is true: a TT layer in QAT form) comes
    first; without it, the family of the layer's class (the TT layer under its QAT form).
    """
    if in_place:
        owner = next((t for t in TRANSFORMS.values() if t.owns is not None and t.owns(layer)), None)
        if owner is not None:
            return owner
    by_type = {
        cls: transform
        for transform in TRANSFORMS.values()
        if transform.layer_type is not None
        for cls in (transform.layer_type if isinstance(transform.layer_type, tuple) else (transform.layer_type,))
    }
    return next((by_type[cls] for cls in type(layer).__mro__ if cls in by_type), None)


def set_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    """Replace the submodule at qualified ``name`` (``"layers.0.mlp.up_proj"``) of ``model`` by ``new``."""
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


@contextmanager
def unchanged_on_error(model: nn.Module) -> Iterator[None]:
    """Undo every structural change a failing block made to ``model``: a refused verb leaves the model as it was.

    Every verb validates its plan before it changes anything; this guard is the second line for what only building
    can find (a layer that refuses its config halfway through). It records, without copying any tensor, each
    module's class, attributes (submodule, parameter, buffer and hook tables as shallow copies) and each parameter's
    ``requires_grad`` flag, and puts them back if the block raises. Values written in place into existing tensors are
    not undone: no verb writes into the tensors of the model it is given.
    """
    modules = [
        (
            module,
            type(module),
            {key: copy.copy(value) if isinstance(value, dict) else value for key, value in vars(module).items()},
        )
        for module in model.modules()
    ]
    flags = [(param, param.requires_grad) for param in model.parameters()]
    try:
        yield
    except BaseException:
        for module, cls, attributes in modules:
            module.__class__ = cls
            module.__dict__.clear()
            module.__dict__.update(attributes)
        for param, flag in flags:
            param.requires_grad_(flag)
        raise
