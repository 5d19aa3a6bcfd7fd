"""A linear head and cross-entropy in token chunks, without the full ``(N, V)`` logits.

The LM head of a language model turns the final hidden states ``h (N, d)`` into logits ``h Wᵀ (N, V)``, and the loss
is the cross-entropy of those logits. At a 32,000-word vocabulary the logits of 1,024 tokens take 131 MB in fp32, and
the plain path writes and reads them several times (log-softmax forward and backward, the loss's gather and its
backward's scatter) and keeps two copies alive from forward to backward.

:func:`linear_cross_entropy` follows Cut Cross-Entropy (Wijmans et al., 2024, arXiv 2411.09009, §4) and Liger-Kernel's
fused linear cross-entropy (Hsu et al., 2024, arXiv 2410.10989): it takes the tokens a chunk at a time, forms the
chunk's logits, turns the same buffer in place into the softmax (the loss is ``−log p_t``) and then into the chunk's
gradient ``softmax − onehot``, which gives ``∂h`` for the chunk and is added into ``∂W``. Both gradients are computed in
forward, as Liger does (Cut Cross-Entropy recomputes the logits in backward instead, a third more FLOPs in the head);
backward only scales them by the loss's incoming gradient. Only one chunk's logits exist at a time.

We deviate from both papers' GPU kernels: a chunk is one GEMM followed by in-place PyTorch ops, not a fused tiled
kernel. On CPU in fp32 and bf16 the logits and ``∂h`` GEMMs run on oneDNN (as the low-rank kernel's token-parallel
GEMMs do, :mod:`tensorslim.functional.lowrank`): at 60m's shapes the head and loss alone ran 6 % faster with them on
oneDNN than all on MKL. ``∂W`` stays on MKL, which ran it faster. (2-core AMD EPYC.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.utils._python_dispatch import _get_current_dispatch_mode

from tensorslim.functional.tt import _compute_dtype, _linear, _use_onednn

REDUCTIONS = ("mean", "sum")

# Tokens per chunk: one chunk's logits take chunk · V floats (131 MB at 1,024 tokens and V = 32,000). At 60m chunks of
# 512 and 1,024 tokens measured within noise of each other, 256 slower (each chunk adds a pass over ∂W, and the GEMMs
# get narrower; 2-core AMD EPYC).
DEFAULT_CHUNK = 1024


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    chunk_size: int = DEFAULT_CHUNK,
) -> torch.Tensor:
    """``F.cross_entropy(F.linear(hidden, weight).float(), targets)`` without forming the whole logits (in float64
    for float64 inputs).

    Args:
        hidden: final hidden states, shape ``(..., d)``.
        weight: the head's weight, shape ``(V, d)`` (``nn.Linear`` convention, no bias).
        targets: class ids, shape ``(...)`` (``hidden``'s leading shape); ``ignore_index`` marks tokens without one.
        ignore_index: target value whose tokens add nothing to the loss or the gradients.
        reduction: ``"mean"`` (over the tokens that have a target) or ``"sum"``.
        chunk_size: tokens per chunk; the memory of one chunk's logits is ``chunk_size · V`` floats.

    Returns:
        The scalar loss, in float32 (float64 for float64 inputs). Under autocast the GEMMs run in autocast's dtype and
        the log-softmax in float32, as the plain path does with ``.float()`` on the logits.

    On CPU the chunked autograd function runs; elsewhere, while ``torch.compile`` traces, or under a Python dispatch
    mode (FLOP counting, fake tensors) it is the plain ``F.linear`` and ``F.cross_entropy``. Its gradients are computed
    in forward; backward scales them by the incoming gradient (double backward is not supported).
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r} is not supported; allowed: {list(REDUCTIONS)}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size!r} must be a positive int")
    h = hidden.reshape(-1, hidden.shape[-1])  # (N, d)
    t = targets.reshape(-1)  # (N,)
    if (
        h.device.type != "cpu"
        or torch.compiler.is_compiling()
        or _get_current_dispatch_mode() is not None
        or weight.dim() != 2
    ):
        logits = F.linear(h, weight)  # (N, V)
        return F.cross_entropy(logits.float(), t, ignore_index=ignore_index, reduction=reduction)
    keep = (t != ignore_index).nonzero().squeeze(1)  # (n,) tokens with a target
    count = keep.numel()
    # The mean over no tokens is 0/0, as in F.cross_entropy.
    scale = 1.0 if reduction == "sum" else (1.0 / count if count else float("nan"))
    if not torch.is_grad_enabled() or not (hidden.requires_grad or weight.requires_grad):
        loss, _, _ = _chunked(_rows(h, keep, count), weight, t[keep], scale, chunk_size, need_h=False, need_w=False)
        return loss * scale
    return _LinearCrossEntropy.apply(h, weight, t, keep, scale, chunk_size)


def _rows(h: torch.Tensor, keep: torch.Tensor, count: int) -> torch.Tensor:
    """The rows of ``h`` that have a target (``h`` itself when all do: no copy)."""
    return h if count == h.shape[0] else h.index_select(0, keep)


