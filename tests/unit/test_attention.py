"""Causal attention: the matmul form against PyTorch's SDPA and a float64 reference, and which form the model uses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tensorslim.functional.attention as attention
from tensorslim.functional.attention import MATMUL_ATTENTION_MAX_SEQ, causal_attention, matmul_causal_attention
from tensorslim.models.llama import LlamaForCausalLM
from tests.helpers import TINY_LLAMA


def _qkv(batch: int, heads: int, seq: int, head_dim: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """Leaf projections ``(B, T, H·hd)`` seen as ``(B, H, T, hd)``, the model's layout (not contiguous)."""
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(batch, seq, heads * head_dim, generator=gen, dtype=torch.float64).to(dtype) for _ in range(3)]


def _heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    batch, seq, d = t.shape
    return t.view(batch, seq, heads, d // heads).transpose(1, 2)


def _run(fn, leaves: list[torch.Tensor], heads: int, grad_out: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Output and the three input gradients of ``fn`` on fresh leaf copies of ``leaves``."""
    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    y = fn(*(_heads(t, heads) for t in leaves))
    y.backward(grad_out.to(y.dtype))
    return (y.detach(), *(t.grad for t in leaves))


@pytest.mark.parametrize("batch", [1, 2])
def test_matmul_attention_equals_sdpa_in_float64(batch: int) -> None:
    heads, seq = 3, 11
    leaves = _qkv(batch, heads, seq, 8, torch.float64)
    grad_out = torch.randn(batch, heads, seq, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ours = _run(matmul_causal_attention, leaves, heads, grad_out)
    ref = _run(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), leaves, heads, grad_out)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_matmul_attention_is_causal() -> None:
    # Changing the keys and values after position 4 must leave the outputs of queries 0..4 unchanged.
    q, k, v = (_heads(t, 2) for t in _qkv(1, 2, 9, 4, torch.float64))
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 5:] += 3.0
    v2[:, :, 5:] -= 2.0
    before, after = matmul_causal_attention(q, k, v), matmul_causal_attention(q, k2, v2)
    torch.testing.assert_close(before[:, :, :5], after[:, :, :5], rtol=0, atol=0)
    assert (before[:, :, 5:] - after[:, :, 5:]).abs().min() > 0
    # Query 0 sees key 0 only: its output is value 0.
    torch.testing.assert_close(before[:, :, 0], v[:, :, 0], rtol=1e-15, atol=1e-15)


def _hf_eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Hugging Face's eager LLaMA attention: scores in the input dtype, scaled, masked, softmax in fp32, ``@ v``."""
    seq = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v


@pytest.mark.parametrize("scale", [1.0, 2.0])  # scores of std ~1 and ~4
def test_bf16_matmul_attention_is_as_close_to_float64_as_hugging_face_eager(scale: float) -> None:
    heads, seq, head_dim = 4, 128, 64
    leaves16 = [(t * scale).bfloat16() for t in _qkv(1, heads, seq, head_dim, torch.float64)]
    grad_out = torch.randn(1, heads, seq, head_dim, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    exact = _run(sdpa, [t.double() for t in leaves16], heads, grad_out)  # the same rounded inputs, float64 math
    ours = _run(causal_attention, leaves16, heads, grad_out)  # the matmul form at this length (asserted below)
    eager = _run(_hf_eager, leaves16, heads, grad_out)
    for name, a, b, ref in zip(("y", "dq", "dk", "dv"), ours, eager, exact, strict=True):
        assert a.dtype == torch.bfloat16
        err_ours, err_eager = ((t.double() - ref).abs().max().item() / ref.abs().max().item() for t in (a, b))
        assert err_ours < 2e-2, (name, err_ours)  # bf16 keeps 8 significant bits
        # Flash keeps the scores in fp32 and is closer at large scores; this form errs as Hugging Face eager does.
        assert err_ours < 1.5 * err_eager + 1e-3, (name, err_ours, err_eager)


def test_causal_attention_picks_matmul_only_for_short_bf16_on_cpu() -> None:
    for dtype, seq, matmul in [
        (torch.bfloat16, MATMUL_ATTENTION_MAX_SEQ, True),
        (torch.bfloat16, MATMUL_ATTENTION_MAX_SEQ + 1, False),
        (torch.float32, 16, False),
    ]:
        q, k, v = (_heads(t, 2) for t in _qkv(1, 2, seq, 4, dtype))
        sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        expected = matmul_causal_attention(q, k, v) if matmul else sdpa
        assert torch.equal(causal_attention(q, k, v), expected), (dtype, seq)


def test_llama_bf16_autocast_step_matches_the_sdpa_path(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(TINY_LLAMA)
    ids = torch.randint(0, TINY_LLAMA.vocab_size, (2, 32))

    def loss_and_grads() -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(ids)
        loss = F.cross_entropy(logits.float()[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    loss, grads = loss_and_grads()
    monkeypatch.setattr(attention, "MATMUL_ATTENTION_MAX_SEQ", 0)  # every length takes SDPA
    ref_loss, ref_grads = loss_and_grads()
    assert loss != ref_loss  # the two paths really differ in rounding ...
    torch.testing.assert_close(loss, ref_loss, rtol=5e-3, atol=0)  # ... but not beyond bf16
    cosines = [F.cosine_similarity(g.flatten(), r.flatten(), dim=0) for g, r in zip(grads, ref_grads, strict=True)]
    assert min(cosines) > 0.99
