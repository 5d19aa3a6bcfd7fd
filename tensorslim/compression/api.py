"""``compress(model, budget, calibration)``: one budget, the best family and size per layer, then healing.

1. Calibrate: the input Gram matrix of every dense linear layer (:func:`~tensorslim.compression.calibration.calibrate`).
2. Choose: per layer, keep dense or take low rank (input-whitened, SVD-LLM arXiv 2403.07378 §3.1), Kronecker, TT,
   8-, 4-, 3- or 2-bit COMQ (arXiv 2403.07134) under the budget. By default each layer's candidates are measured end to
   end, by the whole model's calibration loss with that layer alone compressed (ASVD arXiv 2312.05821 §3.3), the
   budget goes where those losses are smallest, and that plan competes end to end with the per-layer one (least
   summed relative output error, :mod:`tensorslim.compression.choose`) and with each single family alone
   (:mod:`tensorslim.compression.endtoend`).
3. Build the chosen layers, each fitted to the original model's inputs, or with ``sequential=True`` in forward order,
   each fitted to the compressed model's inputs and the original's outputs (:mod:`tensorslim.compression.build`).
   With healing, the quantized layers stay float while the others heal by
   distillation from the original model, then ``quantize_`` solves them with COMQ on the calibration inputs.

Healing is :func:`tensorslim.compression.heal.heal`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from torch import nn

from tensorslim.budget import Budget
from tensorslim.compression.build import build, build_sequentially
from tensorslim.compression.calibration import Batch, Calibration, calibrate
from tensorslim.compression.choose import BITS, FAMILIES, Candidate, choose, layer_candidates, single_family_plans
from tensorslim.compression.endtoend import (
    PROBE_TOKENS,
    EndToEnd,
    agreement,
    best_plan,
    first_tokens,
    sensitivities,
)
from tensorslim.compression.heal import HealConfig, check_healable, heal
from tensorslim.convert import output_head_ids
from tensorslim.functional.threads import one_thread
from tensorslim.layers._source import is_dense_linear
from tensorslim.quant import COMQConfig, quantize_


@dataclass
class Stage:
    """Size and held-out quality after one stage (``quality`` is None without held-out batches)."""

    name: str
    params: int
    nbytes: int
    quality: float | None


@dataclass
class CompressReport:
    """What :func:`compress` chose per layer and what each stage reached."""

    budget: Budget
    choices: dict[str, Candidate] = field(default_factory=dict)
    stages: list[Stage] = field(default_factory=list)
    metric: str = "embedding cosine to the original"
    plan: str = "per layer"
    plan_losses: dict[str, float] = field(default_factory=dict)

    def table(self) -> str:
        rows = [f"{'layer':<48} {'family':<8} {'setting':>7} {'params':>10} {'bytes':>11} {'rel. error':>10}"]
        for name, c in self.choices.items():
            rows.append(f"{name:<48} {c.family:<8} {c.setting:>7} {c.params:>10,} {c.nbytes:>11,} {c.error:>10.4f}")
        for plan, loss in self.plan_losses.items():
            mark = "  (chosen)" if plan == self.plan else ""
            rows.append(f"plan {plan}: end-to-end calibration loss (1 - cosine) {loss:.5f}{mark}")
        for stage in self.stages:
            quality = "" if stage.quality is None else f", {self.metric} {stage.quality:.4f}"
            rows.append(f"{stage.name}: {stage.params:,} params, {stage.nbytes:,} bytes{quality}")
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.table()


def model_size(model: nn.Module) -> tuple[int, int]:
    """Parameters and bytes of ``model``: its parameters, plus its buffers' bytes (packed quantized codes)."""
    params = sum(p.numel() for p in model.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    nbytes += sum(b.numel() * b.element_size() for b in model.buffers())
    return params, nbytes


def _validate(
    model: nn.Module,
    budget: object,
    batches: Sequence[Batch],
    families: Sequence[str],
    healing: HealConfig | None,
    heal_data: Sequence[Batch],
) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model of type {type(model).__name__} is invalid; allowed: an nn.Module")
    if not isinstance(budget, Budget):
        raise ValueError(f"budget={budget!r} is invalid; allowed: a Budget, e.g. Budget(params=0.5)")
    if not batches:
        raise ValueError("calibration is empty; allowed: a list of one or more model inputs")
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families:
        raise ValueError(f"families={list(families)!r} is invalid; allowed: a non-empty subset of {list(FAMILIES)}")
    if healing is not None and not isinstance(healing, HealConfig):
        raise TypeError(f"healing of type {type(healing).__name__} is invalid; allowed: a HealConfig or None")
    if healing is not None:
        check_healable(model, list(heal_data) or list(batches))


ALLOCATIONS = ("end-to-end", "per-layer")


def _end_to_end_choice(
    student: nn.Module,
    batches: Sequence[Batch],
    cal: Calibration,
    names: list[str],
    options: list[list[Candidate]],
    kind: str,
    limit: float,
    per_layer: dict[str, Candidate],
    *,
    progress: bool,
) -> tuple[str, dict[str, float], dict[str, Candidate]]:
    """The plan of least end-to-end calibration loss among the sensitivity allocation (ASVD §3.3), the per-layer one
    and each single family alone; its name, every plan's loss, its choices."""
    probe = EndToEnd(student, first_tokens(batches, PROBE_TOKENS))
    measured = sensitivities(probe, names, options, cal, progress=progress)
    picks = choose(measured, kind, limit)
    plans = {"end-to-end sensitivity": {n: opts[i] for n, opts, i in zip(names, options, picks, strict=True)}}
    plans["per layer"] = per_layer
    for plan, choices in single_family_plans(options, kind, limit).items():
        plans[plan] = dict(zip(names, choices, strict=True))
    best, losses = best_plan(EndToEnd(student, batches), plans, cal)
    return best, losses, plans[best]


def compress(
    model: nn.Module,
    budget: Budget,
    calibration: Sequence[Batch],
    *,
    families: Sequence[str] = ("lowrank", "kron", "int8", "int4", "int3"),
    held_out: Sequence[Batch] = (),
    healing: HealConfig | None = None,
    heal_data: Sequence[Batch] = (),
    allocation: str = "end-to-end",
    sequential: bool = False,
    alignment: float = 1.0,
    filter_fn: Callable[[nn.Module, str], bool] | None = None,
    progress: bool = True,
) -> tuple[nn.Module, CompressReport]:
    """A compressed copy of ``model`` that fits ``budget``, chosen and healed on ``calibration``.

    Args:
        model: the original (left unchanged; it is the teacher of the healing).
        budget: ``Budget(params=…)``, ``Budget(bytes=…)`` or ``Budget(flops=…)``: a fraction of the candidate
            layers' dense cost, or an absolute number. Quantization saves bytes only, so under a params or FLOPs
            budget the 8/4-bit families are not candidates.
        calibration: model inputs (tensors, or dicts with ``input_ids`` and ``attention_mask`` for healing).
        families: among :data:`~tensorslim.compression.choose.FAMILIES`; keeping a layer dense is always a candidate.
        held_out: inputs on which each stage's agreement with the original is measured (never calibrated on).
        healing: heal the structured layers by distillation from the original model, layer by layer then end to
            end (:func:`~tensorslim.compression.heal.heal`); None: no healing.
        heal_data: the healing's inputs (default: ``calibration``); more text than the calibration heals better.
        allocation: ``"end-to-end"`` measures each layer's candidates by the whole model's calibration loss with that
            layer alone compressed (ASVD, arXiv 2312.05821, §3.3), allocates the budget by those losses, then measures
            that plan, the per-layer one and each single family alone end to end and keeps the best
            (:mod:`tensorslim.compression.endtoend`); ``"per-layer"`` allocates by each layer's own relative
            calibration output error only (one forward pass fewer per candidate; myopic: errors compound).
        sequential: build the layers in forward order, each fitted to the inputs of the already compressed model
            and the outputs of the original (:mod:`tensorslim.compression.build`); False (the default: on MiniLM
            with a few thousand calibration tokens the closed-form update overfits them) fits every layer to the
            original model's inputs.
        alignment: how much a sequentially built layer matches the original model's outputs (1) rather than its own
            outputs on the new inputs (0): ``β`` of :func:`~tensorslim.decomp.svd.aligned_target`.
        filter_fn: ``(module, name) -> bool`` choosing the candidate layers; default: every dense linear layer but
            the output heads.
        progress: progress bars for calibration, conversion and healing.

    Returns:
        The compressed model (eval mode) and a :class:`CompressReport`.
    """
    _validate(model, budget, calibration, families, healing, heal_data)
    if allocation not in ALLOCATIONS:
        raise ValueError(f"allocation={allocation!r} is invalid; allowed: {' or '.join(map(repr, ALLOCATIONS))}")
    if not isinstance(sequential, bool):
        raise ValueError(f"sequential={sequential!r} is invalid; allowed: True or False")
    if not (isinstance(alignment, int | float) and 0 <= alignment <= 1):
        raise ValueError(f"alignment={alignment!r} is invalid; allowed: a number in [0, 1]")
    heads = output_head_ids(model)
    chosen_layers = {
        name: module
        for name, module in model.named_modules()
        if is_dense_linear(module) and (filter_fn(module, name) if filter_fn else id(module) not in heads)
    }
    if not chosen_layers:
        raise ValueError("the model has no dense linear layer to compress; allowed: a model with nn.Linear layers")
    if budget.kind != "bytes":
        families = [f for f in families if f not in BITS]
        if not families:
            raise ValueError(
                f"families {'/'.join(BITS)} save bytes only; allowed with Budget({budget.kind}=...): lowrank, kron, tt"
            )
    report = CompressReport(budget=budget)
    student = copy.deepcopy(model).eval()
    # calibrated on the copy, whose modules are the ones that get replaced
    cal = calibrate(student, calibration, filter_fn=lambda m, n: n in chosen_layers, progress=progress)

    def stage(name: str) -> None:
        params, nbytes = model_size(student)
        quality = agreement(student, model.eval(), held_out) if held_out else None
        report.stages.append(Stage(name, params, nbytes, quality))

    stage("original")
    from tqdm.auto import tqdm

    modules = dict(student.named_modules())
    options = []
    with one_thread():
        for name in tqdm(chosen_layers, desc="candidates", unit="layer", disable=not progress):
            options.append(layer_candidates(name, modules[name], cal, families))
    kind = budget.kind
    dense = sum(opts[0].cost(kind) for opts in options)
    limit = budget.limit(dense)
    picks = choose(options, kind, limit)
    report.choices = {name: opts[i] for name, opts, i in zip(chosen_layers, options, picks, strict=True)}
    if allocation == "end-to-end":
        report.plan, report.plan_losses, report.choices = _end_to_end_choice(
            student, calibration, cal, list(chosen_layers), options, kind, limit, report.choices, progress=progress
        )
    # with healing, the quantized layers stay float while the others heal, then quantize_ solves them on its inputs
    skip = tuple(BITS) if healing is not None else ()
    if sequential:
        build_sequentially(
            model.eval(), student, report.choices, calibration, cal, alignment=alignment, skip=skip, progress=progress
        )
    else:
        build(student, report.choices, cal, skip=skip)
    stage("chosen, before healing")
    if healing is not None:
        teacher = copy.deepcopy(model)  # the distillation task freezes and re-configures its teacher
        config = dataclasses.replace(healing, progress=healing.progress and progress)
        heal(student, teacher, list(heal_data) or list(calibration), held_out=held_out, config=config, on_stage=stage)
        for family, bits in BITS.items():
            names = {n for n, c in report.choices.items() if c.family == family}
            if names:
                quantize_(student, COMQConfig(bits=bits), list(calibration), filter_fn=lambda m, n, s=names: n in s)
        if any(c.family in BITS for c in report.choices.values()):
            stage("quantized")
    return student.eval(), report
