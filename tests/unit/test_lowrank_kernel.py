"""The CoLA / low-rank layer kernel (:class:`tensorslim.functional.lowrank._LowRankMatmul`, oneDNN on CPU) and the
shared down-projection of layers that read one input (:func:`tensorslim.layers.lowrank.linear_many`), against plain
autograd through ``B σ(A x) + b`` in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from tensorslim.convert import convert_
from tensorslim.functional.lowrank import ACTIVATIONS, _LowRankMatmul, low_rank_linear, low_rank_many
from tensorslim.functional.tt import _use_onednn
from tensorslim.layers.cola_m import CoLAMLinear
from tensorslim.layers.lowrank import CoLAConfig, LowRankLinear, linear_many
from tensorslim.models.llama import LlamaConfig, LlamaForCausalLM


def _reference(x, weight_a, weight_b, bias, activation):
    return F.linear(ACTIVATIONS[activation](F.linear(x, weight_a)), weight_b, bias)


def _kernel_node(out: torch.Tensor) -> torch.autograd.graph.Node | None:
    """The kernel's autograd node behind ``out`` (through a reshape of a 3-D input), or None."""
    node = out.grad_fn
    while node is not None and node.name() != "_LowRankMatmulBackward":
        node = node.next_functions[0][0] if node.name() == "ViewBackward0" else None
    return node


def _leaves(gen, *shapes, dtype=torch.float64):
    return [torch.randn(*shape, generator=gen, dtype=dtype).mul_(0.5).requires_grad_() for shape in shapes]


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("bias", [True, False])
def test_fp32_kernel_matches_float64_autograd(activation: str, bias: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    x64, a64, b64, bias64 = _leaves(gen, (3, 37, 24), (6, 24), (20, 6), (20,))  # 111 tokens, 3-D input
    leaves64 = [x64, a64, b64] + ([bias64] if bias else [])
    ref_out = _reference(x64, a64, b64, bias64 if bias else None, activation)
    grad_out = torch.randn(ref_out.shape, generator=gen, dtype=torch.float64)
    ref = torch.autograd.grad(ref_out, leaves64, grad_out)
    leaves = [t.detach().float().requires_grad_() for t in leaves64]
    assert _use_onednn(leaves[0].reshape(-1, 24), torch.float32, training=True)
    out = low_rank_linear(*leaves[:3], leaves[3] if bias else None, activation=activation)
    assert _kernel_node(out) is not None  # the kernel ran, not the plain product
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5 * ref_out.abs().max().item())
    ours = torch.autograd.grad(out, leaves, grad_out.float())
    for a, b in zip(ours, ref, strict=True):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5 * b.abs().max().item())


@pytest.mark.parametrize("activation", ["silu", "gelu", "identity"])
def test_hand_written_backward_gradcheck_with_shared_input(activation: str) -> None:
    # Three layers reading one x, different ranks and widths, one without bias; float64 takes BLAS (onednn=False).
    gen = torch.Generator().manual_seed(1)
    x = _leaves(gen, (7, 5))[0]
    weight_as = _leaves(gen, (2, 5), (3, 5), (1, 5))
    weight_bs = _leaves(gen, (4, 2), (6, 3), (4, 1))
    biases = _leaves(gen, (4,), (4,))

    def run(x, *flat):
        return _LowRankMatmul.apply(x, (2, 3, 1), activation, False, *flat[:6], flat[6], None, flat[7])

    inputs = (x, *weight_as, *weight_bs, *biases)
    assert torch.autograd.gradcheck(run, inputs)
    for out, a, b, bias in zip(run(*inputs), weight_as, weight_bs, [biases[0], None, biases[1]], strict=True):
        torch.testing.assert_close(out, _reference(x, a, b, bias, activation), rtol=1e-12, atol=1e-12)


