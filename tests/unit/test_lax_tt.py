"""LaX-TT: crossing at the TT middle bond, intra-layer residuals, books, G = 0, gradcheck, no full weight."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from tensorslim.convert import convert_
from tensorslim.layers.lax import LatentStore, crossing_params
from tensorslim.layers.lax_tt import LaXTTConfig, LaXTTLinear, intra_pairs
from tensorslim.layers.tt import TTConfig, TTLinear
from tensorslim.models.llama import LlamaConfig, LlamaForCausalLM

TINY = LlamaConfig(d_model=64, n_layers=3, n_heads=4, d_ff=144, vocab_size=128, max_seq_len=32)


def _layer(in_f, out_f, ranks, *, seed: int = 0, **kwargs) -> LaXTTLinear:
    torch.manual_seed(seed)
    layer = LaXTTLinear(in_f, out_f, ranks, dtype=torch.float64, **kwargs)
    with torch.no_grad():  # O(1) cores, so that every path carries signal in float64 checks
        for core in layer.cores:
            core.normal_()
    return layer


def _half(cores: list[torch.Tensor]) -> torch.Tensor:
    """Independent reference: chain the cores with tensordot, (r_first, ∏n, r_last)."""
    acc = cores[0]
    for core in cores[1:]:
        acc = torch.tensordot(acc, core, dims=([acc.dim() - 1], [0]))
    return acc.reshape(acc.shape[0], -1, acc.shape[-1])


def _lax_llama(crossing: str, *, intra: tuple[str, ...] = ()) -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(TINY).double()
    convert_(model, LaXTTConfig(rank=6, n_cores=4, init="random", crossing=crossing, intra_res=intra))
    return model


def test_latent_is_the_middle_bond_and_crossing_shapes_and_counts_are_exact() -> None:
    layer = LaXTTLinear((4, 6), (6, 4), (1, 4, 10, 4, 1), crossing="kronecker")
    assert layer.latent_rank == 10 == layer.ranks[layer.n_in]
    tt_params = 4 * 4 + 4 * 6 * 10 + 10 * 6 * 4 + 4 * 4 + 24  # cores + bias
    assert layer.num_params() == tt_params == sum(p.numel() for p in layer.parameters())
    for kind, added, shapes in [
        ("identity", 20, []),
        ("dense", 100 + 10 + 20, [(10, 10), (10,)]),
        ("kronecker", 4 + 25 + 20, [(2, 2), (5, 5)]),  # 10 = 2·5
    ]:
        layer = LaXTTLinear((4, 6), (6, 4), (1, 4, 10, 4, 1), crossing=kind)
        layer.join(LatentStore(), "s", cross=True)
        assert crossing_params(kind, 10) == added
        assert layer.num_params() == tt_params + added == sum(p.numel() for p in layer.parameters())
        assert [tuple(p.shape) for p in layer.crossing.parameters()] == shapes
        assert layer.norm.normalized_shape == (10,) and layer.norm.eps == 1e-6
    layer.enable_intra_res()  # intra residuals add no parameters
    assert layer.num_params() == tt_params + added


def test_crossing_forward_formula() -> None:
    layer = _layer((3, 4), (5, 2), (1, 3, 6, 2, 1), crossing="dense", activation="silu")
    store = LatentStore()
    layer.join(store, "s", cross=True)
    x, h_prev = torch.randn(2, 5, 12, dtype=torch.float64), torch.randn(10, 6, dtype=torch.float64)
    store.put("s", h_prev)
    left, right = _half(list(layer.cores[:2]))[0], _half(list(layer.cores[2:]))[..., 0]  # (12, 6), (6, 10)
    z = F.layer_norm(
        x.reshape(10, 12) @ left + layer.crossing(h_prev), (6,), layer.norm.weight, layer.norm.bias, eps=1e-6
    )
    expected = F.silu(z) @ right + layer.bias
    torch.testing.assert_close(layer(x), expected.reshape(2, 5, 10))
    torch.testing.assert_close(store.get("s"), F.silu(z))  # the post-norm, post-activation latent goes on


def test_intra_res_matches_official_4_core_einsums() -> None:
    """The official ``LeftHalfContractionIntra``/``RightHalfContractionIntra`` for 4 cores, ungated, no crossing."""
    layer = _layer((3, 4), (4, 5), (1, 3, 6, 3, 1), intra_res=True)
    c0, c1, c2, c3 = layer.cores[0][0], layer.cores[1], layer.cores[2], layer.cores[3][..., 0]
    x = torch.randn(7, 12, dtype=torch.float64)
    t0 = torch.einsum("abc,bg->acg", x.reshape(-1, 3, 4), c0)  # (a, n2, r1)
    latent = torch.einsum("acg,gcj->aj", t0, c1)
    t2 = torch.einsum("aj,jkl->akl", latent, c2) + t0  # (a, n3, r3) += (a, n2, r1)
    expected = torch.einsum("akl,ln->akn", t2, c3).reshape(-1, 20) + layer.bias
    torch.testing.assert_close(layer(x), expected)
    plain = torch.einsum("akl,ln->akn", t2 - t0, c3).reshape(-1, 20) + layer.bias
    assert not torch.allclose(layer(x), plain)  # the residual is live


def test_intra_res_matches_official_6_core_einsums() -> None:
    layer = _layer((2, 3, 3), (3, 3, 2), (1, 2, 4, 5, 4, 2, 1), intra_res=True)
    c = [layer.cores[0][0], *layer.cores[1:5], layer.cores[5][..., 0]]
    x = torch.randn(5, 18, dtype=torch.float64)
    t0 = torch.einsum("abcd,bg->acdg", x.reshape(-1, 2, 3, 3), c[0])
    t1 = torch.einsum("acdg,gci->adi", t0, c[1])
    latent = torch.einsum("adi,idj->aj", t1, c[2])
    t3 = torch.einsum("aj,jkl->akl", latent, c[3]) + t1
    t4 = torch.einsum("akl,lmn->akmn", t3, c[4]) + t0
    expected = torch.einsum("akmn,np->akmp", t4, c[5]).reshape(-1, 18) + layer.bias
    torch.testing.assert_close(layer(x), expected)


def test_intra_pairs_rejects_unmirrored_halves() -> None:
    assert intra_pairs((8, 8, 4), (4, 8, 8), (1, 8, 30, 30, 30, 8, 1)) == [(1, 2), (2, 1)]
    with pytest.raises(ValueError, match="mirrored"):
        intra_pairs((8, 8, 4), (4, 4, 43), (1, 8, 30, 30, 30, 30, 1))
    with pytest.raises(ValueError, match="2 cores"):
        intra_pairs((12,), (3, 4), (1, 3, 3, 1))
    with pytest.raises(ValueError, match="mirrored"):
        LaXTTLinear((3, 4), (4, 5), (1, 3, 6, 2, 1), intra_res=True)  # r_1 = 3 ≠ r_3 = 2


def test_bad_config_is_a_one_line_error() -> None:
    for kwargs, match in [
        ({"crossing": "diag"}, "crossing='diag' is unknown"),
        ({"norm_eps": 0.0}, "norm_eps"),
        ({"activation": "tanh"}, "act"),
    ]:
        with pytest.raises(ValueError, match=match) as info:
            LaXTTConfig(**kwargs)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="intra_res"):
        LaXTTConfig(intra_res="q_proj")
    model = LlamaForCausalLM(TINY)
    with pytest.raises(ValueError, match="up_proj.*mirrored"):  # 64 → 144: (8, 8) | (12, 12)
        convert_(model, LaXTTConfig(rank=6, n_cores=4, init="random", intra_res=("up_proj",)))


def test_block_0_has_no_crossing_and_books_are_exact() -> None:
    model = _lax_llama("kronecker", intra=("q_proj", "k_proj", "v_proj", "o_proj"))
    for i, block in enumerate(model.layers):
        layers = [m for m in block.modules() if isinstance(m, LaXTTLinear)]
        assert len(layers) == 7 and all(m.crosses == (i > 0) for m in layers)
        assert sum(m.intra_res for m in layers) == 4
        if i == 0:
            assert all(m.crossing is None and m.norm is None for m in layers)
    plain = LlamaForCausalLM(TINY)
    torch.manual_seed(0)
    convert_(plain, TTConfig(rank=6, n_cores=4, init="random"))
    added = sum(crossing_params("kronecker", m.latent_rank) for m in model.modules() if getattr(m, "crosses", 0))
    assert added == 2 * 7 * (4 + 9 + 12)  # r_mid = 6 = 2·3 everywhere
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in plain.parameters()) + added


class _LayerNormedTT(nn.Module):
    """Reference for a crossing layer with G = 0: ``LN_r(x·L)·R + b``, L and R chained independently."""

    def __init__(self, layer: LaXTTLinear) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lay = self.layer
        left, right = _half(list(lay.cores[: lay.n_in]))[0], _half(list(lay.cores[lay.n_in :]))[..., 0]
        z = F.layer_norm(x @ left, (lay.latent_rank,), lay.norm.weight, lay.norm.bias, eps=lay.norm.eps)
        return z @ right


def _plain_tt(layer: LaXTTLinear) -> TTLinear:
    plain = TTLinear(layer.in_factors, layer.out_factors, layer.ranks, bias=layer.bias is not None).double()
    plain.load_state_dict({k: v for k, v in layer.state_dict().items() if k.startswith(("cores", "bias"))})
    return plain


@pytest.mark.parametrize("kind", ["dense", "kronecker"])
def test_zero_crossing_equals_plain_tt_model_with_latent_layernorm(kind: str) -> None:
    """With G = 0: the plain TT model with LN_r on the middle-bond latents of blocks i > 0 (the same semantics as
    LaX for low-rank layers), and exactly the plain TTLinear in block 0."""
    model = _lax_llama(kind)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LaXTTLinear) and module.crosses:
                for p in module.crossing.parameters():
                    p.zero_()
    reference = copy.deepcopy(model)
    for name, module in list(reference.named_modules()):
        if isinstance(module, LaXTTLinear):
            parent, _, child = name.rpartition(".")
            plain = _LayerNormedTT(module) if module.crosses else _plain_tt(module)
            setattr(reference.get_submodule(parent), child, plain)
    ids = torch.randint(0, TINY.vocab_size, (2, 10))
    torch.testing.assert_close(model(ids), reference(ids), rtol=1e-10, atol=1e-10)
    with torch.no_grad():  # a non-zero crossing changes the output: it is live
        for p in model.layers[2].mlp.down_proj.crossing.parameters():
            p.copy_(torch.randn_like(p))
    assert not torch.allclose(model(ids), reference(ids))


@pytest.mark.parametrize(("kind", "intra"), [("kronecker", True), ("dense", False)])
def test_gradcheck_float64(kind: str, intra: bool) -> None:
    layer = _layer((2, 3), (3, 2), (1, 2, 4, 2, 1), crossing=kind, activation="silu", intra_res=intra)
    store = LatentStore()
    layer.join(store, "s", cross=True)
    names = [n for n, _ in layer.named_parameters()]

    def run(x, h_prev, *params):
        store.put("s", h_prev)
        return torch.func.functional_call(layer, dict(zip(names, params, strict=True)), (x,))

    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    h_prev = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    params = [p.detach().clone().requires_grad_() for p in layer.parameters()]
    assert torch.autograd.gradcheck(run, (x, h_prev, *params))


class _Shapes(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.numels: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.numels.add(t.numel())
        return out


@pytest.mark.parametrize("intra", [False, True])
def test_full_weight_is_never_formed(intra: bool) -> None:
    layer = _layer((3, 4), (4, 5), (1, 3, 6, 3, 1), crossing="kronecker", intra_res=intra)  # W: 12 × 20 = 240
    store = LatentStore()
    layer.join(store, "s", cross=True)
    x = torch.randn(7, 12, dtype=torch.float64, requires_grad=True)  # 7 tokens: no token tensor has 240 entries
    store.put("s", torch.randn(7, 6, dtype=torch.float64))
    with _Shapes() as seen:
        layer(x).sum().backward()
    assert 240 not in seen.numels
    with _Shapes() as check:  # the detector does see a formed weight
        layer.weight_matrix()
    assert 240 in check.numels


@pytest.mark.parametrize("intra", [False, True])
def test_flops_match_flop_counter(intra: bool) -> None:
    layer = _layer((3, 4), (4, 5), (1, 3, 6, 3, 1), crossing="dense", intra_res=intra)
    store = LatentStore()
    layer.join(store, "s", cross=True)
    store.put("s", torch.randn(7, 6, dtype=torch.float64))
    with FlopCounterMode(display=False) as counter:
        layer(torch.randn(7, 12, dtype=torch.float64))
    assert counter.get_total_flops() == layer.flops(7)


def test_lax_tt_on_a_4_block_llama() -> None:
    """The paper's LaX-TT setting (CoMERA's 6-core TT at max rank 30, intra residuals on attention) on a 4-block
    LLaMA: 7 streams × 3 crossing blocks, and exact books against the plain TT model."""
    shape = LlamaConfig(d_model=256, n_layers=4, n_heads=4, d_ff=688, vocab_size=4096, max_seq_len=256)
    with torch.device("meta"):
        model, comera = LlamaForCausalLM(shape), LlamaForCausalLM(shape)
    report = convert_(model, LaXTTConfig(rank=30, init="random", intra_res=("q_proj", "k_proj", "v_proj", "o_proj")))
    convert_(comera, TTConfig(rank=30, init="random"))
    layers = {n: m for n, m in model.named_modules() if isinstance(m, LaXTTLinear)}
    assert len(layers) == 28 and sum(m.crosses for m in layers.values()) == 21
    assert {n.rsplit(".", 1)[-1] for n, m in layers.items() if m.intra_res} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert {m.latent_rank for m in layers.values()} == {30}
    extra = 21 * crossing_params("kronecker", 30)  # 5·5 + 6·6 + 60 = 121 per crossing
    assert report.model_params_after == sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in comera.parameters()) + extra
    assert extra == 2541
