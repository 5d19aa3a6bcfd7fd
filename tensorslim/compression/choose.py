"""Per-layer candidates of every family, their cost and calibration error, and the choice under one budget.

Each dense linear layer gets a list of :class:`Candidate` replacements: kept dense, low rank at every rank (the
input-whitened truncation of SVD-LLM, arXiv 2403.07378, §3.1, whose output error is its discarded whitened spectrum,
Theorem 3.2), the nearest Kronecker product at a few ranks, TT at a few ranks, and 8-, 4-, 3- or 2-bit codes solved by
COMQ (arXiv 2403.07134) on the layer's calibration Gram matrix, exactly as ``quantize_`` solves them, with their bytes
counted as :class:`~tensorslim.quant.QuantLinear` stores them (packed codes, one float scale and one byte of zero
point per output row, the float bias). The error of a candidate is its squared output error on the layer's
calibration inputs relative to the layer's output energy, ``tr(ΔW G ΔWᵀ) / tr(W G Wᵀ)``, as ASVD (arXiv 2312.05821,
§3.3) ranks layers by their measured sensitivity.

The choice is a multiple-choice knapsack: minimise the summed errors under the summed costs. Its Lagrangian
relaxation, each layer taking ``argmin(error + λ·cost)`` with λ bisected to the smallest value that fits, solves it
on the lower convex hull of each layer's (cost, error) points. Every uniform choice that fits (one family and setting
for all layers, e.g. 4 bits everywhere) is a second starting point; the one with the smaller summed error is kept and
the leftover budget is spent greedily, so the result never has a larger summed error than the best uniform choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from tensorslim.compression.calibration import Calibration
from tensorslim.decomp.svd import whitened_svd
from tensorslim.layers._source import linear_shape, linear_weight
from tensorslim.layers.kron import KronConfig, KronLinear
from tensorslim.layers.lowrank import LowRankLinear
from tensorslim.layers.tt import TTConfig, TTLinear
from tensorslim.quant.comq import COMQConfig, comq_quantize
from tensorslim.quant.quantizer import QuantResult, packed_nbytes

FAMILIES = ("lowrank", "kron", "tt", "int8", "int4", "int3", "int2")
BITS = {"int8": 8, "int4": 4, "int3": 3, "int2": 2}
KRON_RANKS = (1, 2, 4, 8, 16)
TT_RANKS = (8, 16, 32, 64)
# The grid of low-rank candidates: at most this many ranks per layer (the spectrum gives every rank's error at once).
LOW_RANK_STEPS = 64


@dataclass(frozen=True)
class Candidate:
    """One way to store a layer.

    Attributes:
        family: ``"dense"`` or one of :data:`FAMILIES`.
        setting: the rank (low rank, Kronecker, TT) or the bits (8, 4); 0 for dense.
        params: parameters after the swap (quantized codes count as parameters).
        nbytes: bytes of its weights after the swap (float weights at the model's element size).
        flops: forward multiply-add FLOPs per token (2 per multiply-add).
        error: squared output error on the calibration inputs relative to the layer's output energy.
        solution: the codes and grid of a quantized candidate (what ``quantize_`` with COMQ would store).
    """

    family: str
    setting: int
    params: int
    nbytes: int
    flops: int
    error: float
    solution: QuantResult | None = field(default=None, compare=False, repr=False)

    def cost(self, kind: str) -> float:
        return {"params": self.params, "bytes": self.nbytes, "flops": self.flops}[kind]


def _relative(calibration: Calibration, name: str, module: nn.Module, weight: torch.Tensor) -> float:
    energy = max(calibration.output_energy(module, name=name), torch.finfo(torch.float64).tiny)
    return calibration.output_error(module, weight, name=name) / energy


def _low_rank(name: str, module: nn.Module, calibration: Calibration, size: int) -> list[Candidate]:
    d_in, d_out = linear_shape(module)
    bias = module.bias is not None
    energy = max(calibration.output_energy(module, name=name), torch.finfo(torch.float64).tiny)
    spectrum = whitened_svd(linear_weight(module)[0], calibration.whitener(module, name=name))[1] ** 2
    tails = (spectrum.flip(0).cumsum(0).flip(0).tolist() + [0.0])[1:]  # tails[r-1] = Σ_{i>r} σ_i²
    dense = d_in * d_out
    ranks = [r for r in range(1, min(d_in, d_out) + 1) if r * (d_in + d_out) < dense]
    ranks = ranks[:: max(1, len(ranks) // LOW_RANK_STEPS)]
    out = []
    for r in ranks:
        params = LowRankLinear.count_params(d_in, d_out, r, bias=bias)
        flops = LowRankLinear.count_flops(d_in, d_out, r, tokens=1)
        out.append(Candidate("lowrank", r, params, params * size, flops, tails[r - 1] / energy))
    return out


def _structured(name: str, module: nn.Module, calibration: Calibration, size: int, family: str) -> list[Candidate]:
    d_in, d_out = linear_shape(module)
    dense = d_in * d_out
    out = []
    if family == "kron":
        configs = [(r, KronConfig(rank=r)) for r in KRON_RANKS]
        build = KronLinear.from_dense
    else:
        configs = [(r, TTConfig(rank=r)) for r in TT_RANKS]
        build = TTLinear.from_dense
    for setting, config in configs:
        try:
            layer = build(module, config)
        except ValueError:
            continue  # the shape does not factor for this family or rank: no candidate
        params = layer.num_params()
        if params >= dense:
            break
        error = _relative(calibration, name, module, layer.to_dense().weight)
        out.append(Candidate(family, setting, params, params * size, int(layer.flops(1)), error))
    return out


def quantized_nbytes(module: nn.Module, bits: int) -> int:
    """Bytes of ``module``'s weight stored as :class:`~tensorslim.quant.QuantLinear` stores it: packed per-channel
    ``bits``-bit codes, a float scale (the weight's dtype) and a one-byte zero point per output row, the float bias."""
    source = linear_weight(module)[0]
    d_out = source.shape[0]
    bias = module.bias.numel() * module.bias.element_size() if module.bias is not None else 0
    return packed_nbytes(source.numel(), bits) + d_out * (source.element_size() + 1) + bias


def _quantized(name: str, module: nn.Module, calibration: Calibration, bits: int) -> Candidate:
    """COMQ at ``bits`` with its defaults (``quantize_``'s solver) on the layer's calibration Gram matrix."""
    d_in, d_out = linear_shape(module)
    params = d_in * d_out + (d_out if module.bias is not None else 0)
    weight = linear_weight(module)[0]
    result = comq_quantize(weight, calibration.gram(module, name=name), COMQConfig(bits=bits))
    error = _relative(calibration, name, module, result.dequantize(dtype=torch.float64))
    return Candidate(f"int{bits}", bits, params, quantized_nbytes(module, bits), 2 * d_in * d_out, error, result)


def layer_candidates(
    name: str, module: nn.Module, calibration: Calibration, families: Sequence[str]
) -> list[Candidate]:
    """Every candidate of ``families`` for one dense linear layer, the dense one first."""
    d_in, d_out = linear_shape(module)
    size = linear_weight(module)[0].element_size()
    params = d_in * d_out + (d_out if module.bias is not None else 0)
    flops = 2 * d_in * d_out
    out = [Candidate("dense", 0, params, params * size, flops, 0.0)]
    for family in families:
        if family == "lowrank":
            out += _low_rank(name, module, calibration, size)
        elif family in ("kron", "tt"):
            out += _structured(name, module, calibration, size, family)
        else:
            out.append(_quantized(name, module, calibration, BITS[family]))
    return out


def _pick(options: Sequence[Sequence[Candidate]], kind: str, lam: float) -> list[int]:
    return [min(range(len(c)), key=lambda i: (c[i].error + lam * c[i].cost(kind), c[i].cost(kind))) for c in options]


def _total(options: Sequence[Sequence[Candidate]], picks: Sequence[int], kind: str) -> float:
    return sum(c[i].cost(kind) for c, i in zip(options, picks, strict=True))


def _error(options: Sequence[Sequence[Candidate]], picks: Sequence[int]) -> float:
    return sum(c[i].error for c, i in zip(options, picks, strict=True))


def uniform_choices(options: Sequence[Sequence[Candidate]], kind: str, limit: float) -> list[list[int]]:
    """The picks of every (family, setting) that every layer offers, e.g. 4 bits everywhere, that fit ``limit``."""
    keys = set.intersection(*({(c.family, c.setting) for c in choices} for choices in options))
    uniforms = []
    for key in sorted(keys):
        picks = [next(i for i, c in enumerate(choices) if (c.family, c.setting) == key) for choices in options]
        if _total(options, picks, kind) <= limit:
            uniforms.append(picks)
    return uniforms


def choose(options: Sequence[Sequence[Candidate]], kind: str, limit: float) -> list[int]:
    """The index of one candidate per layer whose costs sum to at most ``limit`` with small summed error.

    Raises:
        ValueError: even the cheapest candidate of every layer costs more than ``limit``.
    """
    cheapest = [min(range(len(c)), key=lambda i: c[i].cost(kind)) for c in options]
    floor = _total(options, cheapest, kind)
    if floor > limit:
        raise ValueError(f"the budget of {limit:,.0f} {kind} is below {floor:,.0f}, the least these families reach")
    low, high = 0.0, 1.0
    while _total(options, _pick(options, kind, high), kind) > limit:
        high *= 4
        if high > 1e30:
            return cheapest
    for _ in range(60):  # bisection: the smallest λ whose picks fit
        mid = (low + high) / 2
        low, high = (low, mid) if _total(options, _pick(options, kind, mid), kind) <= limit else (mid, high)
    picks = min([_pick(options, kind, high), *uniform_choices(options, kind, limit)], key=lambda p: _error(options, p))
    used = _total(options, picks, kind)
    improved = True
    while improved:  # spend what is left on the single swap that lowers the error most
        improved, best = False, None
        for layer, choices in enumerate(options):
            now = choices[picks[layer]]
            for i, cand in enumerate(choices):
                extra = cand.cost(kind) - now.cost(kind)
                if cand.error < now.error and used + extra <= limit:
                    gain = now.error - cand.error
                    if best is None or gain > best[0]:
                        best = (gain, layer, i, extra)
        if best is not None:
            _, layer, i, extra = best
            picks[layer], used, improved = i, used + extra, True
    return picks


def single_family_plans(options: Sequence[Sequence[Candidate]], kind: str, limit: float) -> dict[str, list[Candidate]]:
    """Each family alone under ``limit``: its per-layer choice (:func:`choose` over that family and dense) and its
    costliest setting shared by every layer that fits (e.g. ``"int4 everywhere"``), one candidate per layer."""
    families = dict.fromkeys(c.family for choices in options for c in choices if c.family != "dense")
    plans: dict[str, list[Candidate]] = {}
    for family in families:
        only = [[c for c in choices if c.family in ("dense", family)] for choices in options]
        try:
            picks = choose(only, kind, limit)
        except ValueError:
            continue  # this family alone cannot reach the budget
        plans[f"{family} per layer"] = [choices[i] for choices, i in zip(only, picks, strict=True)]
    costliest: dict[str, list[int]] = {}
    for picks in uniform_choices(options, kind, limit):
        family, best = options[0][picks[0]].family, costliest.get(options[0][picks[0]].family)
        if family != "dense" and (best is None or _total(options, picks, kind) > _total(options, best, kind)):
            costliest[family] = picks
    for family, picks in costliest.items():
        setting = options[0][picks[0]].setting
        plans[f"{family} {setting} everywhere"] = [choices[i] for choices, i in zip(options, picks, strict=True)]
    return plans
