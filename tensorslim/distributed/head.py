"""Vocabulary-parallel output head and cross-entropy (BOOST §3.1; Megatron-LM's ``vocab_parallel_cross_entropy``).

Each rank holds ``V/p`` rows of ``lm_head`` and computes only its logits. The softmax normalizer needs three
all-reduces of one element per token (max, Σexp, the target's logit); the full ``(N, V)`` logits never exist.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tensorslim.distributed.comm import TPGroup, all_reduce_stat

IGNORE_INDEX = -100


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, tp: TPGroup, tag: str) -> torch.Tensor:
        # logits (N, V/p) fp32, target (N,) global ids → per-token loss (N,)
        width = logits.shape[-1]
        peak = all_reduce_stat(logits.max(dim=-1).values, tp, tag=f"{tag}.max", op=dist.ReduceOp.MAX)
        shifted = logits - peak.unsqueeze(-1)  # stability: the global max, so every rank shifts alike
        exp = shifted.exp()
        normalizer = all_reduce_stat(exp.sum(dim=-1), tp, tag=f"{tag}.sumexp")
        local = target - tp.rank * width
        mine = (local >= 0) & (local < width)  # the target lives on this rank
        local = local.clamp(0, width - 1)
        picked = all_reduce_stat(shifted.gather(1, local.unsqueeze(1)).squeeze(1) * mine, tp, tag=f"{tag}.target")
        ctx.save_for_backward(exp / normalizer.unsqueeze(-1), local, mine)
        return normalizer.log() - picked

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        softmax, local, mine = ctx.saved_tensors
        grad_logits = softmax.scatter_add(1, local.unsqueeze(1), -mine.unsqueeze(1).to(softmax.dtype))
        return grad_logits * grad.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, tp: TPGroup, *, tag: str) -> torch.Tensor:
    """Mean cross-entropy over the targets that are not ``-100``.

    Args:
        logits: this rank's vocabulary slice, ``(N, V/p)``.
        target: global token ids ``(N,)``; ``-100`` is ignored, as in ``F.cross_entropy``.
        tp: the tensor-parallel group.
        tag: prefix of the collectives in the communication log.
    """
    valid = target != IGNORE_INDEX
    losses = _VocabParallelCrossEntropy.apply(logits.float(), target.masked_fill(~valid, 0), tp, tag)
    return (losses * valid).sum() / valid.sum().clamp(min=1)
