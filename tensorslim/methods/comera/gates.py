"""CoMERA rank gates: size accounting, the L1 penalty, physical truncation of dead ranks and the rank report.

CoMERA (Yang et al., NeurIPS 2024, arXiv 2405.14377), rank-adaptive training, replaces the TT/TTM cores
``[[G_1, …, G_d]]`` by ``[[G_1 D_1 G_2 … D_{d-1} G_d]]`` with diagonal ``D_k = diag(d_k)`` (§3). A rank is
pruned when its gate falls to ≤ 1e-2. The official code only masks dead ranks; here
:func:`truncate_` slices them out of the cores so the compute and memory savings are real (the official
``update_factors`` exists but is never called).

Gated layers are the TT/TTM layers and, beyond the paper, gated CoLA/SVD :class:`LowRankLinear` layers (one gate on
the rank-r latent): a low-rank layer ``B σ(A x)`` is the two-core chain ``[[A^T, B^T]]`` with modes
``(d_in, d_out)`` and ranks ``(1, r, 1)``, so every function here treats it as such.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tensorslim.layers.lowrank import LowRankLinear
from tensorslim.layers.tt import TTLinear
from tensorslim.layers.tt_embedding import TTEmbedding

TTLayer = TTLinear | TTEmbedding
GatedLayer = TTLinear | TTEmbedding | LowRankLinear


def tt_layers(model: nn.Module) -> list[tuple[str, TTLayer]]:
    """Every TT linear and TTM embedding in ``model``, by qualified name."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, TTLinear | TTEmbedding)]


def gated_layers(model: nn.Module) -> list[tuple[str, GatedLayer]]:
    """The layers rank gates apply to, by qualified name: every TT/TTM layer, and every :class:`LowRankLinear` that
    carries a gate (a gate-less low-rank layer is not rank-adaptive: :func:`enable_gates` leaves it alone)."""
    return [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, TTLinear | TTEmbedding) or (isinstance(m, LowRankLinear) and m.gated)
    ]


def layer_gates(layer: GatedLayer) -> list[torch.Tensor]:
    """The layer's gate vectors, one per internal bond (empty when none are attached)."""
    if isinstance(layer, LowRankLinear):
        return [layer.gate] if layer.gated else []
    return list(layer.gates)


def bond_ranks(layer: GatedLayer) -> tuple[int, ...]:
    """The stored ranks with boundary 1s: a TT layer's core ranks, ``(1, r, 1)`` for a low-rank layer."""
    return (1, layer.rank, 1) if isinstance(layer, LowRankLinear) else layer.ranks


def enable_gates(model: nn.Module, *, threshold: float = 1e-2) -> int:
    """Attach all-ones gates to every gated layer (every TT/TTM layer; low-rank layers keep the gates they were built
    with); returns the number of gate entries."""
    for _, layer in gated_layers(model):
        layer.enable_gates(threshold=threshold)
    return sum(g.numel() for _, layer in gated_layers(model) for g in layer_gates(layer))


def mode_sizes(layer: GatedLayer) -> tuple[int, ...]:
    """Per-core mode size: ``n_k`` for TT, ``m_k·n_k`` for TTM (the official ``compute_size`` used ``m_k`` only for
    TTM cores, undercounting the embedding), ``(d_in, d_out)`` for low rank."""
    if isinstance(layer, LowRankLinear):
        return (layer.in_features, layer.out_features)
    if isinstance(layer, TTEmbedding):
        return tuple(m * n for m, n in zip(layer.row_factors, layer.col_factors, strict=True))
    return layer.in_factors + layer.out_factors


def active_ranks(layer: GatedLayer) -> tuple[int, ...]:
    """``(1, R_1, …, R_{d-1}, 1)`` with ``R_k = #{d_k > threshold}`` (the core ranks when no gates are attached)."""
    gates = layer_gates(layer)
    if not gates:
        return bond_ranks(layer)
    return (1, *(int((gate > layer.gate_threshold).sum()) for gate in gates), 1)


def layer_size(layer: GatedLayer, ranks: tuple[int, ...] | None = None) -> int:
    """CoMERA's size ``Σ_k size_k R_{k-1} R_k``, and 0 when any bond is dead (the layer is exactly zero)."""
    ranks = ranks or active_ranks(layer)
    if min(ranks) == 0:
        return 0
    return sum(r0 * n * r1 for r0, n, r1 in zip(ranks[:-1], mode_sizes(layer), ranks[1:], strict=True))