def _chunked(
    h: torch.Tensor,  # (n, d), tokens with a target
    weight: torch.Tensor,  # (V, d)
    targets: torch.Tensor,  # (n,)
    scale: float,
    chunk: int,
    *,
    need_h: bool,
    need_w: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The summed loss, ``scale · ∂loss/∂h`` (n, d) and ``scale · ∂loss/∂W`` (V, d), one token chunk at a time."""
    dtype = _compute_dtype(h)
    acc = torch.float64 if dtype == torch.float64 else torch.float32  # log-softmax and loss; ∂W's accumulator
    hc, wc = h.to(dtype), weight.to(dtype)  # autocast's casts, once
    onednn = _use_onednn(hc, dtype, training=True)
    n, vocab = h.shape[0], weight.shape[0]
    loss = torch.zeros((), dtype=acc)
    grad_h = torch.empty(n, h.shape[1], dtype=dtype) if need_h else None
    grad_w = None
    if need_w:  # zeros only when no chunk will write it
        grad_w = torch.empty(vocab, h.shape[1], dtype=acc) if n else torch.zeros(vocab, h.shape[1], dtype=acc)
    for i, start in enumerate(range(0, n, chunk)):
        x, t = hc[start : start + chunk], targets[start : start + chunk]  # (m, d), (m,)
        logits = _linear(x, wc, None, onednn=onednn)  # (m, V)
        target_logits = logits.gather(1, t[:, None]).to(acc)  # (m, 1), before the buffer is overwritten
        # In place (the CPU kernel reads each row before it writes it): in fp32 one buffer holds the logits, then
        # the probabilities, then the gradient. bf16 logits get a float32 buffer, as ``.float()`` makes. Softmax and
        # then -log p_t is one pass over the buffer fewer than log-softmax and then exp.
        probs = torch.softmax(logits, 1, dtype=acc, out=logits if logits.dtype == acc else None)  # (m, V)
        loss += _token_losses(probs.gather(1, t[:, None]), target_logits, x, wc, acc).sum()
        if not (need_h or need_w):
            continue
        grad = probs
        grad.scatter_add_(1, t[:, None], torch.full((x.shape[0], 1), -1.0, dtype=acc))  # softmax − onehot
        if grad.dtype != dtype:
            grad = logits.copy_(grad)  # rounded as autograd rounds the plain path's gradient of ``.float()``
        if need_h:
            grad_h[start : start + chunk] = _linear(grad, wc.t(), None, onednn=onednn)  # (m, d): grad · W
        if need_w:
            _add_grad_w(grad_w, grad, x, scale, first=i == 0)
    if need_h:
        grad_h.mul_(scale)
    return loss, grad_h, grad_w


def _token_losses(
    target_probs: torch.Tensor,  # (m, 1) softmax at the targets
    target_logits: torch.Tensor,  # (m, 1)
    x: torch.Tensor,  # (m, d)
    weight: torch.Tensor,  # (V, d)
    acc: torch.dtype,
) -> torch.Tensor:
    """``-log p_t`` per token; where ``p_t`` underflowed (a target logit far below the row's largest), the exact
    ``logsumexp(logits) - logit_t`` from the row's logits computed again."""
    losses = -target_probs.log()  # (m, 1)
    lost = (target_probs < torch.finfo(acc).tiny).squeeze(1).nonzero().squeeze(1)  # zero or subnormal
    if lost.numel():
        logits = F.linear(x.index_select(0, lost), weight).to(acc)  # (k, V)
        losses[lost] = torch.logsumexp(logits, 1, keepdim=True) - target_logits[lost]
    return losses


def _add_grad_w(grad_w: torch.Tensor, grad: torch.Tensor, x: torch.Tensor, scale: float, *, first: bool) -> None:
    """``grad_w (+)= scale · gradᵀ x``, accumulated in ``grad_w``'s dtype (float32 for bf16 chunks)."""
    if grad.dtype == grad_w.dtype:
        torch.addmm(grad_w, grad.t(), x, beta=0.0 if first else 1.0, alpha=scale, out=grad_w)
    elif first:
        torch.mul(grad.t() @ x, scale, out=grad_w)
    else:
        grad_w.add_(grad.t() @ x, alpha=scale)


class _LinearCrossEntropy(torch.autograd.Function):
    """The loss of :func:`linear_cross_entropy`, with both gradients computed in forward and scaled in backward.

    ``h (N, d)``, ``weight (V, d)``, ``targets (N,)``; ``keep`` lists the tokens with a target. What is saved for
    backward is ``∂h`` (N, d) and ``∂W`` (V, d, float32) themselves. When the incoming gradient is 1 (the loss
    backpropagated on its own) backward returns them as they are: autograd releases its saved tensors after this
    node, so it can take ``∂W`` as the weight's ``.grad`` without a copy (it copies it when the graph is retained).
    """

    @staticmethod
    def forward(ctx, h, weight, targets, keep, scale, chunk):
        count = keep.numel()
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        rows = _rows(h, keep, count)
        loss, grad_rows, grad_w = _chunked(rows, weight, targets[keep], scale, chunk, need_h=need_h, need_w=need_w)
        grad_h = grad_rows
        if need_h and count != h.shape[0]:
            grad_h = torch.zeros(h.shape, dtype=grad_rows.dtype).index_copy_(0, keep, grad_rows)  # (N, d)
        ctx.save_for_backward(grad_h, grad_w)
        return loss * scale

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss):
        grad_h, grad_w = ctx.saved_tensors
        if grad_loss.item() != 1.0:  # out of place: a retained graph's second backward needs the saved ones
            grad_h = None if grad_h is None else grad_h * grad_loss.to(grad_h.dtype)
            grad_w = None if grad_w is None else grad_w * grad_loss.to(grad_w.dtype)
        return grad_h, grad_w, None, None, None, None
