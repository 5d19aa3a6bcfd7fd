"""The fused, chunked LM head + cross-entropy (:func:`tensorslim.functional.cross_entropy.linear_cross_entropy`)
against ``F.cross_entropy(F.linear(h, W), t)`` under autograd, and its use by the LM task."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.convert import convert_
from tensorslim.functional.cross_entropy import linear_cross_entropy
from tensorslim.layers.lowrank import CoLAConfig, LowRankLinear
from tensorslim.models.llama import LlamaConfig, LlamaForCausalLM
from tensorslim.tasks.lm import causal_lm_loss, fused_head, lm_loss, next_token_targets


def _inputs(dtype=torch.float64, *, tokens=(3, 11), d=16, vocab=50, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*tokens, d, generator=gen, dtype=dtype).requires_grad_()
    weight = torch.randn(vocab, d, generator=gen, dtype=dtype).mul_(0.5).requires_grad_()
    targets = torch.randint(vocab, tokens, generator=gen)
    targets[0, 4] = targets[1, -1] = targets[-1, 0] = -100
    return hidden, weight, targets


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("chunk", [1, 4, 7, 512])
def test_matches_autograd_through_the_logits_in_float64(reduction: str, chunk: int) -> None:
    hidden, weight, targets = _inputs()
    ref = F.cross_entropy(F.linear(hidden, weight).flatten(0, 1), targets.flatten(), reduction=reduction)
    ref_grads = torch.autograd.grad(ref * 0.7, (hidden, weight))
    out = linear_cross_entropy(hidden, weight, targets, reduction=reduction, chunk_size=chunk)
    grads = torch.autograd.grad(out * 0.7, (hidden, weight))  # an incoming gradient other than 1
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert grads[0][0, 4].abs().max() == 0 and grads[0][1, -1].abs().max() == 0  # ignored tokens: no gradient


def test_gradcheck_and_one_input_without_grad() -> None:
    hidden, weight, targets = _inputs(tokens=(3, 5), d=4, vocab=7)
    assert torch.autograd.gradcheck(lambda h, w: linear_cross_entropy(h, w, targets, chunk_size=3), (hidden, weight))
    frozen = weight.detach()
    (grad,) = torch.autograd.grad(linear_cross_entropy(hidden, frozen, targets), hidden)
    (ref,) = torch.autograd.grad(F.cross_entropy(F.linear(hidden, frozen).flatten(0, 1), targets.flatten()), hidden)
    torch.testing.assert_close(grad, ref)
    with torch.no_grad():  # no gradients computed at all
        torch.testing.assert_close(
            linear_cross_entropy(hidden, weight, targets, reduction="sum"),
            F.cross_entropy(F.linear(hidden, weight).flatten(0, 1), targets.flatten(), reduction="sum"),
        )


def test_fp32_weight_grad_is_handed_over_and_a_retained_graph_backprops_twice() -> None:
    hidden, weight, targets = _inputs(torch.float32)
    weight = nn.Parameter(weight.detach())
    linear_cross_entropy(hidden, weight, targets).backward(retain_graph=True)
    first = weight.grad.clone()
    (ref,) = torch.autograd.grad(F.cross_entropy(F.linear(hidden, weight).flatten(0, 1), targets.flatten()), weight)
    torch.testing.assert_close(first, ref, rtol=1e-5, atol=1e-6)
    # The retained graph's saved gradient must not have become .grad (the second backward would double it).
    hidden.grad = None
    loss = linear_cross_entropy(hidden, weight, targets)
    loss.backward(retain_graph=True)
    loss.backward()
    torch.testing.assert_close(weight.grad, 3 * first, rtol=1e-5, atol=1e-6)


def test_bf16_autocast_matches_the_plain_path() -> None:
    hidden, weight, targets = _inputs(torch.float32, tokens=(4, 32), d=64, vocab=300)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = F.cross_entropy(F.linear(hidden, weight).flatten(0, 1).float(), targets.flatten())
        out = linear_cross_entropy(hidden, weight, targets, chunk_size=40)
    assert out.dtype == ref.dtype == torch.float32
    ref_grads = torch.autograd.grad(ref, (hidden, weight))
    grads = torch.autograd.grad(out, (hidden, weight))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)  # the same bf16 logits, fp32 log-softmax
    for got, want in zip(grads, ref_grads, strict=True):
        assert got.dtype == want.dtype == torch.float32
        assert (got - want).norm() < 1e-2 * want.norm()  # bf16 rounding of the chunked GEMMs' outputs


def test_rejects_bad_arguments() -> None:
    hidden, weight, targets = _inputs()
    with pytest.raises(ValueError, match="reduction='none'"):
        linear_cross_entropy(hidden, weight, targets, reduction="none")
    with pytest.raises(ValueError, match="chunk_size=0"):
        linear_cross_entropy(hidden, weight, targets, chunk_size=0)


def _llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, vocab_size=97, max_seq_len=16)
    return LlamaForCausalLM(config).double()


@pytest.mark.parametrize("cola", [False, True])
def test_lm_loss_takes_the_fused_path_with_the_plain_losses_and_grads(cola: bool) -> None:
    model = _llama()
    if cola:
        convert_(model, CoLAConfig(rank=8), filter_fn=lambda _m, name: "lm_head" not in name)
    ids = torch.randint(97, (2, 16), generator=torch.Generator().manual_seed(1))
    assert fused_head(model) is model.lm_head
    loss = lm_loss(model, ids)
    assert loss.grad_fn.name() == "_LinearCrossEntropyBackward"
    grads = torch.autograd.grad(loss, list(model.parameters()))
    targets = next_token_targets(ids)
    ref = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())  # float64 (causal_lm_loss casts to float32)
    ref_grads = torch.autograd.grad(ref, list(model.parameters()))
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    with torch.no_grad():
        summed = lm_loss(model, ids, reduction="sum")
        torch.testing.assert_close(summed.float(), causal_lm_loss(model(ids), ids, reduction="sum"))


def test_other_heads_take_the_logits_path() -> None:
    model = _llama()
    model.lm_head = LowRankLinear(32, 97, rank=8, bias=False, activation="silu").double()  # a CoLA head: B·σ(A·h)
    assert fused_head(model) is None
    hooked = _llama()
    hooked.lm_head.register_forward_hook(lambda *_: None)
    assert fused_head(hooked) is None
    ids = torch.randint(97, (2, 16), generator=torch.Generator().manual_seed(1))
    loss = lm_loss(model, ids)
    assert loss.grad_fn.name() != "_LinearCrossEntropyBackward"
    torch.testing.assert_close(loss, causal_lm_loss(model(ids), ids))


def test_a_target_far_below_the_top_logit_keeps_its_exact_loss() -> None:
    # Every token has logit 200 for class 5 and 0 for the others: the target class 3's probability e^-200
    # underflows to 0 in fp32 softmax, which the log-softmax of the plain path does not.
    hidden = torch.zeros(2, 6, 8)
    hidden[..., 0] = 1.0
    hidden.requires_grad_()
    weight = torch.zeros(20, 8)
    weight[5, 0] = 200.0
    weight.requires_grad_()
    targets = torch.full((2, 6), 3)
    targets[0, -1] = -100
    ref = F.cross_entropy(F.linear(hidden, weight).flatten(0, 1), targets.flatten())
    out = linear_cross_entropy(hidden, weight, targets)
    assert torch.isfinite(out) and out.item() > 199
    torch.testing.assert_close(out, ref)
    grads = torch.autograd.grad(out, (hidden, weight))
    ref_grads = torch.autograd.grad(ref, (hidden, weight))
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want)
