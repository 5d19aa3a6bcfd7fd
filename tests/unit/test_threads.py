"""Small tensor work on one thread (tensorslim.functional.threads) and its users at two threads, against float64
autograd through dense references and against plain AdamW. The test process runs on one thread (conftest); these
tests raise it to two, where the one-thread paths are taken."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import tensorslim.layers.tt as tt_layers
from tensorslim.decomp.tt import tt_to_full, ttm_to_full
from tensorslim.functional.threads import ONE_THREAD_MEAN_NUMEL, one_thread, one_thread_graph
from tensorslim.functional.tt import tt_factors_many, tt_linear_factors
from tensorslim.layers.tt import TTLinear
from tensorslim.layers.tt_embedding import TTEmbedding
from tensorslim.models.projections import linear_many
from tensorslim.train.optim import build_optimizer


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _RecordThreads(torch.autograd.Function):
    """Identity that records ``torch.get_num_threads()`` in forward and in backward."""

    seen: list[tuple[str, int]] = []

    @staticmethod
    def forward(ctx, x):
        _RecordThreads.seen.append(("forward", torch.get_num_threads()))
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        _RecordThreads.seen.append(("backward", torch.get_num_threads()))
        return grad


def test_one_thread_restores_the_count_also_after_an_error(two_threads):
    with one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError, match="boom"), one_thread():
        raise RuntimeError("boom")
    assert torch.get_num_threads() == 2


def test_one_thread_graph_runs_forward_and_backward_on_one_thread_and_gradchecks(two_threads):
    a = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    frozen = torch.randn(5, 2, dtype=torch.float64)  # an input that needs no gradient

    def fn(a, b, frozen):
        ab = _RecordThreads.apply(a @ b)
        return ab.tanh() @ frozen, (a * a).sum(0)

    _RecordThreads.seen.clear()
    outs = one_thread_graph(fn, a, b, frozen)
    torch.autograd.grad(outs, (a, b), (torch.ones(4, 2, dtype=torch.float64), torch.ones(3, dtype=torch.float64)))
    assert _RecordThreads.seen == [("forward", 1), ("backward", 1)]
    assert torch.get_num_threads() == 2
    # Against the plain function (autograd at two threads), and by finite differences.
    ref = torch.autograd.grad(sum(o.sum() for o in fn(a, b, frozen)), (a, b))
    ours = torch.autograd.grad(sum(o.sum() for o in one_thread_graph(fn, a, b, frozen)), (a, b))
    for x, y in zip(ours, ref, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda a, b: one_thread_graph(fn, a, b, frozen), (a, b))


def _dense_weight(layer: TTLinear) -> torch.Tensor:
    # Independent reference: tensordot of the gated cores, reshaped to (d_in, d_out).
    cores = [core.clone() for core in layer.cores]
    for k, gate in enumerate(layer.gates):
        cores[k] = cores[k] * torch.where(gate > layer.gate_threshold, gate, torch.zeros_like(gate))
    return tt_to_full(cores).reshape(layer.in_features, layer.out_features)


@pytest.mark.parametrize("one_thread_up_to", ["default", 0])  # 0: every contraction at the thread count
def test_tt_layers_at_two_threads_match_float64_dense(two_threads, monkeypatch, one_thread_up_to):
    if one_thread_up_to != "default":
        monkeypatch.setattr(tt_layers, "ONE_THREAD_MAX_FLOPS", one_thread_up_to)
    torch.manual_seed(0)
    layers = tuple(TTLinear((3, 4), (2, 2, 3), (1, 3, 4, 3, 2, 1)).double() for _ in range(3))
    for layer in layers[1:]:
        layer.enable_gates()
        with torch.no_grad():
            layer.gates[1][0] = 0.5
            layer.gates[2][1] = 1e-3  # dead gate
    x = torch.randn(5, 12, dtype=torch.float64, requires_grad=True)
    params = [x, *(p for layer in layers for p in layer.parameters())]
    grad_outs = [torch.randn(5, 12, dtype=torch.float64) for _ in layers]
    for outs in ([layer(x) for layer in layers], linear_many(x, layers)):
        refs = [x @ _dense_weight(layer) + layer.bias for layer in layers]
        for out, ref in zip(outs, refs, strict=True):
            torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
        ours = torch.autograd.grad(outs, params, grad_outs)
        expected = torch.autograd.grad(refs, params, grad_outs)
        for a, b in zip(ours, expected, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert torch.get_num_threads() == 2


def test_tt_embedding_at_two_threads_matches_float64_table(two_threads):
    torch.manual_seed(1)
    emb = TTEmbedding(30, (2, 2, 3, 3), (2, 1, 2, 3), (1, 3, 4, 3, 1)).double()
    emb.enable_gates()
    with torch.no_grad():
        emb.gates[0][1] = 0.25
    ids = torch.tensor([[1, 4, 4, 29], [0, 7, 1, 1]])
    grad_out = torch.randn(2, 4, 12, dtype=torch.float64)
    gated = [core.clone() for core in emb.cores]
    for k, gate in enumerate(emb.gates):
        gated[k] = gated[k] * gate  # every gate above the threshold
    ref = ttm_to_full(gated)[ids]
    out = emb(ids)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    params = list(emb.parameters())
    ours, expected = torch.autograd.grad(out, params, grad_out), torch.autograd.grad(ref, params, grad_out)
    for a, b in zip(ours, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def _threads_during_step(optimizer: torch.optim.Optimizer) -> list[int]:
    seen: list[int] = []
    optimizer.register_step_pre_hook(lambda *_: seen.append(torch.get_num_threads()))  # runs after ours
    return seen


@pytest.mark.parametrize("width", [8, 512])
def test_adamw_of_small_tensors_steps_on_one_thread_with_the_same_update(two_threads, width):
    small = width * width < ONE_THREAD_MEAN_NUMEL
    model = nn.Sequential(nn.Linear(width, width), nn.Linear(width, 3))
    reference = [p.detach().clone().requires_grad_() for p in model.parameters()]
    ours = build_optimizer(model, lr=1e-2, weight_decay=0.1)
    plain = torch.optim.AdamW(reference, lr=1e-2, weight_decay=0.1, fused=True)
    seen = _threads_during_step(ours)
    for step in range(3):
        gen = torch.Generator().manual_seed(step)
        for p, q in zip(model.parameters(), reference, strict=True):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        ours.step()
        plain.step()
        assert torch.get_num_threads() == 2
    assert seen == [1 if small else 2] * 3
    for p, q in zip(model.parameters(), reference, strict=True):
        assert torch.equal(p, q)
    mean = sum(p.numel() for p in model.parameters()) / len(reference)
    assert (mean < ONE_THREAD_MEAN_NUMEL) == small and math.isfinite(mean)


def test_tt_layer_under_activation_checkpointing_at_two_threads(two_threads):
    # Non-reentrant checkpointing (tensorslim.distributed) recomputes the inner graph's saved tensors in backward.
    torch.manual_seed(2)
    layer = TTLinear((3, 4), (2, 6), (1, 3, 4, 3, 1)).double()
    x = torch.randn(5, 12, dtype=torch.float64, requires_grad=True)
    params = [x, *layer.parameters()]
    block = lambda x: torch.tanh(layer(x)).pow(2)  # noqa: E731
    ours = torch.autograd.grad(torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False).sum(), params)
    ref = torch.autograd.grad((torch.tanh(x @ _dense_weight(layer) + layer.bias).pow(2)).sum(), params)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "in_f,out_f,ranks",
    [((4,), (5,), (1, 3, 1)), ((3, 4), (5,), (1, 3, 4, 1)), ((3, 2, 2), (2, 2, 3), (1, 2, 3, 4, 3, 2, 1))],
)
@pytest.mark.parametrize("single_thread", [True, False])
def test_written_out_contraction_gradchecks_and_equals_autograd(two_threads, in_f, out_f, ranks, single_thread):
    gen = torch.Generator().manual_seed(3)
    dims = in_f + out_f
    layers = []
    for _ in range(2):  # two layers in one call, as linear_many passes q, k and v
        cores = [
            torch.randn(r0, n, r1, generator=gen, dtype=torch.float64, requires_grad=True)
            for r0, n, r1 in zip(ranks[:-1], dims, ranks[1:], strict=True)
        ]
        layers.append((cores, len(in_f)))
    flat = [core for cores, _ in layers for core in cores]
    ours = [x for pair in tt_factors_many(layers, single_thread=single_thread) for x in pair]
    ref = [x for cores, n_in in layers for x in tt_linear_factors(cores, n_in=n_in)]
    grads = [torch.randn_like(r) for r in ref]
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    for a, b in zip(torch.autograd.grad(ours, flat, grads), torch.autograd.grad(ref, flat, grads), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)

    def run(*cores):
        n = len(dims)
        pairs = tt_factors_many([(cores[:n], len(in_f)), (cores[n:], len(in_f))], single_thread=single_thread)
        return tuple(x for pair in pairs for x in pair)

    assert torch.autograd.gradcheck(run, tuple(flat))
