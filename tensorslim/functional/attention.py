"""Causal self-attention without a cache: PyTorch's SDPA, or two batched matmuls and a softmax where those are faster.

On the CPU, SDPA's flash kernel is the fastest attention in fp32 at every length we measured, but in bf16 it is not:
at the ``350m`` layer shape (16 heads of 64) and 256 tokens, forward + backward, attention written as
``softmax(q kᵀ / √hd + mask) v`` with bf16 GEMMs is about 2× faster on one thread, at 512 tokens still 1.9×. Its
score matrix is ``(B·H, T, T)``, quadratic in T, so at 768 tokens it only ties with flash, at 1024 it is slower, and it
takes far more memory (``benchmarks/attention_cpu.py``, ``benchmarks/results/attention_cpu_threads1.md``). For the
backward it keeps the ``(B·H, T, T)`` bf16 probabilities where flash keeps one log-sum-exp per query: B·H·T²·2 bytes
more per layer (+255 MiB of peak memory at ``60m``, batch 8 × 512).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Longest sequence for which the matmul form is used: in bf16 it beat flash at 64–512 tokens, tied at 768, lost at 1024.
MATMUL_ATTENTION_MAX_SEQ = 512


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of queries, keys and values ``(B, H, T, hd)`` over the same T positions → ``(B, H, T, hd)``.

    bf16 on the CPU with ``T <= MATMUL_ATTENTION_MAX_SEQ``: :func:`matmul_causal_attention`, faster there (module
    docstring). Everything else (fp32, other devices, long sequences): ``F.scaled_dot_product_attention(...,
    is_causal=True)``.
    """
    if q.device.type == "cpu" and q.dtype == torch.bfloat16 and q.shape[-2] <= MATMUL_ATTENTION_MAX_SEQ:
        return matmul_causal_attention(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def matmul_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``softmax(q kᵀ / √hd + mask) v`` for ``(B, H, T, hd)`` inputs, query ``i`` attending keys ``j <= i``.

    The scale and the causal mask (``-inf`` above the diagonal) go into one ``baddbmm``. The softmax runs in the
    input dtype: PyTorch's CPU softmax computes in fp32 inside and rounds once, so its bf16 output equals
    ``softmax(scores.float()).bfloat16()`` while skipping two casts. As in Hugging Face's eager LLaMA attention, the
    scores are rounded to the input dtype before the softmax (flash keeps them in fp32); the tests bound the
    difference at bf16 precision.
    """
    batch, heads, seq, head_dim = q.shape
    future = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)  # (T, T): key after query
    bias = torch.zeros(seq, seq, dtype=q.dtype, device=q.device).masked_fill_(future, float("-inf"))
    # Contiguous (B·H, T, hd) copies: the model's q, k, v are views of (B, T, H·hd) projections, and the batched
    # GEMMs and their backward read those strides slowly (forward + backward at 350m, 256 tokens: 9.0 -> 7.7 ms).
    q, k, v = (t.contiguous().view(batch * heads, seq, head_dim) for t in (q, k, v))
    scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=head_dim**-0.5)  # (B·H, T, T)
    probs = torch.softmax(scores, dim=-1)
    return torch.bmm(probs, v).view(batch, heads, seq, head_dim)
