"""The skip rule of random-access reading (arXiv 2405.13216, §3) as pure functions.

Only the formula ``D(X, S; M) = K·min(⌊(|X|−S−L)/K⌋, ⌊α/C(X, S; M)⌋)`` and the two poolings (mean, last token) come
from the paper (as summarised by its public reviews; the body was not available to us). Where the paper is silent we
chose: a window shorter than ``L`` at the document end counts as ``L`` in the first term (so it is never negative),
``C = 0`` (a perfectly predicted window) skips to the end, and ``α = 0`` never skips.
"""

from __future__ import annotations

import math

import torch

from tensorslim._checks import require_int


def skip_length(*, doc_len: int, start: int, window: int, k: int, alpha: float, confidence: float) -> int:
    """``D``: tokens to skip after the window ``[start, start + window)`` of a document of ``doc_len`` tokens.

    Args:
        doc_len: ``|X|``.
        start: ``S``, where the window just read starts.
        window: ``L``, the window length.
        k: ``K``, the skip granularity.
        alpha: ``α >= 0``.
        confidence: ``C``, the pooled (detached) loss of the window just read; ``>= 0``.

    Returns:
        A multiple of ``k`` with ``start + window + D <= doc_len`` (0 when the window reaches the end).

    Raises:
        ValueError: ``k`` is not an integer >= 1, ``alpha`` not a finite number >= 0, ``confidence`` negative, or
            a length or position not an integer >= 0.
    """
    _check_skip_inputs(doc_len=doc_len, start=start, window=window, k=k, alpha=alpha, confidence=confidence)
    room = max(doc_len - start - window, 0) // k  # whole K-blocks left after the window
    if alpha == 0 or room == 0:
        return 0
    if not confidence > 0:  # C = 0: nothing left to learn here; NaN never skips (the next check stops the run)
        return k * room if confidence == 0 else 0
    return k * min(room, math.floor(alpha / confidence))


def _check_skip_inputs(*, doc_len: int, start: int, window: int, k: int, alpha: float, confidence: float) -> None:
    """One-line errors for the arguments of :func:`skip_length` (the reading config checks ``k`` and ``alpha`` too,
    but the function is public)."""
    require_int("k", k)
    for name, value in (("doc_len", doc_len), ("start", start), ("window", window)):
        require_int(name, value, minimum=0)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha={alpha!r} is invalid; allowed: a finite number >= 0")
    if confidence < 0:  # a pooled loss; NaN passes (it never skips) and so does +inf (nothing to skip)
        raise ValueError(f"confidence={confidence!r} is invalid; allowed: a pooled loss >= 0 (or NaN)")


def pool_losses(token_losses: torch.Tensor, mask: torch.Tensor, *, pooling: str) -> torch.Tensor:
    """``C`` of each window: the mean of its token losses or its last token's loss.

    Args:
        token_losses: ``(B, T)`` per-token losses (detached by the caller).
        mask: ``(B, T)`` bool, True where a loss belongs to the window (each row has at least one).
        pooling: ``"mean"`` or ``"last"`` (the loss at the row's last True position).

    Returns:
        ``(B,)`` float32 confidences.
    """
    losses = token_losses.float()
    if pooling == "last":
        positions = torch.arange(losses.shape[1], device=losses.device)[None, :]  # (1, T)
        last = torch.where(mask, positions, -1).max(1).values  # (B,)
        return losses.gather(1, last.clamp(min=0)[:, None]).squeeze(1)
    if pooling != "mean":
        raise ValueError(f"pooling={pooling!r} is invalid; allowed: ['mean', 'last']")
    return (losses * mask).sum(1) / mask.sum(1).clamp(min=1)