def layer_size_tensor(layer: GatedLayer) -> torch.Tensor:
    """:func:`layer_size` as tensor ops only (no ``.item()``), so it can live inside a captured CUDA graph."""
    gates = layer_gates(layer)
    device = next(layer.parameters()).device
    if not gates:
        return torch.full((), float(layer_size(layer)), device=device)  # a fill kernel, no host-to-device copy
    one = torch.ones((), device=device)
    ranks = [one, *((gate > layer.gate_threshold).sum().float() for gate in gates), one]
    size = sum(r0 * n * r1 for r0, n, r1 in zip(ranks[:-1], mode_sizes(layer), ranks[1:], strict=True))
    alive = torch.stack(ranks).min() > 0
    return size * alive


def model_size(model: nn.Module) -> torch.Tensor:
    """``S(D)``: the summed size of every gated layer (a 0-dim tensor, no gradient)."""
    with torch.no_grad():
        sizes = [layer_size_tensor(layer) for _, layer in gated_layers(model)]
        return torch.stack(sizes).sum() if sizes else torch.zeros(())


def gate_penalty(model: nn.Module) -> torch.Tensor:
    """CoMERA's rank penalty ``R(D) = Σ thr(d_kj) / #{d_kj > threshold}`` over all gates of the model
    (§3; official ``MNLI_trainer.py`` L256-270): the mean value of the active gates, differentiable in the gates."""
    total, count = [], []
    for _, layer in gated_layers(model):
        for gate in layer_gates(layer):
            total.append(torch.nn.functional.threshold(gate, layer.gate_threshold, 0.0).sum())
            count.append((gate > layer.gate_threshold).sum())
    if not total:
        raise ValueError("the model has no rank gates; call tensorslim.methods.comera.enable_gates(model) first")
    return torch.stack(total).sum() / torch.stack(count).sum().clamp(min=1)


def _cut(tensor: torch.Tensor, first: torch.Tensor | None, last: torch.Tensor | None) -> torch.Tensor:
    if first is not None:
        tensor = tensor.index_select(0, first)
    if last is not None:
        tensor = tensor.index_select(tensor.ndim - 1, last)
    return tensor.contiguous()


def _slice_param_(
    owner: nn.Module,
    name: str,
    first: torch.Tensor | None,
    last: torch.Tensor | None,
    optimizer: torch.optim.Optimizer | None,
) -> None:
    """Replace the parameter ``owner.<name>`` (a module attribute, or entry ``"k"`` of a ``ParameterList``) by its
    slice and move the optimizer's reference and moment estimates along.

    A new Parameter is needed: changing a leaf's shape through ``.data`` leaves autograd's cached gradient
    accumulator expecting the old shape.
    """
    old = getattr(owner, name)
    new = nn.Parameter(_cut(old.detach(), first, last), requires_grad=old.requires_grad)
    setattr(owner, name, new)
    if optimizer is None:
        return
    for group in optimizer.param_groups:
        group["params"] = [new if p is old else p for p in group["params"]]
    if old in optimizer.state:
        state = optimizer.state.pop(old)
        optimizer.state[new] = {
            key: _cut(value, first, last) if isinstance(value, torch.Tensor) and value.shape == old.shape else value
            for key, value in state.items()
        }


def _keep_ranks_(layer: GatedLayer, keep: list[torch.Tensor], optimizer: torch.optim.Optimizer | None) -> None:
    """Keep the rank indices ``keep[k]`` of every internal bond ``k``: the slices of the cores (TT) or of A's rows
    and B's columns (low rank) on both sides of the bond, and of its gate."""
    if isinstance(layer, LowRankLinear):
        _slice_param_(layer, "weight_a", keep[0], None, optimizer)  # (r, d_in)
        _slice_param_(layer, "weight_b", None, keep[0], optimizer)  # (d_out, r)
        if layer.gated:
            _slice_param_(layer, "gate", keep[0], None, optimizer)
        layer.rank = len(keep[0])
        return
    for k in range(len(layer.cores)):
        first = keep[k - 1] if k > 0 else None
        last = keep[k] if k < len(keep) else None
        _slice_param_(layer.cores, str(k), first, last, optimizer)
    for k in range(len(layer.gates)):
        _slice_param_(layer.gates, str(k), keep[k], None, optimizer)


@torch.no_grad()
def truncate_layer_(layer: GatedLayer, *, optimizer: torch.optim.Optimizer | None = None) -> tuple[int, ...]:
    """Remove the ranks whose gates are ≤ threshold from cores (or low-rank factors) and gates; the output is
    unchanged (dead ranks contribute exactly zero). A low-rank layer whose every rank died keeps one dead rank, so it
    stays a layer of rank ≥ 1 that a saved config can rebuild; its size is still 0. Returns the new ranks. Cores and
    gates become new Parameters; pass the optimizer so its groups point at them and its moment estimates are sliced
    the same way."""
    gates = layer_gates(layer)
    if not gates:
        return bond_ranks(layer)
    keep = [torch.nonzero(gate > layer.gate_threshold).flatten() for gate in gates]
    if isinstance(layer, LowRankLinear) and len(keep[0]) == 0:
        keep = [gates[0].argmax().view(1)]  # one dead rank (an exact zero map) keeps it a valid rank >= 1 layer
    if all(len(alive) == gate.numel() for alive, gate in zip(keep, gates, strict=True)):
        return bond_ranks(layer)
    _keep_ranks_(layer, keep, optimizer)
    return bond_ranks(layer)


