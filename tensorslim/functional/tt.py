"""Stateless tensor-train contractions for CoMERA's TT linear layers and TTM embeddings.

CoMERA (Yang et al., NeurIPS 2024, arXiv 2405.14377), "contraction path optimization" (paper Fig. 11) and the
"optimized tensorized embedding" and the official ``layers.py``:

* **TT linear** (3-way cores, input modes first). The middle bond separates input and output modes, so
  ``W = L · R`` with ``L = (G_1 … G_d) ∈ R^{d_in×r_d}`` and ``R = (G_{d+1} … G_{2d}) ∈ R^{r_d×d_out}``. ``L`` and
  ``R`` are token-independent and tiny; the token-dependent work is two skinny GEMMs ``(x L) R``. ``W`` is never
  formed. The order in which each half-chain is contracted is chosen by FLOP count (a matrix-chain dynamic
  program over the cores, planned once per shape and cached) — the official code hard-codes left-to-right.
* **TTM embedding** (4-way cores). The chain is split into two half-tables (token-independent); a row is one small
  GEMM between a row of each half-table, computed once per *distinct* id (``torch.unique``). The official
  ``TensorizedEmbedding_order4`` handles order 4 only and hard-codes CUDA index buffers; here any order ≥ 2 works and
  indices are computed on the ids' device.

Backward: the token-dependent GEMMs of the TT linear layer have a hand-written backward (:class:`_FactoredMatmul`,
saving only ``x`` and the latent ``x L`` as the official ``TT_forward.backward`` does, the latent kept transposed); the
tiny token-independent chains that build ``L`` and ``R`` have one too (:class:`_TTFactors`, which the layers use;
:func:`tt_linear_factors` leaves them to autograd). Either way any number of cores works (the official generic loop
has an indexing bug for d ≥ 4). The embedding lookup has a hand-written backward for its gathers
(:class:`_HalfTableLookup`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.utils._python_dispatch import _get_current_dispatch_mode

from tensorslim.functional.threads import one_thread

# A contraction tree over a run of cores: a leaf is a core index, a node is (left subtree, right subtree).
Tree = int | tuple["Tree", "Tree"]


@lru_cache(maxsize=4096)
def plan_chain(sizes: tuple[int, ...], ranks: tuple[int, ...]) -> tuple[Tree, int]:
    """The cheapest order to contract a run of TT/TTM cores into one core, and its FLOPs.

    Merging adjacent segments ``(r_a, N_1, r_b)`` and ``(r_b, N_2, r_c)`` is one GEMM of
    ``2·r_a·N_1·r_b·N_2·r_c`` FLOPs (``N`` = product of the segment's mode sizes; for TTM cores ``m_k·n_k``).
    Choosing the merge order is the matrix-chain problem, solved by dynamic programming in O(k³).

    Args:
        sizes: per-core mode size (``n_k`` for TT, ``m_k·n_k`` for TTM), length k.
        ranks: bond ranks around the run, length k+1.

    Returns:
        ``(tree, flops)``; the result is cached, so a layer pays for planning once per shape.
    """
    k = len(sizes)
    prefix = [1]
    for size in sizes:
        prefix.append(prefix[-1] * size)
    cost: dict[tuple[int, int], tuple[int, Tree]] = {(i, i): (0, i) for i in range(k)}
    for length in range(2, k + 1):
        for i in range(k - length + 1):
            j = i + length - 1
            best: tuple[int, Tree] | None = None
            for s in range(i, j):
                left_n, right_n = prefix[s + 1] // prefix[i], prefix[j + 1] // prefix[s + 1]
                flops = (
                    cost[i, s][0] + cost[s + 1, j][0] + 2 * ranks[i] * left_n * ranks[s + 1] * right_n * ranks[j + 1]
                )
                if best is None or flops < best[0]:
                    best = (flops, (cost[i, s][1], cost[s + 1, j][1]))
            cost[i, j] = best
    flops, tree = cost[0, k - 1]
    return tree, flops


def _merge_tt(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(r_a, N_a, r_b) × (r_b, N_b, r_c) → (r_a, N_a·N_b, r_c)`` with one GEMM (row-major mode order kept)."""
    r_a, n_a, r_b = a.shape
    _, n_b, r_c = b.shape
    return (a.reshape(r_a * n_a, r_b) @ b.reshape(r_b, n_b * r_c)).reshape(r_a, n_a * n_b, r_c)


def _merge_ttm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(r_a, M_a, N_a, r_b) × (r_b, M_b, N_b, r_c) → (r_a, M_a·M_b, N_a·N_b, r_c)`` with one GEMM."""
    r_a, m_a, n_a, r_b = a.shape
    _, m_b, n_b, r_c = b.shape
    merged = (a.reshape(r_a * m_a * n_a, r_b) @ b.reshape(r_b, m_b * n_b * r_c)).reshape(r_a, m_a, n_a, m_b, n_b, r_c)
    return merged.permute(0, 1, 3, 2, 4, 5).reshape(r_a, m_a * m_b, n_a * n_b, r_c)


def _run_tree(tree: Tree, cores: Sequence[torch.Tensor], merge) -> torch.Tensor:
    if isinstance(tree, int):
        return cores[tree]
    return merge(_run_tree(tree[0], cores, merge), _run_tree(tree[1], cores, merge))


def contract_tt(cores: Sequence[torch.Tensor]) -> torch.Tensor:
    """Contract 3-way cores ``(r_{k-1}, n_k, r_k)`` into ``(r_first, ∏ n_k, r_last)`` along the cheapest path."""
    sizes = tuple(core.shape[1] for core in cores)
    ranks = (cores[0].shape[0], *(core.shape[-1] for core in cores))
    tree, _ = plan_chain(sizes, ranks)
    return _run_tree(tree, cores, _merge_tt)


def contract_ttm(cores: Sequence[torch.Tensor]) -> torch.Tensor:
    """Contract 4-way cores ``(r_{k-1}, m_k, n_k, r_k)`` into ``(r_first, ∏ m_k, ∏ n_k, r_last)``."""
    sizes = tuple(core.shape[1] * core.shape[2] for core in cores)
    ranks = (cores[0].shape[0], *(core.shape[-1] for core in cores))
    tree, _ = plan_chain(sizes, ranks)
    return _run_tree(tree, cores, _merge_ttm)


def apply_gates(
    cores: Sequence[torch.Tensor], gates: Sequence[torch.Tensor], *, threshold: float
) -> list[torch.Tensor]:
    """CoMERA's diagonal rank controls (§2.1): ``G̃_k = G_k · diag(thr(d_k))`` on the last mode of every core
    but the last, ``thr(d) = d if d > threshold else 0``. Gates get gradients through the multiply."""
    if not gates:
        return list(cores)
    if len(gates) != len(cores) - 1:
        raise ValueError(f"got {len(gates)} gate vectors for {len(cores)} cores; need one per internal bond")
    gated = [core * F.threshold(gate, threshold, 0.0) for core, gate in zip(cores[:-1], gates, strict=True)]
    return [*gated, cores[-1]]


def tt_factors_many(
    layers: Sequence[tuple[Sequence[torch.Tensor], int]], *, single_thread: bool
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """:func:`tt_linear_factors` of several layers, given as ``(cores, n_in)``, with a written-out backward
    (:class:`_TTFactors`); ``single_thread`` runs forward and backward on one thread."""
    layout = tuple((len(cores), n_in) for cores, n_in in layers)
    flat = _TTFactors.apply(layout, single_thread, *(core for cores, _ in layers for core in cores))
    return [(flat[2 * i], flat[2 * i + 1]) for i in range(len(layers))]


def tt_linear_factors(cores: Sequence[torch.Tensor], *, n_in: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``L (d_in, r_mid)`` and ``R (r_mid, d_out)`` of a CoMERA TT layer (``W = L R``), both tiny."""
    left = contract_tt(cores[:n_in])  # (1, d_in, r_mid)
    right = contract_tt(cores[n_in:])  # (r_mid, d_out, 1)
    return left.reshape(left.shape[1], left.shape[2]), right.reshape(right.shape[0], right.shape[1])


@lru_cache(maxsize=4096)
def _chain_steps(sizes: tuple[int, ...], ranks: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """:func:`plan_chain`'s tree as merges in evaluation order: step ``j`` merges values ``(a, b)`` into value
    ``k + j`` (values ``0..k-1`` are the cores)."""
    tree, _ = plan_chain(sizes, ranks)
    steps: list[tuple[int, int]] = []

    def visit(node: Tree) -> int:
        if isinstance(node, int):
            return node
        left, right = visit(node[0]), visit(node[1])
        steps.append((left, right))
        return len(sizes) + len(steps) - 1

    visit(tree)
    return tuple(steps)


def _merge_tt_backward(
    a: torch.Tensor, b: torch.Tensor, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:  # the two GEMMs of _merge_tt's backward
    r_a, n_a, r_b = a.shape
    _, n_b, r_c = b.shape
    g = grad.reshape(r_a * n_a, n_b * r_c)
    grad_a = g @ b.reshape(r_b, n_b * r_c).t()  # (r_a·n_a, r_b)
    grad_b = a.reshape(r_a * n_a, r_b).t() @ g  # (r_b, n_b·r_c)
    return grad_a.reshape(a.shape), grad_b.reshape(b.shape)


class _TTFactors(torch.autograd.Function):
    """``(L, R)`` of one or more TT linear layers from their (gated) cores, forward and backward written out.

    Each half-chain is contracted along :func:`plan_chain`'s order; forward keeps every merge's result and backward
    runs the merges in reverse, two GEMMs each. Written out, a 768 × 768 layer's two half-chains cost a handful of
    tensor ops instead of the dozens autograd records and replays, and with ``single`` both directions run on one
    thread (:func:`~tensorslim.functional.threads.one_thread`: the GEMMs are too small to gain from more).
    Under autocast the cores are cast to autocast's dtype first, as autograd's matmuls would cast them.
    """

    @staticmethod
    def forward(ctx, layout, single, *cores):  # layout: (n_cores, n_in) per layer; cores: (r_{k-1}, n_k, r_k)
        dtype = _compute_dtype(cores[0])
        cores = tuple(core.to(dtype) for core in cores)
        chains, outs, start = [], [], 0
        with one_thread() if single else nullcontext():
            for n_cores, n_in in layout:
                for lo, hi in ((start, start + n_in), (start + n_in, start + n_cores)):
                    chain = cores[lo:hi]
                    sizes = tuple(core.shape[1] for core in chain)
                    ranks = (chain[0].shape[0], *(core.shape[-1] for core in chain))
                    steps = _chain_steps(sizes, ranks)
                    values = list(chain)
                    for a, b in steps:
                        values.append(_merge_tt(values[a], values[b]))
                    chains.append((lo, steps, values[len(chain) :]))
                    outs.append(values[-1].clone() if not steps else values[-1])
                start += n_cores
        ctx.save_for_backward(*cores)
        ctx.chains, ctx.single = chains, single
        # (1, d_in, r) → (d_in, r); (r, d_out, 1) → (r, d_out)
        return tuple(
            out.reshape(out.shape[1], out.shape[2]) if i % 2 == 0 else out[..., 0] for i, out in enumerate(outs)
        )

    @staticmethod
    @once_differentiable
    def backward(ctx, *grad_outs):
        cores = ctx.saved_tensors
        grads: list[torch.Tensor | None] = [None] * len(cores)
        with one_thread() if ctx.single else nullcontext():
            for (lo, steps, merged), grad_out in zip(ctx.chains, grad_outs, strict=True):
                k = len(steps) + 1  # cores in this half-chain
                values = [*cores[lo : lo + k], *merged]
                value_grads: list[torch.Tensor | None] = [None] * len(values)
                value_grads[-1] = grad_out.to(values[-1].dtype).reshape(values[-1].shape)
                for j in range(len(steps) - 1, -1, -1):
                    a, b = steps[j]
                    value_grads[a], value_grads[b] = _merge_tt_backward(values[a], values[b], value_grads[k + j])
                for i in range(k):
                    grads[lo + i] = value_grads[i]
        return None, None, *grads


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype autocast would run a matmul on ``x`` in (``x.dtype`` outside autocast)."""
    device = x.device.type
    if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device) and x.is_floating_point():
        return torch.get_autocast_dtype(device)
    return x.dtype


# The token-dependent GEMMs of a TT layer have one side of width r ≈ 30. On CPU, oneDNN's matmul runs the
# token-parallel ones (tokens × d against a width-r side, either way) about 1.3× faster than MKL on one thread and
# splits them across threads better; its per-call set-up (about 16 µs) makes MKL the faster choice below a few dozen
# tokens (decoding). benchmarks/comera_layers.py times the layer (benchmarks/results/comera_layers_threads2.md).
# Training always takes oneDNN, whatever the batch: the two libraries round differently, and a path that switched
# with the number of tokens would make a data-parallel rank (half the tokens) drift from one process (all of them).
_ONEDNN_MIN_TOKENS = 64


@lru_cache(maxsize=1)
def _onednn_dtypes() -> tuple[torch.dtype, ...]:
    if not torch.backends.mkldnn.is_available():
        return ()
    return (torch.float32, torch.bfloat16) if torch.ops.mkldnn._is_mkldnn_bf16_supported() else (torch.float32,)


def _use_onednn(x: torch.Tensor, dtype: torch.dtype, *, training: bool) -> bool:
    # Not under a Python dispatch mode (FlopCounterMode, fake tensors): they know BLAS GEMMs, not oneDNN's op.
    return (
        _get_current_dispatch_mode() is None
        and x.device.type == "cpu"
        and (training or x.shape[0] >= _ONEDNN_MIN_TOKENS)
        and dtype in _onednn_dtypes()
    )


def _linear(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *, onednn: bool) -> torch.Tensor:
    """``a @ weightᵀ + bias`` for ``a (M, K)``, ``weight (N, K)``: oneDNN's matmul, or ``F.linear`` (BLAS).

    oneDNN reads a strided ``weight`` as it is, so a transposed view needs no copy (a transposed copy of a 512 × 128
    factor took about 0.1 ms, as long as oneDNN saved on the GEMM it feeds).
    """
    if onednn:
        return torch.ops.mkldnn._linear_pointwise(a, weight, bias, "none", [], "")
    return F.linear(a, weight, bias)


def token_sum_mm(a: torch.Tensor, b: torch.Tensor, *, pieces: int | None = None) -> torch.Tensor:
    """``aᵀ b`` for ``a (B, m)``, ``b (B, n)`` with ``m`` small: a sum over the B tokens.

    The token axis is cut into one slice per thread (``pieces``, default torch's CPU thread count) and the slices'
    ``(m, n)`` products are one batched GEMM, then summed: BLAS splits a GEMM whose only long axis is the reduction
    axis poorly across threads (at 4,096 tokens × 768, two threads ran it 1.25× faster than one; sliced, 1.7×).
    """
    if pieces is None:
        pieces = torch.get_num_threads() if a.device.type == "cpu" else 1
    chunk = a.shape[0] // max(pieces, 1)
    if pieces <= 1 or chunk == 0:
        return a.t() @ b
    head = pieces * chunk
    a_head = a[:head].reshape(pieces, chunk, a.shape[1]).transpose(1, 2)  # (pieces, m, chunk)
    products = torch.bmm(a_head, b[:head].reshape(pieces, chunk, b.shape[1]))  # (pieces, m, n)
    # Summed by in-place adds, not .sum(0): an (m, n) add under PyTorch's grain size runs inline, while the
    # reduction over the whole (pieces, m, n) block opened a parallel region (tensorslim.functional.threads).
    out = products[0]
    for product in products[1:]:
        out.add_(product)
    if head < a.shape[0]:
        out.addmm_(a[head:].t(), b[head:])
    return out


class _FactoredMatmul(torch.autograd.Function):
    """``y_i = (x L_i) R_i + b_i`` for 2-D ``x`` and one or more factored weights that read it, with a hand-written
    backward (width-r GEMMs only).

    ``left`` is ``[L_1 … L_n]`` side by side, so one GEMM reads ``x`` for every latent and one GEMM forms ``∂x`` for
    all of them (CoMERA's q, k and v projections read the same input: one product of width 90 instead of three of
    width 30, and no sum of three ``∂x``). Four of the GEMMs are token-parallel (``x L``, ``T R + b``, ``∂y Rᵀ``,
    ``∂T Lᵀ``): on CPU in fp32 or bf16, from 64 tokens, they run on oneDNN's matmul, which ran them about 1.3× faster
    than MKL on one thread and split them across two threads better. The sums over tokens
    (``∂L = xᵀ ∂T``, ``∂R = Tᵀ ∂y``) run as one slice of tokens per thread (:func:`token_sum_mm`). The bias gradient
    comes out of the ``∂R`` GEMM: the latent gets a column of ones (no separate pass over ``∂y`` for a column sum).

    The token-dependent tensors saved are ``x`` and the latent ``T = x L`` (``B×Σr``), as in CoMERA, plus the small
    weight-side factors. Under autocast every operand is cast to autocast's dtype once in forward, so that backward
    (which runs outside autocast) multiplies tensors of one dtype; the gradients are cast back to each input's dtype
    by autograd.
    """

    @staticmethod
    def forward(ctx, x, left, ranks, onednn, *rest):  # x (B, d_in), left (d_in, Σr), rest: n rights, n biases
        dtype = _compute_dtype(x)
        n = len(ranks)
        x, left = x.to(dtype).contiguous(), left.to(dtype)
        rights = [right.to(dtype) for right in rest[:n]]
        biases = [None if bias is None else bias.to(dtype) for bias in rest[n:]]
        onednn = onednn and min(ranks) > 0  # oneDNN rejects an empty (pruned-to-zero) rank
        latent = _linear(x, left.t(), None, onednn=onednn)  # (B, Σr)
        latents = latent.split(ranks, dim=1)  # views (B, r_i)
        outs = [_linear(t, r.t(), b, onednn=onednn) for t, r, b in zip(latents, rights, biases, strict=True)]
        ctx.save_for_backward(x, left, latent, *rights)
        ctx.ranks, ctx.onednn, ctx.has_bias = ranks, onednn, [bias is not None for bias in biases]
        return tuple(outs)  # each (B, d_out_i)

    @staticmethod
    def backward(ctx, *grad_outs):  # grad_outs: each (B, d_out_i)
        x, left, latent, *rights = ctx.saved_tensors
        n, need = len(ctx.ranks), ctx.needs_input_grad
        grad_outs = [g.to(x.dtype).contiguous() for g in grad_outs]
        grad_latents = [_linear(g, r, None, onednn=ctx.onednn) for g, r in zip(grad_outs, rights, strict=True)]
        grad_latent = grad_latents[0] if n == 1 else torch.cat(grad_latents, 1)  # (B, Σr)
        grad_x = _linear(grad_latent, left, None, onednn=ctx.onednn) if need[0] else None  # (B, d_in)
        # (Σr, d_in), then transposed: a (r, B) @ (B, d) product ran faster than (d, B) @ (B, r) on one thread.
        grad_left = token_sum_mm(grad_latent, x).t() if need[1] else None  # (d_in, Σr)
        grad_rights, grad_biases = [None] * n, [None] * n
        for i, (t, g, has_bias) in enumerate(zip(latent.split(ctx.ranks, dim=1), grad_outs, ctx.has_bias, strict=True)):
            if need[4 + i] or (has_bias and need[4 + n + i]):
                rows = torch.cat([t, t.new_ones(t.shape[0], 1)], 1) if has_bias else t
                grad_rows = token_sum_mm(rows, g)  # (r_i[+1], d_out_i): ∂R_i and ∂b_i
                grad_rights[i] = grad_rows[: ctx.ranks[i]] if need[4 + i] else None
                grad_biases[i] = grad_rows[ctx.ranks[i]] if has_bias and need[4 + n + i] else None
        return grad_x, grad_left, None, None, *grad_rights, *grad_biases


def factored_linear(
    x: torch.Tensor, factors: Sequence[tuple[torch.Tensor, torch.Tensor]], biases: Sequence[torch.Tensor | None]
) -> list[torch.Tensor]:
    """``y_i = x L_i R_i + b_i`` for factored weights that read the same ``x`` (one GEMM reads ``x`` for all).

    Args:
        x: ``(..., d_in)``.
        factors: ``(L_i, R_i)`` pairs, ``L_i (d_in, r_i)``, ``R_i (r_i, d_out_i)``.
        biases: ``(d_out_i,)`` or None, one per pair.

    Returns:
        ``[(..., d_out_i)]``.
    """
    lefts = [left for left, _ in factors]
    left = lefts[0] if len(lefts) == 1 else torch.cat(lefts, 1)  # (d_in, Σr)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, left.shape[0])  # (B, d_in)
    ranks = tuple(lf.shape[1] for lf in lefts)
    onednn = _use_onednn(x2, _compute_dtype(x2), training=torch.is_grad_enabled())
    outs = _FactoredMatmul.apply(x2, left, ranks, onednn, *(right for _, right in factors), *biases)
    return [out.reshape(*lead, out.shape[1]) for out in outs]


def tt_linear(
    x: torch.Tensor, cores: Sequence[torch.Tensor], bias: torch.Tensor | None = None, *, n_in: int
) -> torch.Tensor:
    """``y = x W + b`` for a CoMERA TT weight, without forming ``W``.

    Args:
        x: ``(..., d_in)``.
        cores: ``2d`` (any number ≥ 2) cores ``(r_{k-1}, n_k, r_k)``, input modes first, ``r_0 = r_last = 1``.
        bias: optional ``(d_out,)``.
        n_in: how many leading cores carry input modes.

    Returns:
        ``(..., d_out)``, via the ``(..., r_mid)`` latent.
    """
    return factored_linear(x, [tt_linear_factors(cores, n_in=n_in)], [bias])[0]


def tt_linear_flops(in_factors: Sequence[int], out_factors: Sequence[int], ranks: Sequence[int], *, tokens: int) -> int:
    """Matmul FLOPs of :func:`tt_linear` on ``tokens`` rows, as ``torch.utils.flop_counter`` counts them (the bias
    add is not a matmul FLOP)."""
    n_in = len(in_factors)
    left = plan_chain(tuple(in_factors), tuple(ranks[: n_in + 1]))[1]
    right = plan_chain(tuple(out_factors), tuple(ranks[n_in:]))[1]
    d_in, d_out = math.prod(in_factors), math.prod(out_factors)
    return left + right + 2 * tokens * ranks[n_in] * (d_in + d_out)


def best_split(row_factors: Sequence[int], col_factors: Sequence[int], ranks: Sequence[int]) -> int:
    """The split point of a TTM chain whose two half-tables hold the fewest numbers (CoMERA's order-4 layer splits
    after core 2: 320×16×32 and 32×100×48)."""
    sizes = [m * n for m, n in zip(row_factors, col_factors, strict=True)]

    def footprint(split: int) -> int:
        return ranks[split] * (math.prod(sizes[:split]) + math.prod(sizes[split:]))

    return min(range(1, len(sizes)), key=lambda s: (footprint(s), abs(2 * s - len(sizes))))


def ttm_half_tables(cores: Sequence[torch.Tensor], *, split: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-independent half-tables of §1.5: ``(M_1, N_1, r)`` and ``(M_2, r, N_2)``."""
    left = contract_ttm(cores[:split])  # (1, M_1, N_1, r)
    right = contract_ttm(cores[split:])  # (r, M_2, N_2, 1)
    return left[0], right[..., 0].permute(1, 0, 2)


def _grouped_mm(a: torch.Tensor, right: torch.Tensor, counts: list[int], *, transpose: bool = False) -> torch.Tensor:
    """``out[u] = a[u] @ right[j(u)]`` (or ``@ right[j]ᵀ``) for ``a`` sorted by group ``j``: one GEMM per group."""
    width = right.shape[1] if transpose else right.shape[2]
    out = a.new_empty(a.shape[0], a.shape[1], width)
    start = 0
    for j, count in enumerate(counts):
        if count:
            # Explicit sizes: with a pruned-to-zero rank, -1 would be ambiguous.
            block = a[start : start + count].reshape(count * a.shape[1], a.shape[2])  # (count·N_1, r or N_2)
            target = out[start : start + count].view(count * a.shape[1], width)
            torch.mm(block, right[j].t() if transpose else right[j], out=target)
            start += count
    return out


class _HalfTableLookup(torch.autograd.Function):
    """Rows ``left[t0] @ right[t1]`` (CoMERA's embedding half-tables), hand-written grouped backward.

    Ids are sorted by their right-table row ``t1`` (``M_2`` groups, 100 for CoMERA's shapes), so each group is one
    ``(count·N_1, r) @ (r, N_2)`` GEMM against a row of the right table: the right slices are never gathered per id,
    and their gradient is one GEMM per group instead of a scatter-add over thousands of duplicates (which is the
    slowest part of autograd's version on CPU). Only index vectors are saved; the left slices are re-gathered.
    The group sizes are read on the host (``tolist``), one sync per call on a GPU.
    """

    @staticmethod
    def forward(ctx, left, right, t0, t1, inverse):  # left (M_1, N_1, r), right (M_2, r, N_2), t0/t1 (U,)
        order = torch.argsort(t1, stable=True)  # (U,) group ids by right row
        counts = torch.bincount(t1, minlength=right.shape[0]).tolist()
        t0_sorted = t0.index_select(0, order)
        rows = _grouped_mm(left.index_select(0, t0_sorted), right, counts)  # (U, N_1, N_2), sorted order
        rank_of = torch.empty_like(order)
        rank_of[order] = torch.arange(order.numel(), device=order.device)  # unsorted position → sorted position
        take = rank_of if inverse is None else rank_of.index_select(0, inverse)  # (T,)
        ctx.save_for_backward(left, right, t0_sorted, take)
        ctx.counts = counts
        return rows.reshape(rows.shape[0], -1).index_select(0, take)  # (T, D)

    @staticmethod
    def backward(ctx, grad_out):  # grad_out (T, D)
        left, right, t0_sorted, take = ctx.saved_tensors
        n_left, n_right = left.shape[1], right.shape[2]
        grad_rows = grad_out.new_zeros(t0_sorted.shape[0], grad_out.shape[1]).index_add_(0, take, grad_out)
        grad_rows = grad_rows.reshape(-1, n_left, n_right)  # (U, N_1, N_2), sorted order
        grad_a = _grouped_mm(grad_rows, right, ctx.counts, transpose=True)  # (U, N_1, r)
        grad_left = torch.zeros_like(left).index_add_(0, t0_sorted, grad_a)
        a = left.index_select(0, t0_sorted)  # (U, N_1, r)
        grad_right = torch.zeros_like(right)
        start = 0
        for j, count in enumerate(ctx.counts):
            if count:
                block_a = a[start : start + count].reshape(count * n_left, a.shape[2])  # (count·N_1, r)
                block_g = grad_rows[start : start + count].reshape(count * n_left, n_right)  # (count·N_1, N_2)
                torch.mm(block_a.t(), block_g, out=grad_right[j])
                start += count
        return grad_left, grad_right, None, None, None


def ttm_lookup_halves(
    ids: torch.Tensor, cores: Sequence[torch.Tensor], *, split: int, unique: bool = True
) -> torch.Tensor:
    """Embedding rows ``E[ids]`` from TTM cores via two half-tables (CoMERA ``TensorizedEmbedding_order4``).

    Args:
        ids: integer tensor of any shape, every id < ``∏ m_k`` (callers check the vocabulary bound).
        cores: TTM cores ``(r_{k-1}, m_k, n_k, r_k)``, any order ≥ 2.
        split: cores ``[:split]`` form the left half-table.
        unique: compute each distinct id once and scatter back (row-index redundancy removal).

    Returns:
        ``(*ids.shape, ∏ n_k)``.
    """
    left, right = ttm_half_tables(cores, split=split)  # (M_1, N_1, r), (M_2, r, N_2)
    m_right = right.shape[0]
    flat = ids.reshape(-1)
    inverse = None
    if unique:
        flat, inverse = torch.unique(flat, return_inverse=True)
    # Row id → (left row, right row) in the row-major mixed radix; computed on the ids' device (no index buffers).
    # Column index of a row = (j_left, j_right) row-major, so the (N_1, N_2) product flattens to the embedding dim.
    t0, t1 = flat // m_right, flat % m_right
    if flat.device.type == "meta":  # shapes only (books on meta models): group sizes are unknowable
        rows = torch.bmm(left[t0], right[t1]).reshape(t0.shape[0], -1)
    else:
        rows = _HalfTableLookup.apply(left.contiguous(), right.contiguous(), t0, t1, inverse)
    return rows.reshape(*ids.shape, rows.shape[-1])


def ttm_lookup_chain(ids: torch.Tensor, cores: Sequence[torch.Tensor], *, unique: bool = True) -> torch.Tensor:
    """Embedding rows by a per-id chain over the gathered core slices (tltorch/t3nsor style, any order ≥ 1).

    Slower than :func:`ttm_lookup_halves` but its memory does not depend on half-table sizes.
    """
    row_factors = [core.shape[1] for core in cores]
    flat = ids.reshape(-1)
    inverse = None
    if unique:
        flat, inverse = torch.unique(flat, return_inverse=True)
    digits = []
    rest = flat
    for m in reversed(row_factors):
        digits.append(rest % m)
        rest = rest // m
    digits.reverse()
    acc = None  # (U, N_acc, r_k)
    for core, digit in zip(cores, digits, strict=True):
        r0, _, n, r1 = core.shape
        piece = core.permute(1, 0, 2, 3)[digit]  # (U, r_{k-1}, n_k, r_k)
        u = piece.shape[0]  # explicit sizes below: with a pruned-to-zero rank, -1 would be ambiguous
        if acc is None:
            acc = piece.reshape(u, n, r1)  # r_0 = 1
        else:
            acc = torch.bmm(acc, piece.reshape(u, r0, n * r1)).reshape(u, acc.shape[1] * n, r1)
    rows = acc[..., 0]  # (U, D)
    if inverse is not None:
        rows = rows[inverse]
    return rows.reshape(*ids.shape, rows.shape[-1])


def ttm_lookup_flops(
    row_factors: Sequence[int], col_factors: Sequence[int], ranks: Sequence[int], *, split: int, rows: int
) -> int:
    """Matmul FLOPs of :func:`ttm_lookup_halves` for ``rows`` distinct ids (half-tables + one bmm per row)."""
    sizes = [m * n for m, n in zip(row_factors, col_factors, strict=True)]
    left = plan_chain(tuple(sizes[:split]), tuple(ranks[: split + 1]))[1]
    right = plan_chain(tuple(sizes[split:]), tuple(ranks[split:]))[1]
    n_left, n_right = math.prod(col_factors[:split]), math.prod(col_factors[split:])
    return left + right + 2 * rows * n_left * ranks[split] * n_right