def test_low_rank_many_equals_the_layers_one_by_one_on_onednn() -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 48, 16, generator=gen, requires_grad=True)
    pairs = [tuple(_leaves(gen, (r, 16), (d, r), dtype=torch.float32)) for r, d in ((4, 16), (6, 16), (4, 9))]
    biases = [None, _leaves(gen, (16,), dtype=torch.float32)[0], None]
    fused = low_rank_many(x, pairs, biases, activation="silu")
    assert _kernel_node(fused[0]) is _kernel_node(fused[2]) is not None
    ref = [_reference(x, a, b, bias, "silu") for (a, b), bias in zip(pairs, biases, strict=True)]
    params = [x, *(w for pair in pairs for w in pair), biases[1]]
    grads_out = [torch.randn(y.shape, generator=gen) for y in ref]
    for a, b in zip(fused, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    ours, expected = torch.autograd.grad(fused, params, grads_out), torch.autograd.grad(ref, params, grads_out)
    for a, b in zip(ours, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())


def test_kernel_choice_in_training_does_not_depend_on_the_batch() -> None:
    # A data-parallel rank sees fewer tokens than one process: both must take the same kernel (FSDP2 parity).
    # Float64 and inference below 64 tokens (decoding) take the plain product.
    layer = LowRankLinear(16, 16, 4, activation="silu")
    for tokens in (3, 200):
        assert _kernel_node(layer(torch.randn(tokens, 16))) is not None
    x = torch.randn(3, 16)
    assert _kernel_node(layer.double()(x.double())) is None
    layer.float()
    with torch.no_grad():
        torch.testing.assert_close(layer(x), _reference(x, layer.weight_a, layer.weight_b, None, "silu"))


@pytest.mark.parametrize("tokens", [32, 96])
def test_bf16_autocast_matches_the_plain_product(tokens: int) -> None:
    torch.manual_seed(3)
    layer = LowRankLinear(32, 24, 8, bias=True, activation="silu")
    x = torch.randn(tokens, 32, requires_grad=True)
    grad_out = torch.randn(tokens, 24)
    params = [x, *layer.parameters()]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
        ref_out = _reference(x, layer.weight_a, layer.weight_b, layer.bias, "silu")
    assert out.dtype == ref_out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref_out.float(), rtol=2e-2, atol=2e-2)
    ours = torch.autograd.grad(out, params, grad_out.bfloat16())
    ref = torch.autograd.grad(ref_out, params, grad_out.bfloat16())
    for a, b, p in zip(ours, ref, params, strict=True):
        assert a.dtype == p.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=3e-2, atol=3e-2 * b.abs().max().item())


def test_flop_counter_counts_every_gemm() -> None:
    layers = tuple(LowRankLinear(32, d, 8, activation="silu") for d in (32, 32, 48))
    x = torch.randn(70, 32, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        outs = linear_many(x, layers)
    assert counter.get_total_flops() == sum(layer.flops(70) for layer in layers)
    with FlopCounterMode(display=False) as counter:
        sum(y.sum() for y in outs).backward()
    assert counter.get_total_flops() == 2 * sum(layer.flops(70) for layer in layers)


def test_linear_many_fuses_only_plain_low_rank_layers_without_hooks() -> None:
    torch.manual_seed(4)
    layers = [LowRankLinear(16, 16, 4, activation="silu") for _ in range(3)]
    layers[2].enable_gates()
    with torch.no_grad():
        layers[2].gate[1] = 1e-3  # a pruned rank
    x = torch.randn(80, 16, requires_grad=True)
    fused = linear_many(x, tuple(layers))
    assert all(y.grad_fn is fused[0].grad_fn for y in fused)  # one node: one product for all three
    for y, layer in zip(fused, layers, strict=True):
        torch.testing.assert_close(y, layer(x), rtol=1e-5, atol=1e-6)
    calls = []
    layers[0].register_forward_hook(lambda *args: calls.append(1))
    cola_m = CoLAMLinear.from_low_rank(layers[1])
    for group in [(layers[0], layers[1]), (cola_m, layers[2]), (layers[1], nn.Linear(16, 16))]:
        outs = linear_many(x, group)
        assert outs[0].grad_fn is not outs[1].grad_fn  # one by one
        for y, layer in zip(outs, group, strict=True):
            torch.testing.assert_close(y, layer(x))
    assert len(calls) == 2  # the hook ran in linear_many and in the check


def test_cola_llama_loss_and_gradients_match_float64() -> None:
    torch.manual_seed(5)
    model = LlamaForCausalLM(LlamaConfig(d_model=32, n_layers=2, n_heads=2, d_ff=48, vocab_size=64, max_seq_len=32))
    convert_(model, CoLAConfig(rank=8, init="random"))
    ids = torch.randint(64, (2, 32))
    reference = LlamaForCausalLM(model.config).double()
    convert_(reference, CoLAConfig(rank=8, init="random"))
    reference.load_state_dict(model.state_dict())
    losses = [F.cross_entropy(m(ids).flatten(0, 1), ids.flatten()) for m in (model, reference)]
    torch.testing.assert_close(losses[0].double(), losses[1], rtol=1e-5, atol=1e-6)
    for loss in losses:
        loss.backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad.double(), q.grad, rtol=1e-4, atol=1e-5 * q.grad.abs().max().item(), msg=name)
