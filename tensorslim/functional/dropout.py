"""Dropout with its mask drawn by ``torch.rand``, and attention with dropout on its weights.

Dropout (Hinton et al., arXiv 1207.0580; Srivastava et al., JMLR 2014) keeps each element with probability ``1 - p``
and scales the kept ones by ``1 / (1 - p)``. ``F.dropout`` draws its mask with ``bernoulli_``; on our AMD EPYC CPUs
that kernel took about 10 ns per element at one and at two threads alike (a serial loop), and in a ``bert6`` step
(dropout 0.1 on the hidden states and on every attention-weight matrix, 20 million elements) it was 15 % of the
CoMERA step on one thread and more on two. A float32 ``torch.rand`` draw compared with ``p`` is the same Bernoulli
variable (``bernoulli_`` compares the same 24-bit uniform with ``p``) and costs about half as much; the comparison
and the scaling run on every thread. On other devices ``F.dropout`` is used unchanged.

``torch.rand`` itself is serial too (one Mersenne Twister), so a large mask is drawn in :data:`_PIECES` slices, each
from its own ``torch.Generator`` seeded from the default generator (``torch.manual_seed`` still fixes the mask), and
the slices are drawn on up to ``torch.get_num_threads()`` threads at once (torch ops release the GIL). Which numbers
land where depends only on the seed and the mask's size, not on the thread count. Each element is still one float32
uniform compared with ``p``, so the law is unchanged.

PyTorch's CPU ``scaled_dot_product_attention`` has no fused kernel with dropout: with ``dropout_p > 0`` it falls
back to a composite path whose dropout is ``bernoulli_`` again. :func:`attention` writes that path out with
:func:`dropout` (and calls ``scaled_dot_product_attention`` itself whenever there is no dropout).
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

# A mask of at least _SPLIT_MIN elements is drawn in _PIECES slices (module docstring). Eight slices let up to eight
# threads draw; handing a slice to another thread costs tens of microseconds, so small masks are one draw.
_PIECES = 8
_SPLIT_MIN = 1 << 16
_pool: tuple[int, ThreadPoolExecutor] | None = None  # (pid, executor): a forked child makes its own


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None or _pool[0] != os.getpid():
        _pool = (os.getpid(), ThreadPoolExecutor(_PIECES - 1, thread_name_prefix="tensorslim-dropout"))
    return _pool[1]


def _fill(slices: list[tuple[torch.Tensor, int]], inference: bool) -> None:
    with torch.inference_mode(inference):  # the caller's mode: in-place writes to its tensors must be allowed
        for piece, seed in slices:
            piece.uniform_(generator=torch.Generator().manual_seed(seed))


def uniform_noise(shape: torch.Size, *, pieces: int = _PIECES) -> torch.Tensor:
    """``torch.rand(shape)`` (float32, CPU) drawn in ``pieces`` slices on up to ``torch.get_num_threads()`` threads.

    Slice ``i`` (of ``numel // pieces`` elements, the last one takes the rest) is drawn by a generator seeded with the
    ``i``-th of ``pieces`` 63-bit seeds from the default generator, whatever the thread count.
    """
    noise = torch.empty(shape, dtype=torch.float32)
    flat = noise.view(-1)
    seeds = torch.empty(pieces, dtype=torch.int64).random_().tolist()
    step = flat.numel() // pieces
    slices = [(flat[i * step : (i + 1) * step if i < pieces - 1 else None], seed) for i, seed in enumerate(seeds)]
    threads = max(1, min(torch.get_num_threads(), pieces))
    groups = [slices[i * pieces // threads : (i + 1) * pieces // threads] for i in range(threads)]
    inference = torch.is_inference_mode_enabled()
    futures = [_executor().submit(_fill, group, inference) for group in groups[1:]]
    _fill(groups[0], inference)
    for future in futures:
        future.result()
    return noise


def dropout(x: torch.Tensor, p: float, *, training: bool = True) -> torch.Tensor:
    """``F.dropout(x, p, training)`` with the mask drawn by ``torch.rand`` on CPU (module docstring)."""
    if not training or p == 0:
        return x
    if x.device.type != "cpu" or p == 1:
        return F.dropout(x, p, training=True)
    # Float32 uniforms whatever x's dtype (a bf16 uniform would round p); 1.0 where kept, scaled as F.dropout scales.
    # One draw under torch.compile or a dispatch mode (fake tensors, FLOP counting): they trace this thread only.
    split = x.numel() >= _SPLIT_MIN and not torch.compiler.is_compiling() and _get_current_dispatch_mode() is None
    noise = uniform_noise(x.shape) if split else torch.rand(x.shape, dtype=torch.float32)
    noise = noise.ge_(p).div_(1 - p)
    return x * noise.to(x.dtype)


class Dropout(nn.Module):
    """``nn.Dropout`` (no parameters, same ``p``) through :func:`dropout`."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0 <= p <= 1:
            raise ValueError(f"p={p!r} is invalid; allowed: a probability in [0, 1]")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, training=self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, key_mask: torch.Tensor | None, dropout_p: float
) -> torch.Tensor:
    """``scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=dropout_p)`` for a key mask.

    Args:
        q, k, v: ``(B, h, T, d_h)``.
        key_mask: ``(B, T)`` with True (or 1) where a key may be attended, or None.
        dropout_p: dropout on the attention weights (0 in eval).

    Returns:
        ``(B, h, T, d_h)``. As in PyTorch's composite path, a query whose keys are all masked gets zeros.
    """
    mask = None if key_mask is None else key_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
    if dropout_p == 0 or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    scores = (q * (1 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)  # (B, h, T, T)
    if mask is not None:
        # A finite minimum, not -inf: an all-masked row must not turn into NaNs (its output is zeroed below).
        bias = torch.zeros(mask.shape, dtype=scores.dtype).masked_fill_(~mask, torch.finfo(scores.dtype).min)
        scores = scores + bias
    out = dropout(torch.softmax(scores, dim=-1), dropout_p) @ v  # (B, h, T, d_h)
    if mask is not None:
        dead = ~mask.any(dim=-1, keepdim=True)  # (B, 1, 1, 1): no key to attend
        if dead.any():
            out = out.masked_fill(dead, 0.0)
    return out
