"""Kronecker-factored linear layer: Van Loan & Pitsianis's nearest Kronecker product, forward, books, convert_.

The shared layer contract (books, FlopCounterMode, gradcheck, state dict, meta, compile, bf16) is in
``tests/contracts.py``; here are the Kronecker-specific checks against torch.kron and the SVD identity.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from tensorslim.convert import convert_, plan
from tensorslim.decomp.kron import kron_rearrange, nearest_kronecker
from tensorslim.functional.kron import kron_linear_flops
from tensorslim.layers.kron import KronConfig, KronLinear
from tensorslim.models.llama import LlamaConfig, LlamaForCausalLM

# (in_factors, out_factors, rank): square and rectangular factors, both contraction orders, sums of terms.
SHAPES = [((2, 4), (3, 4), 1), ((3, 5), (2, 7), 2), ((6, 2), (1, 9), 3), ((4, 4), (4, 4), 16)]


def _kron_sum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return sum(torch.kron(a_k, b_k) for a_k, b_k in zip(a, b, strict=True))


@pytest.mark.parametrize(("in_factors", "out_factors", "rank"), SHAPES)
@pytest.mark.parametrize("order", ["a_first", "b_first"])
def test_forward_equals_torch_kron(in_factors, out_factors, rank, order) -> None:
    torch.manual_seed(0)
    layer = KronLinear(in_factors, out_factors, rank, bias=True, dtype=torch.float64)
    layer.order = order
    x = torch.randn(2, 5, layer.in_features, dtype=torch.float64)
    expected = x @ _kron_sum(layer.factor_a, layer.factor_b).T + layer.bias
    torch.testing.assert_close(layer(x), expected, rtol=1e-12, atol=1e-12)
    with FlopCounterMode(display=False) as counter:
        layer(x)
    assert counter.get_total_flops() == kron_linear_flops(
        in_factors=in_factors, out_factors=out_factors, rank=rank, tokens=10, order=order
    )


def test_the_cheaper_order_is_chosen() -> None:
    # A = 8x2, B = 2x32: A first costs 2·8·32·(2+2) = 2048 per token, B first 2·2·2·(32+8) = 320.
    layer = KronLinear((2, 32), (8, 2), 1)
    assert layer.order == "b_first" and layer.flops(1) == 320
    assert KronLinear((32, 2), (2, 8), 1).order == "a_first"


def test_nearest_kronecker_recovers_an_exact_kronecker_product() -> None:
    torch.manual_seed(0)
    a, b = torch.randn(3, 2, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    weight = torch.kron(a, b)  # (12, 10)
    factor_a, factor_b = nearest_kronecker(weight, out_factors=(3, 4), in_factors=(2, 5))
    assert factor_a.shape == (1, 3, 2) and factor_b.shape == (1, 4, 5)
    torch.testing.assert_close(torch.kron(factor_a[0], factor_b[0]), weight, rtol=1e-12, atol=1e-12)
    # The factors are unique up to a scale c·A ⊗ B/c: A is parallel to a.
    ratio = factor_a[0] / a
    torch.testing.assert_close(ratio, ratio.flatten()[0].expand_as(ratio))
    dense = nn.Linear(10, 12, bias=False, dtype=torch.float64)
    with torch.no_grad():
        dense.weight.copy_(weight)
    layer = KronLinear.from_dense(dense, KronConfig(in_factors=(2, 5), out_factors=(3, 4)))
    torch.testing.assert_close(layer.to_dense().weight, weight, rtol=1e-12, atol=1e-12)


def test_rearrangement_maps_a_kron_b_to_an_outer_product() -> None:
    a, b = torch.randn(3, 2, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    rearranged = kron_rearrange(torch.kron(a, b), out_factors=(3, 4), in_factors=(2, 5))
    torch.testing.assert_close(rearranged, torch.outer(a.flatten(), b.flatten()))


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_error_is_the_svd_optimum(rank: int) -> None:
    """‖W − Σ A_k ⊗ B_k‖_F equals the norm of the discarded singular values of R(W), and no other factors tried do
    better (a brute-force check: random candidates and local perturbations of the optimum)."""
    torch.manual_seed(rank)
    weight = torch.randn(6, 8, dtype=torch.float64)  # out (2, 3), in (2, 4)
    factor_a, factor_b = nearest_kronecker(weight, out_factors=(2, 3), in_factors=(2, 4), rank=rank)
    error = torch.linalg.norm(weight - _kron_sum(factor_a, factor_b))
    # The rearrangement, written out independently with explicit block indices.
    blocks = torch.stack(
        [weight[i * 3 : (i + 1) * 3, j * 4 : (j + 1) * 4].flatten() for i in range(2) for j in range(2)]
    )
    singular = torch.linalg.svdvals(blocks)
    torch.testing.assert_close(error, singular[rank:].norm())
    for _ in range(200):
        other_a = factor_a + 0.05 * torch.randn_like(factor_a)
        other_b = factor_b + 0.05 * torch.randn_like(factor_b)
        assert torch.linalg.norm(weight - _kron_sum(other_a, other_b)) >= error
        random_a, random_b = torch.randn_like(factor_a), torch.randn_like(factor_b)
        assert torch.linalg.norm(weight - _kron_sum(random_a, random_b)) >= error


def test_full_rank_is_exact_for_any_weight() -> None:
    torch.manual_seed(0)
    dense = nn.Linear(8, 6).double()
    layer = KronLinear.from_dense(dense, KronConfig(rank=4))  # A 2×2, B 3×4: R(W) is 4×12, so rank 4 is full
    x = torch.randn(3, 8, dtype=torch.float64)
    torch.testing.assert_close(layer(x), dense(x), rtol=1e-10, atol=1e-10)


def test_forward_never_forms_the_kronecker_product() -> None:
    class Shapes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.numels: set[int] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, tuple | list) else (out,):
                if isinstance(t, torch.Tensor):
                    self.numels.add(t.numel())
            return out

    layer = KronLinear((3, 5), (2, 7), 1, bias=True)  # W: 14 × 15 = 210
    x = torch.randn(4, 15, requires_grad=True)  # no token tensor has 210 entries
    with Shapes() as seen:
        layer(x).sum().backward()
    assert 210 not in seen.numels
    with Shapes() as check:  # the detector does see a formed weight
        layer.weight_matrix()
    assert 210 in check.numels


def test_books_and_automatic_factors() -> None:
    config = KronConfig()
    assert config.resolve(768, 3072) == ((24, 32), (48, 64), 1)
    layer = KronLinear.from_dense(nn.Linear(768, 3072, device="meta"), KronConfig(init="random"))
    assert layer.num_params() == 24 * 48 + 32 * 64 + 3072 == sum(p.numel() for p in layer.parameters())
    assert layer.factor_a.shape == (1, 48, 24) and layer.factor_b.shape == (1, 64, 32)


def test_convert_llama_and_plan_books() -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(d_model=64, n_layers=2, n_heads=4, d_ff=96, vocab_size=128, max_seq_len=32))
    planned = plan(model, KronConfig(rank=2))
    report = convert_(model, KronConfig(rank=2))
    assert planned.layers == report.layers and len(report.layers) == 14
    assert isinstance(model.layers[1].mlp.up_proj, KronLinear) and isinstance(model.lm_head, nn.Linear)
    assert model.layers[0].mlp.up_proj.in_factors == (8, 8) and model.layers[0].mlp.up_proj.out_factors == (8, 12)
    for row in report.layers:
        assert model.get_submodule(row.name).num_params() == row.params_after
    assert report.model_params_after == sum(p.numel() for p in model.parameters())
    assert torch.isfinite(model(torch.randint(0, 128, (2, 9)))).all()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rank": 0}, "rank=0 is invalid"),
        ({"rank": 1.5}, "rank=1.5 is invalid"),
        ({"in_factors": (2, 3, 4)}, r"in_factors=\(2, 3, 4\) is invalid"),
        ({"out_factors": (0, 4)}, r"out_factors=\(0, 4\) is invalid"),
        ({"init": "svd"}, "init='svd' is invalid"),
    ],
)
def test_config_rejects_bad_values_in_one_line(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        KronConfig(**kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("config", "shape", "match"),
    [
        (KronConfig(in_factors=(2, 5)), (8, 6), r"in_factors=\[2, 5\] has product 10; it must equal 8"),
        (KronConfig(), (7, 6), r"d_in=7 has no split into two factors > 1; allowed: explicit factors such as \(1, 7\)"),
        (KronConfig(rank=5), (8, 6), r"rank=5 is out of range for factors 2x2 and 3x4; allowed 1..4"),
    ],
)
def test_resolve_rejects_bad_shapes_in_one_line(config: KronConfig, shape: tuple[int, int], match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        config.resolve(*shape)
    assert "\n" not in str(info.value)
    model = nn.Sequential(nn.Linear(*shape))
    with pytest.raises(ValueError, match=r"layer '0': "):
        convert_(model, config)
    assert isinstance(model[0], nn.Linear)  # a bad config leaves the model untouched


def test_explicit_prime_factors_and_meta_needs_random_init() -> None:
    layer = KronLinear.from_dense(nn.Linear(7, 6), KronConfig(in_factors=(1, 7)))
    assert layer.factor_a.shape == (1, 2, 1)
    with pytest.raises(ValueError, match="init='random'"):
        KronLinear.from_dense(nn.Linear(8, 6, device="meta"))
