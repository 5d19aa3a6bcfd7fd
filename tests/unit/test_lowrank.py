"""LowRankLinear: the explicit formula, from_dense/to_dense, CoLA's init, bad input.

Books, FlopCounterMode, gradcheck, state dict, meta, compile and bf16 are the shared contract (``tests/contracts.py``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.convert import convert_
from tensorslim.decomp.svd import truncated_svd
from tensorslim.layers.lowrank import CoLAConfig, LowRankLinear, SVDConfig
from tensorslim.models.llama import LlamaConfig, LlamaForCausalLM


@pytest.mark.parametrize("activation", ["identity", "silu", "gelu", "relu"])
@pytest.mark.parametrize("bias", [False, True])
def test_forward_matches_explicit_formula(activation: str, bias: bool) -> None:
    torch.manual_seed(0)
    layer = LowRankLinear(12, 7, 3, bias=bias, activation=activation)
    x = torch.randn(5, 4, 12)
    act = {"identity": lambda t: t, "silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu}.get(
        activation, torch.relu
    )
    expected = act(x @ layer.weight_a.T) @ layer.weight_b.T + (layer.bias if bias else 0)
    torch.testing.assert_close(layer(x), expected)


def test_from_dense_full_rank_reproduces_linear() -> None:
    torch.manual_seed(0)
    dense = nn.Linear(10, 6)
    layer = LowRankLinear.from_dense(dense, SVDConfig(rank=6))
    x = torch.randn(4, 10)
    torch.testing.assert_close(layer(x), dense(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.to_dense().weight, dense.weight, rtol=1e-5, atol=1e-5)


def test_from_dense_truncation_is_the_eckart_young_optimum() -> None:
    torch.manual_seed(0)
    weight = torch.randn(20, 30, dtype=torch.float64)
    a, b = truncated_svd(weight, 5)
    s = torch.linalg.svdvals(weight)
    # The Frobenius error of the best rank-5 approximation is the norm of the discarded singular values.
    torch.testing.assert_close(torch.linalg.norm(weight - b @ a), s[5:].norm())


def test_from_dense_hf_conv1d() -> None:
    transformers = pytest.importorskip("transformers")
    conv = transformers.pytorch_utils.Conv1D(8, 12)  # nf=8 outputs, nx=12 inputs; weight (12, 8)
    nn.init.normal_(conv.weight)
    nn.init.normal_(conv.bias)
    layer = LowRankLinear.from_dense(conv, SVDConfig(rank=8))
    x = torch.randn(3, 12)
    torch.testing.assert_close(layer(x), conv(x), rtol=1e-4, atol=1e-4)


def test_cola_init_std_matches_paper() -> None:
    torch.manual_seed(0)
    layer = LowRankLinear(1024, 1024, 256, activation="silu")
    expected = 256**-0.25 * 2048**-0.25
    assert abs(layer.weight_a.std().item() - expected) < 0.02 * expected
    assert abs(layer.weight_b.std().item() - expected) < 0.02 * expected


def test_to_dense_refuses_nonlinear() -> None:
    with pytest.raises(ValueError, match="activation='identity'"):
        LowRankLinear(4, 4, 2, activation="silu").to_dense()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rank": 0}, "rank=0"),
        ({"rank": -3}, "rank=-3"),
        ({"rank": 2.5}, "rank=2.5"),
        ({"rank_ratio": 0.0}, "rank_ratio=0.0"),
        ({"rank_ratio": 1.5}, "rank_ratio=1.5"),
        ({"activation": "tanhh"}, "activation='tanhh'"),
        ({"init": "zeros"}, "init='zeros'"),
    ],
)
def test_config_rejects_bad_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CoLAConfig(**kwargs)


def test_rank_above_layer_limit_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"rank=9 is out of range for a 8->16 layer; allowed 1..8"):
        CoLAConfig(rank=9).resolve_rank(8, 16)


def test_rank_ratio_resolves_against_smaller_side() -> None:
    assert CoLAConfig().resolve_rank(512, 1376) == 128
    assert SVDConfig(rank_ratio=1.0).resolve_rank(7, 3) == 3


def test_eval_stores_b_r_major_and_train_restores_it() -> None:
    torch.manual_seed(0)
    layer = LowRankLinear(64, 96, 16, bias=True, activation="silu", dtype=torch.float64)
    x = torch.randn(5, 64, dtype=torch.float64)
    b = layer.weight_b.detach().clone()
    with torch.no_grad():
        expected = layer(x)
    layer.eval()
    assert layer.weight_b.stride() == (1, 96) and torch.equal(layer.weight_b, b)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(layer.state_dict()["weight_b"], b)
    layer.train()
    assert layer.weight_b.is_contiguous() and torch.equal(layer.weight_b, b)


def test_an_eval_round_trip_leaves_training_unchanged() -> None:
    def trained(round_trip: bool) -> torch.Tensor:
        torch.manual_seed(0)
        layer = LowRankLinear(32, 48, 8, activation="silu")
        optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-2, fused=True)
        for _ in range(3):
            layer(torch.randn(4, 32)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            if round_trip:
                layer.eval()
                layer.train()
        return torch.cat([p.detach().flatten() for p in layer.parameters()])

    assert torch.equal(trained(True), trained(False))


def test_eval_layout_skips_meta_parameters() -> None:
    layer = LowRankLinear(32, 48, 8, device="meta").eval()
    assert layer.weight_b.is_contiguous()


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
