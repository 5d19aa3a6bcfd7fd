"""CoMERA rank gates: size accounting, the L1 penalty, physical truncation of dead ranks and the rank report.

CoMERA (Yang et al., NeurIPS 2024, arXiv 2405.14377), rank-adaptive training, replaces the TT/TTM cores
``[[G_1, …, G_d]]`` by ``[[G_1 D_1 G_2 … D_{d-1} G_d]]`` with diagonal ``D_k = diag(d_k)`` (§3). A rank is
pruned when its gate falls to ≤ 1e-2. The official code only masks dead ranks; here
:func:`truncate_` slices them out of the cores so the compute and memory savings are real (the official
``update_factors`` exists but is never called).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tensorslim.layers.tt import TTLinear
from tensorslim.layers.tt_embedding import TTEmbedding

TTLayer = TTLinear | TTEmbedding


def tt_layers(model: nn.Module) -> list[tuple[str, TTLayer]]:
    """Every TT linear and TTM embedding in ``model``, by qualified name."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, TTLinear | TTEmbedding)]


def enable_gates(model: nn.Module, *, threshold: float = 1e-2) -> int:
    """Attach all-ones gates to every TT/TTM layer; returns the number of gate entries."""
    for _, layer in tt_layers(model):
        layer.enable_gates(threshold=threshold)
    return sum(g.numel() for _, layer in tt_layers(model) for g in layer.gates)


def mode_sizes(layer: TTLayer) -> tuple[int, ...]:
    """Per-core mode size: ``n_k`` for TT, ``m_k·n_k`` for TTM (the official ``compute_size`` used ``m_k`` only for
    TTM cores, undercounting the embedding)."""
    if isinstance(layer, TTEmbedding):
        return tuple(m * n for m, n in zip(layer.row_factors, layer.col_factors, strict=True))
    return layer.in_factors + layer.out_factors


def active_ranks(layer: TTLayer) -> tuple[int, ...]:
    """``(1, R_1, …, R_{d-1}, 1)`` with ``R_k = #{d_k > threshold}`` (the core ranks when no gates are attached)."""
    if len(layer.gates) == 0:
        return layer.ranks
    return (1, *(int((gate > layer.gate_threshold).sum()) for gate in layer.gates), 1)


def layer_size(layer: TTLayer, ranks: tuple[int, ...] | None = None) -> int:
    """CoMERA's size ``Σ_k size_k R_{k-1} R_k``, and 0 when any bond is dead (the layer is exactly zero)."""
    ranks = ranks or active_ranks(layer)
    if min(ranks) == 0:
        return 0
    return sum(r0 * n * r1 for r0, n, r1 in zip(ranks[:-1], mode_sizes(layer), ranks[1:], strict=True))


def layer_size_tensor(layer: TTLayer) -> torch.Tensor:
    """:func:`layer_size` as tensor ops only (no ``.item()``), so it can live inside a captured CUDA graph."""
    device = layer.cores[0].device
    if len(layer.gates) == 0:
        return torch.full((), float(layer_size(layer)), device=device)  # a fill kernel, no host-to-device copy
    one = torch.ones((), device=device)
    ranks = [one, *((gate > layer.gate_threshold).sum().float() for gate in layer.gates), one]
    size = sum(r0 * n * r1 for r0, n, r1 in zip(ranks[:-1], mode_sizes(layer), ranks[1:], strict=True))
    alive = torch.stack(ranks).min() > 0
    return size * alive


def model_size(model: nn.Module) -> torch.Tensor:
    """``S(D)``: the summed size of every TT/TTM layer (a 0-dim tensor, no gradient)."""
    with torch.no_grad():
        sizes = [layer_size_tensor(layer) for _, layer in tt_layers(model)]
        return torch.stack(sizes).sum() if sizes else torch.zeros(())


