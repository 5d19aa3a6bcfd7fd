"""Dropout drawn by torch.rand and attention with it, against F.dropout's law and PyTorch's attention."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tensorslim.functional.dropout import Dropout, attention, dropout, uniform_noise


@pytest.mark.parametrize(("p", "shape", "seed"), [(0.1, (400, 500), 0), (0.3, (600, 500), 3)])
def test_dropout_keeps_one_minus_p_scaled_and_backward_uses_the_same_mask(p, shape, seed):
    # Masks this large are drawn in slices on worker threads (uniform_noise).
    torch.manual_seed(seed)
    x = torch.randn(*shape, requires_grad=True)
    out = dropout(x, p)
    kept = out != 0
    # Bernoulli(1 - p) draws: the kept fraction within 5 standard deviations of 1 - p.
    assert abs(kept.float().mean().item() - (1 - p)) < 5 * math.sqrt(p * (1 - p) / kept.numel())
    torch.testing.assert_close(out[kept], x[kept] / (1 - p), rtol=1e-6, atol=0)
    (grad,) = torch.autograd.grad(out, x, torch.ones_like(out))
    torch.testing.assert_close(grad, kept.float() / (1 - p), rtol=1e-6, atol=0)


def test_dropout_eval_zero_and_one():
    x = torch.randn(8, 8)
    module = Dropout(0.3).eval()
    assert module(x) is x and dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    with pytest.raises(ValueError, match="p=1.5"):
        Dropout(1.5)


def test_dropout_bf16_keeps_dtype_and_law():
    torch.manual_seed(1)
    x = torch.ones(100_000, dtype=torch.bfloat16)
    out = dropout(x, 0.25)
    assert out.dtype == torch.bfloat16
    assert abs((out != 0).float().mean().item() - 0.75) < 5 * math.sqrt(0.75 * 0.25 / x.numel())


def _qkv(seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 3, 5, 4, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))


@pytest.mark.parametrize("masked", [False, True])
def test_attention_without_dropout_effect_equals_sdpa(masked):
    # p tiny enough that no weight is dropped in 150 draws (probability about 1.5e-10): then the composite path
    # must equal PyTorch's attention, forward and backward, including a sequence whose keys are all masked.
    q, k, v = _qkv(0)
    key_mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0]]) if masked else None
    torch.manual_seed(0)
    ours = attention(q, k, v, key_mask=key_mask, dropout_p=1e-12)
    ref = F.scaled_dot_product_attention(
        q, k, v, attn_mask=None if key_mask is None else key_mask.bool()[:, None, None]
    )
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)
    grad = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(ours, (q, k, v), grad), torch.autograd.grad(ref, (q, k, v), grad), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_attention_dropout_drops_weights_at_rate_p():
    # v = identity rows: the output rows are the (dropped, rescaled) attention weights themselves.
    torch.manual_seed(0)
    t = 64
    q = torch.zeros(4, 8, t, 16)
    k = torch.zeros(4, 8, t, 16)  # uniform weights 1/t
    v = torch.eye(t).expand(4, 8, t, t)
    out = attention(q, k, v, key_mask=None, dropout_p=0.2)
    kept = out != 0
    assert abs(kept.float().mean().item() - 0.8) < 5 * math.sqrt(0.8 * 0.2 / kept.numel())
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 1 / t / 0.8))


def _reference_noise(numel: int, seed: int, pieces: int = 8) -> torch.Tensor:
    # The construction uniform_noise documents, written out serially: pieces seeds from the default generator, slice i
    # drawn by its own generator seeded with seed i, the last slice taking the remainder.
    torch.manual_seed(seed)
    seeds = torch.empty(pieces, dtype=torch.int64).random_().tolist()
    step = numel // pieces
    sizes = [step] * (pieces - 1) + [numel - step * (pieces - 1)]
    return torch.cat(
        [torch.rand(n, generator=torch.Generator().manual_seed(s)) for n, s in zip(sizes, seeds, strict=True)]
    )


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_split_mask_follows_the_seed_not_the_thread_count(threads):
    before = torch.get_num_threads()
    x = torch.randn(3, 70_001)  # above the split size; 210,003 is not a multiple of 8
    try:
        torch.set_num_threads(threads)
        torch.manual_seed(5)
        noise = uniform_noise(x.shape)
        torch.manual_seed(5)
        out = dropout(x, 0.1)
    finally:
        torch.set_num_threads(before)
    reference = _reference_noise(x.numel(), 5).reshape(x.shape)
    assert torch.equal(noise, reference)
    keep = reference >= 0.1
    torch.testing.assert_close(out, torch.where(keep, x / 0.9, 0.0), rtol=1e-6, atol=0)


def test_split_mask_slices_are_independent_uniforms():
    torch.manual_seed(0)
    noise = uniform_noise(torch.Size([8, 100_000])).reshape(8, -1)  # one slice per row
    n = noise.shape[1]
    # Each slice: mean 1/2 and variance 1/12 of U(0, 1), within 5 standard errors.
    assert (noise.mean(1) - 0.5).abs().max() < 5 * math.sqrt(1 / 12 / n)
    assert (noise.var(1) - 1 / 12).abs().max() < 5 * math.sqrt(1 / 180 / n)
    # Pairwise correlations of distinct slices near 0 (a slice repeated or shifted would show up here).
    corr = torch.corrcoef(noise.double())
    assert (corr - torch.eye(8, dtype=torch.float64)).abs().max() < 5 / math.sqrt(n)
    assert (noise[:, :-1] == noise[:, 1:]).sum() < 5  # no stuck stream


def test_split_dropout_in_inference_mode():
    with torch.inference_mode():  # slices filled on worker threads into an inference tensor
        y = dropout(torch.ones(600, 500), 0.3)
    assert abs((y != 0).float().mean().item() - 0.7) < 5 * math.sqrt(0.7 * 0.3 / y.numel())
