"""Stateless low-rank contractions.

CoLA (Liu et al., 2025, "CoLA: Compute-Efficient Pre-Training of LLMs via Low-Rank Activation", §3) replaces a dense
projection ``y = W x`` by the bottleneck auto-encoder ``y = B σ(A x)``. With σ = identity this is the classic
truncated-SVD factorization.

On CPU in fp32 or bf16 (training, or inference from 64 tokens) the token-dependent GEMMs run in one autograd function
with a hand-written backward (:class:`_LowRankMatmul`), with the TT layer's kernel choice
(:mod:`tensorslim.functional.tt`): the token-parallel products on oneDNN's matmul. Layers that read the same input
(attention's q, k, v; the MLP's gate and up) share one down-projection GEMM (:func:`low_rank_many`). Everywhere else
(float64, other devices, decoding, ``FlopCounterMode`` and other dispatch modes, ``torch.compile``) the same product
is plain ``F.linear`` calls under autograd. docs/speed.md ("Fifth round: CoLA at 60m") has what each part saves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from tensorslim.functional.tt import _compute_dtype, _linear, _use_onednn

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "relu": F.relu,
    "identity": lambda x: x,
}


def activation_fn(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """Look up a latent activation by name (``silu``, ``gelu``, ``relu``, ``identity``)."""
    if name not in ACTIVATIONS:
        raise ValueError(f"activation={name!r} is not supported; allowed: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def _activation_backward(name: str, grad: torch.Tensor, pre: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
    """``∂L/∂z`` from ``∂L/∂σ(z)`` for the latent activation ``name`` (``pre`` = z, ``post`` = σ(z))."""
    if name == "silu":
        return torch.ops.aten.silu_backward(grad, pre)
    if name == "gelu":
        return torch.ops.aten.gelu_backward(grad, pre)
    if name == "relu":
        return torch.ops.aten.threshold_backward(grad, post, 0)
    return grad


class _LowRankMatmul(torch.autograd.Function):
    """``y_i = B_i σ(A_i x) + b_i`` for 2-D ``x`` and one or more low-rank layers that read it, with a hand-written
    backward.

    The ``A_i`` are stacked into ``[A_1; …; A_n]``, so one GEMM reads ``x`` for every latent and one GEMM forms ``∂x``
    (no sum of n ``∂x``). The token-parallel GEMMs (``x Aᵀ``, ``σ Bᵀ + b``, ``∂y B``, ``∂z A``) run on oneDNN's matmul
    when ``onednn`` (see :func:`tensorslim.functional.tt._use_onednn`): timed alone, it ran CoLA's rank-128 GEMMs
    5–12 % faster than MKL at one and two threads. The weight gradients ``∂A = ∂zᵀ x`` and ``∂B = ∂yᵀ σ`` are sums
    over the tokens, on MKL: at rank 128 the TT layer's one token slice per thread was 0–10 % slower than MKL's own
    split.

    Saved for backward, as autograd saves them for the plain product: ``x``, the pre-activation ``z = x Aᵀ``, ``σ(z)``
    (not for the identity), and the weights themselves (stacked again in backward, so that no copy is kept). Under
    autocast every operand is cast to autocast's dtype once in forward, so backward (which runs outside autocast)
    multiplies tensors of one dtype; autograd casts each gradient back to its input's dtype.
    """

    @staticmethod
    def forward(ctx, x, ranks, activation, onednn, *weights):  # x (N, d_in); weights: n A_i, n B_i, n biases
        dtype = _compute_dtype(x)
        n = len(ranks)
        x = x.to(dtype).contiguous()
        weight_as = [w.to(dtype) for w in weights[:n]]  # each (r_i, d_in)
        weight_bs = [w.to(dtype) for w in weights[n : 2 * n]]  # each (d_out_i, r_i)
        biases = [None if b is None else b.to(dtype) for b in weights[2 * n :]]
        pre = _linear(x, _stack(weight_as), None, onednn=onednn)  # (N, Σr)
        post = activation_fn(activation)(pre)  # (N, Σr)
        posts = post.split(ranks, dim=1)  # views (N, r_i)
        outs = [_linear(h, w, b, onednn=onednn) for h, w, b in zip(posts, weight_bs, biases, strict=True)]
        ctx.save_for_backward(x, pre, None if activation == "identity" else post, *weight_as, *weight_bs)
        ctx.ranks, ctx.activation, ctx.onednn = ranks, activation, onednn
        ctx.has_bias = [b is not None for b in biases]
        return tuple(outs)  # each (N, d_out_i)

    @staticmethod
    def backward(ctx, *grad_outs):  # each (N, d_out_i)
        x, pre, post, *weights = ctx.saved_tensors
        post = pre if post is None else post
        n, need = len(ctx.ranks), ctx.needs_input_grad
        weight_as, weight_bs = weights[:n], weights[n:]
        grad_outs = [g.to(x.dtype).contiguous() for g in grad_outs]
        grad_posts = [_linear(g, w.t(), None, onednn=ctx.onednn) for g, w in zip(grad_outs, weight_bs, strict=True)]
        grad_post = grad_posts[0] if n == 1 else torch.cat(grad_posts, 1)  # (N, Σr)
        grad_pre = _activation_backward(ctx.activation, grad_post, pre, post)  # (N, Σr)
        grad_x = _linear(grad_pre, _stack(weight_as).t(), None, onednn=ctx.onednn) if need[0] else None  # (N, d_in)
        grad_as = [None] * n
        if any(need[4 : 4 + n]):
            grad_as = list((grad_pre.t() @ x).split(ctx.ranks, dim=0))  # each (r_i, d_in)
        grad_bs, grad_biases = [None] * n, [None] * n
        for i, (h, g) in enumerate(zip(post.split(ctx.ranks, dim=1), grad_outs, strict=True)):
            if need[4 + n + i]:
                grad_bs[i] = g.t() @ h  # (d_out_i, r_i)
            if ctx.has_bias[i] and need[4 + 2 * n + i]:
                grad_biases[i] = g.sum(0)  # (d_out_i,)
        return grad_x, None, None, None, *grad_as, *grad_bs, *grad_biases


def _stack(weights: Sequence[torch.Tensor]) -> torch.Tensor:
    return weights[0] if len(weights) == 1 else torch.cat(list(weights), 0)


def _plain(
    x: torch.Tensor, weight_a: torch.Tensor, weight_b: torch.Tensor, bias: torch.Tensor | None, activation: str
) -> torch.Tensor:
    latent = activation_fn(activation)(F.linear(x, weight_a))  # (..., r)
    return F.linear(latent, weight_b, bias)  # (..., d_out)


def low_rank_many(
    x: torch.Tensor,
    weights: Sequence[tuple[torch.Tensor, torch.Tensor]],
    biases: Sequence[torch.Tensor | None],
    *,
    activation: str = "identity",
) -> list[torch.Tensor]:
    """``y_i = B_i σ(A_i x) + b_i`` for low-rank layers that read the same ``x``, with one GEMM for all ``A_i x``.

    Args:
        x: input, shape ``(..., d_in)``.
        weights: ``(A_i, B_i)`` pairs, ``A_i (r_i, d_in)``, ``B_i (d_out_i, r_i)`` (``nn.Linear`` convention).
        biases: ``(d_out_i,)`` or None, one per pair.
        activation: the latent nonlinearity σ shared by all layers.

    Returns:
        ``[(..., d_out_i)]``.
    """
    activation_fn(activation)  # validates the name
    x2 = x.reshape(-1, x.shape[-1])  # (N, d_in)
    dtype = _compute_dtype(x2)
    if torch.compiler.is_compiling() or not _use_onednn(x2, dtype, training=torch.is_grad_enabled()):
        return [_plain(x, a, b, bias, activation) for (a, b), bias in zip(weights, biases, strict=True)]
    ranks = tuple(a.shape[0] for a, _ in weights)
    outs = _LowRankMatmul.apply(
        x2, ranks, activation, True, *(a for a, _ in weights), *(b for _, b in weights), *biases
    )
    return list(outs) if x.dim() == 2 else [out.reshape(*x.shape[:-1], out.shape[1]) for out in outs]


def low_rank_linear(
    x: torch.Tensor,
    weight_a: torch.Tensor,
    weight_b: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str = "identity",
) -> torch.Tensor:
    """``y = B σ(A x) + b`` without ever forming ``B A``.

    Args:
        x: input, shape ``(..., d_in)``.
        weight_a: down-projection ``A``, shape ``(r, d_in)`` (``nn.Linear`` convention).
        weight_b: up-projection ``B``, shape ``(d_out, r)``.
        bias: optional bias, shape ``(d_out,)``.
        activation: latent nonlinearity σ; CoLA uses ``"silu"``.

    Returns:
        Tensor of shape ``(..., d_out)``.
    """
    return low_rank_many(x, [(weight_a, weight_b)], [bias], activation=activation)[0]