def gate_penalty(model: nn.Module) -> torch.Tensor:
    """CoMERA's rank penalty ``R(D) = Σ thr(d_kj) / #{d_kj > threshold}`` over all gates of the model
    (§3; official ``MNLI_trainer.py`` L256-270): the mean value of the active gates, differentiable in the gates."""
    total, count = [], []
    for _, layer in tt_layers(model):
        for gate in layer.gates:
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
    params: nn.ParameterList,
    k: int,
    first: torch.Tensor | None,
    last: torch.Tensor | None,
    optimizer: torch.optim.Optimizer | None,
) -> None:
    """Replace ``params[k]`` by its slice and move the optimizer's reference and moment estimates along.

    A new Parameter is needed: changing a leaf's shape through ``.data`` leaves autograd's cached gradient
    accumulator expecting the old shape.
    """
    old = params[k]
    new = nn.Parameter(_cut(old.detach(), first, last), requires_grad=old.requires_grad)
    params[k] = new
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


@torch.no_grad()
def truncate_layer_(layer: TTLayer, *, optimizer: torch.optim.Optimizer | None = None) -> tuple[int, ...]:
    """Remove the ranks whose gates are ≤ threshold from cores and gates; the output is unchanged (dead ranks
    contribute exactly zero). Returns the new ranks. Cores and gates become new Parameters; pass the optimizer so
    its groups point at them and its moment estimates are sliced the same way."""
    if len(layer.gates) == 0:
        return layer.ranks
    keep = [torch.nonzero(gate > layer.gate_threshold).flatten() for gate in layer.gates]
    if all(len(alive) == gate.numel() for alive, gate in zip(keep, layer.gates, strict=True)):
        return layer.ranks
    for k in range(len(layer.cores)):
        first = keep[k - 1] if k > 0 else None
        last = keep[k] if k < len(keep) else None
        _slice_param_(layer.cores, k, first, last, optimizer)
    for k, alive in enumerate(keep):
        _slice_param_(layer.gates, k, alive, None, optimizer)
    return layer.ranks


def truncate_(model: nn.Module, *, optimizer: torch.optim.Optimizer | None = None) -> dict[str, tuple[int, ...]]:
    """:func:`truncate_layer_` on every TT/TTM layer; returns ``{name: new ranks}``."""
    return {name: truncate_layer_(layer, optimizer=optimizer) for name, layer in tt_layers(model)}


@torch.no_grad()
def resize_ranks_(
    model: nn.Module, ranks: dict[str, list[int]], *, optimizer: torch.optim.Optimizer | None = None
) -> None:
    """Give every named TT/TTM layer the core ranks ``ranks[name]`` by keeping the first ``R_k`` slices per bond.

    Used on resume: a checkpoint written after :func:`truncate_` holds smaller cores than a freshly built model, so
    the fresh model is cut to the stored ranks (values are irrelevant, the checkpoint's weights are loaded next).

    Raises:
        ValueError: a name is not a TT/TTM layer of ``model``, or a rank exceeds the layer's current rank.
    """
    layers = dict(tt_layers(model))
    for name, wanted in ranks.items():
        layer = layers.get(name)
        if (
            layer is None
            or len(wanted) != len(layer.ranks)
            or any(not 0 <= w <= r for w, r in zip(wanted[1:-1], layer.ranks[1:-1], strict=True))
        ):
            current = None if layer is None else list(layer.ranks)
            raise ValueError(f"cannot resize {name!r} (ranks {current}) to ranks {list(wanted)}")
        if tuple(wanted) == layer.ranks:
            continue
        keep = [torch.arange(w, device=layer.cores[0].device) for w in wanted[1:-1]]
        for k in range(len(layer.cores)):
            _slice_param_(layer.cores, k, keep[k - 1] if k > 0 else None, keep[k] if k < len(keep) else None, optimizer)
        for k in range(len(layer.gates)):
            _slice_param_(layer.gates, k, keep[k], None, optimizer)


@torch.no_grad()
def prune_to_size_(model: nn.Module, target: float) -> int:
    """Kill the smallest active gates, globally, until ``S(D) ≤ target``; returns how many were killed.

    Not in CoMERA: the official late stage reaches the target only indirectly through the λ-switched penalty. Used
    (optionally) after the late stage so the reported size lands on the requested ratio.
    """
    layers = [layer for _, layer in tt_layers(model) if len(layer.gates)]
    entries = sorted(
        (float(gate[j]), i, k, j)
        for i, layer in enumerate(layers)
        for k, gate in enumerate(layer.gates)
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
        layer.gates[k][j] = 0.0
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
    for name, layer in tt_layers(model):
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