def truncate_(model: nn.Module, *, optimizer: torch.optim.Optimizer | None = None) -> dict[str, tuple[int, ...]]:
    """:func:`truncate_layer_` on every gated layer; returns ``{name: new ranks}``."""
    return {name: truncate_layer_(layer, optimizer=optimizer) for name, layer in gated_layers(model)}


@torch.no_grad()
def resize_ranks_(
    model: nn.Module, ranks: dict[str, list[int]], *, optimizer: torch.optim.Optimizer | None = None
) -> None:
    """Give every named gated layer the ranks ``ranks[name]`` (with boundary 1s) by keeping the first ``R_k`` slices
    per bond.

    Used on resume: a checkpoint written after :func:`truncate_` holds smaller cores than a freshly built model, so
    the fresh model is cut to the stored ranks (values are irrelevant, the checkpoint's weights are loaded next).

    Raises:
        ValueError: a name is not a gated layer of ``model``, or a rank exceeds the layer's current rank.
    """
    layers = dict(gated_layers(model))
    for name, wanted in ranks.items():
        layer = layers.get(name)
        current = None if layer is None else bond_ranks(layer)
        if (
            current is None
            or len(wanted) != len(current)
            or any(not 0 <= w <= r for w, r in zip(wanted[1:-1], current[1:-1], strict=True))
        ):
            raise ValueError(
                f"cannot resize {name!r} (ranks {None if current is None else list(current)}) to ranks {list(wanted)}"
            )
        if tuple(wanted) == current:
            continue
        device = next(layer.parameters()).device
        _keep_ranks_(layer, [torch.arange(w, device=device) for w in wanted[1:-1]], optimizer)


@torch.no_grad()
def prune_to_size_(model: nn.Module, target: float) -> int:
    """Kill the smallest active gates, globally, until ``S(D) ≤ target``; returns how many were killed.

    Not in CoMERA: the official late stage reaches the target only indirectly through the λ-switched penalty. Used
    (optionally) after the late stage so the reported size lands on the requested ratio.
    """
    layers = [layer for _, layer in gated_layers(model) if layer_gates(layer)]
    entries = sorted(
        (float(gate[j]), i, k, j)
        for i, layer in enumerate(layers)
        for k, gate in enumerate(layer_gates(layer))
        for j in range(gate.numel())
        if gate[j] > layer.gate_threshold
    )
    sizes = [layer_size(layer) for layer in layers]
    total = float(model_size(model))  # includes gate-less layers, whose size never changes here
    killed = 0
    for _, i, k, j in entries:
        if total <= target:
            break
        layer = layers[i]
        layer_gates(layer)[k][j] = 0.0
        new = layer_size(layer)
        total += new - sizes[i]
        sizes[i] = new
        killed += 1
    return killed


@dataclass(frozen=True)
class RankRow:
    name: str
    kind: str
    shape: str
    ranks: tuple[int, ...]
    size: int
    dense: int


def rank_report(model: nn.Module) -> list[RankRow]:
    """Per-layer active ranks and size (the paper's "ranks of encoder block 5" table, for every layer)."""
    rows = []
    for name, layer in gated_layers(model):
        if isinstance(layer, TTEmbedding):
            shape, dense = f"{layer.num_embeddings}x{layer.embedding_dim}", layer.num_embeddings * layer.embedding_dim
        else:
            shape, dense = f"{layer.in_features}x{layer.out_features}", layer.in_features * layer.out_features
        rows.append(RankRow(name, type(layer).__name__, shape, active_ranks(layer), layer_size(layer), dense))
    return rows


def format_rank_report(rows: list[RankRow], *, title: str = "") -> str:
    """A plain-text table of :func:`rank_report`."""
    lines = [title] if title else []
    lines.append(f"{'layer':<44} {'kind':<12} {'shape':<12} {'ranks':<28} {'size':>9} {'ratio':>8}")
    for row in rows:
        ratio = f"{row.dense / row.size:.1f}x" if row.size else "removed"
        lines.append(
            f"{row.name:<44} {row.kind:<12} {row.shape:<12} {str(list(row.ranks)):<28} {row.size:>9,} {ratio:>8}"
        )
    size, dense = sum(r.size for r in rows), sum(r.dense for r in rows)
    lines.append(f"total tensorized size {size:,} vs dense {dense:,} ({dense / max(size, 1):.1f}x)")
    return "\n".join(lines)
