"""Building the chosen layers, either each from the original model's calibration or sequentially.

Sequential calibration compresses the layers in forward order: each layer is fitted on the inputs that the already
compressed layers before it produce, against the outputs of the original model (GPTQ, arXiv 2210.17323 §4, calibrates
on the partly quantized model's inputs; SAES-SVD, arXiv 2602.03051, CEALC, also aligns each layer's output with the
original's). For low rank and for 8/4/3/2-bit codes that is one closed form per layer: the target
:func:`~tensorslim.decomp.svd.aligned_target` ``M₀`` is truncated in the whitening of the new inputs (SVD-LLM,
arXiv 2403.07378, §3.1) or quantized by COMQ against their Gram matrix. Kronecker and TT layers start from the
original weight (weight-space decompositions), in their turn, so the layers after them see their error.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from tensorslim.compression.calibration import Batch, Calibration, call_groups, first_inputs, paired_grams
from tensorslim.compression.choose import Candidate
from tensorslim.decomp.svd import aligned_target, whitened_truncation, whitening_factor
from tensorslim.layers._source import linear_shape, linear_weight
from tensorslim.layers.kron import KronConfig, KronLinear
from tensorslim.layers.lowrank import LowRankLinear
from tensorslim.layers.tt import TTConfig, TTLinear
from tensorslim.quant.comq import COMQConfig, comq_quantize
from tensorslim.quant.qlinear import build_quant_layer
from tensorslim.registry import set_submodule


def balanced(weight_a: torch.Tensor, weight_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The factors of ``B A`` rescaled per rank component so that row ``i`` of ``A`` and column ``i`` of ``B`` have
    the same norm; the product is unchanged.

    The whitened truncation's ``A = √Σ_r V_rᵀ S⁻¹`` carries the inverse of the input scale (``S Sᵀ`` sums the inputs'
    outer products over every calibration token): on MiniLM its columns come out 20–100× smaller than ``B``'s, so an
    optimizer that steps every parameter by about its learning rate (AdamW, during healing) moves ``A`` by a large
    share of its size and ``B`` by almost nothing. Balanced factors, as the plain SVD's ``U √Σ``, ``√Σ Vᵀ`` are,
    give both factors the same relative step.
    """
    norm_a, norm_b = weight_a.norm(dim=1), weight_b.norm(dim=0)
    both = (norm_a > 0) & (norm_b > 0)  # a component with a zero factor stays as it is
    scale = torch.where(both, (norm_b / torch.where(both, norm_a, 1.0)).sqrt(), 1.0)
    return weight_a * scale[:, None], weight_b / scale[None, :]


def low_rank_layer(module: nn.Module, weight_a: torch.Tensor, weight_b: torch.Tensor) -> LowRankLinear:
    """A :class:`LowRankLinear` ``x ↦ B A x + b`` with ``module``'s bias, device and dtype, its factors
    :func:`balanced`."""
    weight_a, weight_b = balanced(weight_a, weight_b)
    d_in, d_out = linear_shape(module)
    weight, bias = linear_weight(module)
    layer = LowRankLinear(
        d_in, d_out, weight_a.shape[0], bias=bias is not None, device=weight.device, dtype=weight.dtype
    )
    with torch.no_grad():
        layer.weight_a.copy_(weight_a)
        layer.weight_b.copy_(weight_b)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer.eval()


def replacement(
    module: nn.Module,
    choice: Candidate,
    gram: torch.Tensor,
    *,
    cross: torch.Tensor | None = None,
    alignment: float = 1.0,
    damping: float = 1e-4,
) -> nn.Module:
    """The layer ``choice`` describes, fitted to inputs with Gram matrix ``gram``.

    Args:
        module: the original dense layer.
        choice: its family and setting.
        gram: ``G = Σ x xᵀ`` of the inputs the new layer will see.
        cross: ``C = Σ x_f xᵀ`` against the original model's inputs (sequential calibration); None when the inputs
            are the original's (``C = G``).
        alignment: ``β`` of :func:`~tensorslim.decomp.svd.aligned_target`.
        damping: relative ridge of the whitening.
    """
    weight = linear_weight(module)[0]
    if choice.family == "kron":
        return KronLinear.from_dense(module, KronConfig(rank=choice.setting)).eval()
    if choice.family == "tt":
        return TTLinear.from_dense(module, TTConfig(rank=choice.setting)).eval()
    whitener = whitening_factor(gram, damping=damping)
    target = weight if cross is None else aligned_target(weight, gram, cross, whitener, alignment=alignment)
    if choice.family == "lowrank":
        weight_a, weight_b = whitened_truncation(target, whitener, choice.setting)
        return low_rank_layer(module, weight_a, weight_b)
    if choice.family.startswith("int"):
        result = choice.solution if cross is None else None  # solved already on the original inputs
        if result is None:
            result = comq_quantize(target, gram, COMQConfig(bits=choice.setting))
        return build_quant_layer(module, result).eval()
    raise ValueError(f"family {choice.family!r} cannot be built; allowed: {('lowrank', 'kron', 'tt', 'int*')}")


def build(
    model: nn.Module, choices: dict[str, Candidate], calibration: Calibration, *, skip: Sequence[str] = ()
) -> None:
    """Replace every non-dense choice (but ``skip``) in ``model`` in place, each fitted to the original inputs."""
    modules = dict(model.named_modules())
    for name, choice in choices.items():
        if choice.family != "dense" and choice.family not in skip:
            new = replacement(
                modules[name], choice, calibration.gram(modules[name], name=name), damping=calibration.damping
            )
            set_submodule(model, name, new)


def build_sequentially(
    original: nn.Module,
    model: nn.Module,
    choices: dict[str, Candidate],
    batches: Sequence[Batch],
    calibration: Calibration,
    *,
    alignment: float = 1.0,
    skip: Sequence[str] = (),
    progress: bool = True,
) -> None:
    """Replace every non-dense choice (but the families in ``skip``) of ``model``, a copy of ``original``, in
    forward order, each fitted to the inputs the layers already replaced produce (module docstring).

    Layers that the first batch does not reach are built from the original inputs afterwards.
    """
    from tqdm.auto import tqdm

    names = [n for n, c in choices.items() if c.family != "dense" and c.family not in skip]
    groups = call_groups(original, batches[0], names)
    reached = [name for group in groups for name in group]
    reference = first_inputs(original, batches, reached)  # the original's inputs, kept for every layer
    for group in tqdm(groups, desc="sequential build", unit="group", disable=not progress):
        stats = paired_grams(reference, model, batches, group)
        modules = dict(model.named_modules())
        for name in group:
            gram, cross = stats[name]
            new = replacement(
                modules[name], choices[name], gram, cross=cross, alignment=alignment, damping=calibration.damping
            )
            set_submodule(model, name, new)
    build(model, {n: c for n, c in choices.items() if n in names and n not in set(reached)}, calibration)
