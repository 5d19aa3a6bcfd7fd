"""TT/TTM decomposition, contraction and layers against independent references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from tensorslim.decomp.shapes import check_factors, factorize, pad_and_factorize
from tensorslim.decomp.tt import tt_matrix_svd, tt_svd, tt_to_full, ttm_svd, ttm_to_full
from tensorslim.functional.tt import (
    _use_onednn,
    factored_linear,
    plan_chain,
    token_sum_mm,
    tt_linear,
    ttm_lookup_chain,
    ttm_lookup_halves,
)
from tensorslim.layers.tt import TTConfig, TTLinear, resolve_ranks
from tensorslim.layers.tt_embedding import TTEmbedding, TTEmbeddingConfig
from tensorslim.models.projections import linear_many

# (in_factors, out_factors, ranks): 2, 3, 4 and 6 cores, including an uneven input/output split.
LINEAR_SHAPES = [
    ((4,), (5,), (1, 3, 1)),
    ((3, 4), (5,), (1, 3, 4, 1)),
    ((3, 2), (2, 4), (1, 3, 4, 3, 1)),
    ((3, 2, 2), (2, 2, 3), (1, 2, 3, 4, 3, 2, 1)),
]
# (rows, row_factors, col_factors, ranks): orders 2, 3, 4 with padding rows.
EMBEDDING_SHAPES = [
    (10, (3, 4), (2, 3), (1, 4, 1)),
    (20, (2, 3, 4), (2, 2, 2), (1, 3, 4, 1)),
    (30, (2, 2, 3, 3), (2, 1, 2, 3), (1, 3, 4, 3, 1)),
]


def _random_cores(dims, ranks, *, dtype=torch.float64, seed=0, four_way_cols=None):
    gen = torch.Generator().manual_seed(seed)
    if four_way_cols is None:
        shapes = [(r0, n, r1) for r0, n, r1 in zip(ranks[:-1], dims, ranks[1:], strict=True)]
    else:
        shapes = [(r0, m, n, r1) for r0, m, n, r1 in zip(ranks[:-1], dims, four_way_cols, ranks[1:], strict=True)]
    return [torch.randn(shape, generator=gen, dtype=dtype) for shape in shapes]


# ---------------------------------------------------------------- shapes


def test_factorize_reproduces_comera_modes():
    assert factorize(768, 3, order="descending") == (12, 8, 8)
    assert factorize(768, 3) == (8, 8, 12)
    assert factorize(3072, 3) == (12, 16, 16)
    assert factorize(768, 4) == (4, 4, 6, 8)


def test_pad_and_factorize_pads_vocab():
    factors = pad_and_factorize(30522, 4)
    assert len(factors) == 4 and 30522 <= math.prod(factors) <= 30522 * 1.1
    assert max(factors) <= 14  # 14^4 ≥ 30,522 > 13^4, so no 4-mode split can have a smaller largest mode


def test_factorize_prime_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot be split"):
        factorize(97, 2)


# ---------------------------------------------------------------- decomposition


def test_tt_svd_matches_tensorly_error():
    tensorly = pytest.importorskip("tensorly")
    from tensorly.decomposition import tensor_train

    gen = np.random.default_rng(0)
    tensor = gen.standard_normal((4, 5, 6, 3))
    ranks = [3, 4, 3]
    ours = tt_to_full(tt_svd(torch.from_numpy(tensor), ranks)).numpy()
    theirs = tensorly.tt_to_tensor(tensor_train(tensor, rank=[1, *ranks, 1]))
    err_ours = np.linalg.norm(ours - tensor) / np.linalg.norm(tensor)
    err_theirs = np.linalg.norm(theirs - tensor) / np.linalg.norm(tensor)
    assert 0 < err_ours <= err_theirs * (1 + 1e-8) + 1e-12
    assert err_ours == pytest.approx(err_theirs, rel=1e-6)


def test_tt_matrix_svd_full_rank_is_exact_and_pads_excess_ranks():
    weight = torch.randn(12, 10, dtype=torch.float64)
    cores = tt_matrix_svd(weight, (3, 4), (5, 2), [3, 10, 2])
    assert [tuple(c.shape) for c in cores] == [(1, 3, 3), (3, 4, 10), (10, 5, 2), (2, 2, 1)]
    torch.testing.assert_close(tt_to_full(cores).reshape(12, 10), weight)
    # A bond above what the unfolding allows is filled with zeros; the reconstruction is still exact.
    padded = tt_svd(torch.randn(2, 3, dtype=torch.float64), [5])
    assert padded[0].shape == (1, 2, 5) and torch.all(padded[0][..., 2:] == 0)


def test_ttm_svd_full_rank_is_exact_with_padding_rows():
    table = torch.randn(10, 6, dtype=torch.float64)
    cores = ttm_svd(table, (3, 4), (2, 3), [6])
    full = ttm_to_full(cores)
    assert full.shape == (12, 6)
    torch.testing.assert_close(full[:10], table)
    torch.testing.assert_close(full[10:], torch.zeros(2, 6, dtype=torch.float64))


# ---------------------------------------------------------------- contraction planning


def test_plan_chain_is_optimal_against_brute_force():
    def brute(sizes, ranks):
        if len(sizes) == 1:
            return 0
        return min(
            brute(sizes[:s], ranks[: s + 1])
            + brute(sizes[s:], ranks[s:])
            + 2 * ranks[0] * math.prod(sizes[:s]) * ranks[s] * math.prod(sizes[s:]) * ranks[-1]
            for s in range(1, len(sizes))
        )

    for sizes, ranks in [((12, 8, 8), (1, 12, 30, 30)), ((8, 8, 12), (30, 30, 12, 1)), ((2, 9, 3, 7), (4, 1, 8, 2, 5))]:
        assert plan_chain(sizes, ranks)[1] == brute(sizes, ranks)


# ---------------------------------------------------------------- TT linear


@pytest.mark.parametrize("in_f,out_f,ranks", LINEAR_SHAPES)
def test_tt_linear_forward_equals_dense_reconstruction(in_f, out_f, ranks):
    cores = _random_cores(in_f + out_f, ranks)
    bias = torch.randn(math.prod(out_f), dtype=torch.float64)
    x = torch.randn(2, 3, math.prod(in_f), dtype=torch.float64)
    weight = tt_to_full(cores).reshape(math.prod(in_f), math.prod(out_f))  # independent tensordot reference
    torch.testing.assert_close(tt_linear(x, cores, bias, n_in=len(in_f)), x @ weight + bias, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("in_f,out_f,ranks", LINEAR_SHAPES)
def test_tt_linear_gradients(in_f, out_f, ranks):
    cores = [c.requires_grad_() for c in _random_cores(in_f + out_f, ranks, seed=1)]
    bias = torch.randn(math.prod(out_f), dtype=torch.float64, requires_grad=True)
    x = torch.randn(3, math.prod(in_f), dtype=torch.float64, requires_grad=True)
    n_in = len(in_f)
    assert torch.autograd.gradcheck(lambda x, b, *cs: tt_linear(x, cs, b, n_in=n_in), (x, bias, *cores))
    # And equal to autograd through the dense reconstruction.
    grad_out = torch.randn(3, math.prod(out_f), dtype=torch.float64)
    ours = torch.autograd.grad(tt_linear(x, cores, bias, n_in=n_in), (x, bias, *cores), grad_out)
    weight = tt_to_full(cores).reshape(math.prod(in_f), math.prod(out_f))
    ref = torch.autograd.grad(x @ weight + bias, (x, bias, *cores), grad_out)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("bias", [True, False])
def test_tt_linear_fp32_onednn_path_matches_float64_dense(bias):
    # From 64 tokens an fp32 CPU layer runs on oneDNN's matmul (float64, as in gradcheck above, never does).
    in_f, out_f, ranks = (3, 2, 2), (2, 2, 3), (1, 2, 3, 4, 3, 2, 1)
    cores64 = [c.requires_grad_() for c in _random_cores(in_f + out_f, ranks, seed=2)]
    bias64 = torch.randn(12, dtype=torch.float64, requires_grad=True) if bias else None
    x64 = torch.randn(131, 12, dtype=torch.float64, requires_grad=True)  # odd: a remainder after the token slices
    grad_out = torch.randn(131, 12, dtype=torch.float64)
    leaves64 = [x64, *cores64] + ([bias64] if bias else [])
    weight = tt_to_full(cores64).reshape(12, 12)
    ref_out = x64 @ weight + (bias64 if bias else 0)
    ref = torch.autograd.grad(ref_out, leaves64, grad_out)
    leaves = [t.detach().float().requires_grad_() for t in leaves64]
    x, cores = leaves[0], leaves[1:7]
    assert _use_onednn(x, x.dtype, training=True)
    out = tt_linear(x, cores, leaves[7] if bias else None, n_in=3)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5 * ref_out.abs().max().item())
    ours = torch.autograd.grad(out, leaves, grad_out.float())
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5 * b.abs().max().item())


def test_training_takes_one_kernel_whatever_the_batch():
    # A data-parallel rank sees fewer tokens than one process: both must round the same way, so training never
    # switches kernel with the batch size; inference below 64 tokens (decoding) takes BLAS for its lower set-up cost.
    few, many = torch.zeros(8, 12), torch.zeros(131, 12)
    assert _use_onednn(few, torch.float32, training=True) == _use_onednn(many, torch.float32, training=True)
    assert not _use_onednn(few, torch.float32, training=False)
    assert not _use_onednn(many, torch.float64, training=True)


def test_factored_linear_shared_input_gradcheck():
    # Three factored weights reading one x (one with no bias, different ranks and widths), float64.
    gen = torch.Generator().manual_seed(3)
    shapes = [(3, 5), (2, 4), (4, 5)]
    lefts = [torch.randn(6, r, generator=gen, dtype=torch.float64, requires_grad=True) for r, _ in shapes]
    rights = [torch.randn(r, d, generator=gen, dtype=torch.float64, requires_grad=True) for r, d in shapes]
    biases = [torch.randn(5, dtype=torch.float64, requires_grad=True), None, torch.randn(5, dtype=torch.float64)]
    biases[2].requires_grad_()
    x = torch.randn(2, 3, 6, generator=gen, dtype=torch.float64, requires_grad=True)

    def run(x, *flat):
        factors = list(zip(flat[:3], flat[3:6], strict=True))
        return tuple(factored_linear(x, factors, [flat[6], None, flat[7]]))

    inputs = (x, *lefts, *rights, biases[0], biases[2])
    assert torch.autograd.gradcheck(run, inputs)
    outs = run(*inputs)
    for out, left, right, bias in zip(outs, lefts, rights, biases, strict=True):
        torch.testing.assert_close(out, x @ left @ right + (0 if bias is None else bias), rtol=1e-12, atol=1e-12)


def test_factored_linear_with_a_pruned_to_zero_rank():
    # CoMERA's gates can prune a middle rank to 0; at 80 fp32 tokens (the oneDNN size) the empty factor must work.
    x = torch.randn(80, 6, requires_grad=True)
    live = (torch.randn(6, 3, requires_grad=True), torch.randn(3, 5, requires_grad=True))
    empty = (torch.zeros(6, 0, requires_grad=True), torch.zeros(0, 5, requires_grad=True))
    bias = torch.randn(5, requires_grad=True)
    outs = factored_linear(x, [live, empty], [None, bias])
    torch.testing.assert_close(outs[0], x @ live[0] @ live[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[1], bias.expand(80, 5))
    grad_x, grad_bias = torch.autograd.grad(outs[0].sum() + outs[1].sum(), (x, bias))
    torch.testing.assert_close(grad_x, (live[0] @ live[1]).sum(1).expand(80, 6), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_bias, torch.full((5,), 80.0))


@pytest.mark.parametrize("tokens", [10, 96])  # BLAS below 64 tokens, oneDNN from 64
def test_linear_many_equals_the_layers_one_by_one(tokens):
    torch.manual_seed(4)
    layers = [
        TTLinear.from_dense(nn.Linear(24, 24), TTConfig(rank=5, init="random", rank_gates=True)) for _ in range(3)
    ]
    layers[1].bias = None
    with torch.no_grad():
        layers[2].gates[0][1] = 1e-3  # a pruned rank
    x = torch.randn(tokens, 24, requires_grad=True)
    grads_out = [torch.randn(tokens, 24) for _ in layers]
    params = [x, *(p for layer in layers for p in layer.parameters())]
    fused = linear_many(x, tuple(layers))
    ref = [layer(x) for layer in layers]
    for a, b in zip(fused, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    ours = torch.autograd.grad(fused, params, grads_out)
    expected = torch.autograd.grad(ref, params, grads_out)
    for a, b in zip(ours, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())
    # Layers of other kinds (or a single one) run one by one.
    mixed = (layers[0], nn.Linear(24, 24))
    assert [y.shape for y in linear_many(x, mixed)] == [(tokens, 24), (tokens, 24)]


@pytest.mark.parametrize("pieces", [1, 2, 3, 20])
def test_token_sum_mm_equals_the_product(pieces):
    a, b = torch.randn(10, 3, dtype=torch.float64), torch.randn(10, 5, dtype=torch.float64)
    torch.testing.assert_close(token_sum_mm(a, b, pieces=pieces), a.t() @ b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("tokens", [32, 96])  # BLAS below 64 tokens, oneDNN from 64
def test_tt_linear_under_bf16_autocast_matches_fp32(bias, tokens):
    # Backward runs outside autocast: it must not mix the bf16 latent with fp32 factors (it raised before).
    layer = TTLinear((4, 4), (4, 4), (1, 4, 6, 4, 1), bias=bias)
    x = torch.randn(tokens, 16, requires_grad=True)
    grad_out = torch.randn(tokens, 16)
    params = [x, *layer.parameters()]
    ref = torch.autograd.grad(layer(x), params, grad_out)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.bfloat16
    ours = torch.autograd.grad(out, params, grad_out)
    for a, b in zip(ours, ref, strict=True):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=0.05, atol=0.05 * b.abs().max().item())


def test_tt_linear_gates_gradcheck():
    layer = TTLinear((3, 2), (2, 2), (1, 3, 4, 2, 1)).double()
    layer.enable_gates()
    with torch.no_grad():
        layer.gates[1][0] = 0.5  # live, non-trivial
        layer.gates[1][1] = 1e-3  # dead: masked to 0
    x = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    params = [x, *layer.cores, *layer.gates]

    names = [n for n, _ in layer.named_parameters()]

    def run(x, *rest):
        return torch.func.functional_call(layer, dict(zip(names, rest, strict=True)), (x,))

    assert torch.autograd.gradcheck(run, (x, *[p for _, p in layer.named_parameters()]))
    grads = torch.autograd.grad(layer(x).sum(), params[1:])
    assert grads[len(layer.cores) + 1][1] == 0  # no gradient reaches a dead gate


def test_tt_linear_from_dense_full_rank_and_comera_counts():
    dense = nn.Linear(24, 30).double()
    layer = TTLinear.from_dense(dense, TTConfig(rank=1000, n_cores=4))
    x = torch.randn(5, 24, dtype=torch.float64)
    torch.testing.assert_close(layer(x), dense(x))
    torch.testing.assert_close(layer.to_dense().weight, dense.weight)
    # CoMERA's shapes and core counts (paper p.16): 20,448 / 28,960 core parameters at r=30.
    attn = TTLinear.from_dense(nn.Linear(768, 768, device="meta"), TTConfig(init="random"))
    assert attn.ranks == (1, 12, 30, 30, 30, 12, 1) and attn.in_factors == (12, 8, 8) and attn.out_factors == (8, 8, 12)
    assert attn.num_params() == 20448 + 768 == sum(p.numel() for p in attn.parameters())
    ffn = TTLinear.from_dense(nn.Linear(768, 3072, bias=False, device="meta"), TTConfig(init="random"))
    assert ffn.out_factors == (12, 16, 16) and ffn.num_params() == 28960


@pytest.mark.parametrize("tokens", [7, 70])  # 70: the counter must see the GEMMs that oneDNN would run
@pytest.mark.parametrize("in_f,out_f,ranks", LINEAR_SHAPES[2:])
def test_tt_linear_flops_match_flop_counter(in_f, out_f, ranks, tokens):
    layer = TTLinear(in_f, out_f, ranks)
    x = torch.randn(tokens, layer.in_features)
    with FlopCounterMode(display=False) as counter:
        layer(x)
    assert counter.get_total_flops() == layer.flops(tokens)


def test_tt_linear_init_std_matches_comera():
    layer = TTLinear((12, 8, 8), (8, 8, 12), (1, 12, 30, 30, 30, 12, 1))
    # CoMERA targets std(W) = √(1/(d_in+d_out)); the Gaussian chain makes it hold in expectation.
    assert layer.weight_matrix().std().item() == pytest.approx((1 / 1536) ** 0.5, rel=0.3)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"rank": 0}, "rank=0"),
        ({"rank": (1, 2, 2, 1), "n_cores": 2}, "has 4 entries"),
        ({"rank": (1, 2, 0, 2, 1), "in_factors": (2, 3), "out_factors": (2, 2)}, "bond 2 has rank 0"),
        ({"in_factors": (2, 4), "out_factors": (2, 2)}, r"in_factors=\[2, 4\] has product 8; it must equal 6"),
        ({"n_cores": 1}, "n_cores=1"),
        ({"init": "svd"}, "init='svd'"),
    ],
)
def test_tt_config_bad_input_is_a_one_line_error(kwargs, match):
    with pytest.raises(ValueError, match=match) as info:
        TTConfig(**kwargs).resolve(6, 4)
    assert "\n" not in str(info.value)


def test_resolve_ranks_clips_integer_rank_to_bounds():
    assert resolve_ranks(30, (12, 8, 8, 8, 8, 12)) == (1, 12, 30, 30, 30, 12, 1)


# ---------------------------------------------------------------- TTM embedding


@pytest.mark.parametrize("rows,row_f,col_f,ranks", EMBEDDING_SHAPES)
@pytest.mark.parametrize("lookup", ["halves", "chain"])
@pytest.mark.parametrize("unique", [True, False])
def test_tt_embedding_lookup_equals_full_table(rows, row_f, col_f, ranks, lookup, unique):
    emb = TTEmbedding(rows, row_f, col_f, ranks, lookup=lookup, unique=unique).double()
    ids = torch.tensor([[0, rows - 1, 3, 3], [rows - 1, 1, 0, 2]])
    table = ttm_to_full(list(emb.cores))  # independent tensordot reference, padded
    assert table.shape[0] > rows  # these shapes do have padding rows
    torch.testing.assert_close(emb(ids), table[ids], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(emb(ids), emb.to_dense()(ids), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rows,row_f,col_f,ranks", EMBEDDING_SHAPES)
def test_tt_embedding_gradients(rows, row_f, col_f, ranks):
    cores = [c.requires_grad_() for c in _random_cores(row_f, ranks, four_way_cols=col_f, seed=2)]
    ids = torch.tensor([1, 4, 4, rows - 1, 0])
    split = len(cores) // 2
    for unique in (True, False):
        run = lambda *cs, unique=unique: ttm_lookup_halves(ids, cs, split=split, unique=unique)  # noqa: E731
        assert torch.autograd.gradcheck(run, tuple(cores))
    grad_out = torch.randn(5, math.prod(col_f), dtype=torch.float64)
    ref = torch.autograd.grad(ttm_to_full(cores)[ids], cores, grad_out)
    for lookup in (lambda cs: ttm_lookup_halves(ids, cs, split=split), lambda cs: ttm_lookup_chain(ids, cs)):
        for a, b in zip(torch.autograd.grad(lookup(cores), cores, grad_out), ref, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_tt_embedding_rejects_padding_and_negative_ids():
    emb = TTEmbedding(10, (3, 4), (2, 3), (1, 4, 1))
    with pytest.raises(IndexError, match=r"\[0, 10\)"):
        emb(torch.tensor([10]))
    with pytest.raises(IndexError):
        emb(torch.tensor([-1]))


def test_tt_embedding_comera_shapes_counts_and_split():
    emb = TTEmbedding(30522, (16, 20, 10, 10), (4, 4, 8, 6), (1, 32, 32, 32, 1), device="meta")
    assert emb.num_params() == 167808 and emb.split == 2
    # Index arithmetic happens on the ids' device: a meta module runs on meta ids (no CUDA-pinned buffers).
    assert emb(torch.zeros(2, 5, dtype=torch.long, device="meta")).shape == (2, 5, 768)


def test_tt_embedding_flops_match_flop_counter():
    emb = TTEmbedding(30, (2, 2, 3, 3), (2, 1, 2, 3), (1, 3, 4, 3, 1))
    ids = torch.randperm(30)[:11]  # distinct ids: one GEMM each
    with FlopCounterMode(display=False) as counter:
        emb(ids)
    assert counter.get_total_flops() == emb.flops(11)


def test_tt_embedding_from_dense_full_rank_and_round_trip():
    dense = nn.Embedding(50, 12).double()
    emb = TTEmbedding.from_dense(dense, TTEmbeddingConfig(rank=1000, n_cores=2))
    ids = torch.arange(50)
    torch.testing.assert_close(emb(ids), dense(ids))
    emb.enable_gates()
    copy = TTEmbedding(50, emb.row_factors, emb.col_factors, emb.ranks).double()
    copy.enable_gates()
    copy.load_state_dict(emb.state_dict())
    torch.testing.assert_close(copy(ids), emb(ids))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"row_factors": (3, 3), "col_factors": (2, 3)}, r"row_factors=\[3, 3\] has product 9; it must be at least 10"),
        ({"row_factors": (4, 4), "col_factors": (2, 2)}, r"col_factors=\[2, 2\] has product 4; it must equal 6"),
        ({"rank": -1}, "rank=-1"),
        ({"rank": (1, 4, 4, 1), "row_factors": (3, 4), "col_factors": (2, 3)}, "has 4 entries"),
        ({"lookup": "dense"}, "lookup='dense'"),
    ],
)
def test_tt_embedding_config_bad_input_is_a_one_line_error(kwargs, match):
    with pytest.raises(ValueError, match=match) as info:
        TTEmbeddingConfig(**kwargs).resolve(10, 6)
    assert "\n" not in str(info.value)


def test_check_factors_rejects_non_integers():
    with pytest.raises(ValueError, match="integers >= 1"):
        check_factors("in_factors", (2, 0), at_least=0)
