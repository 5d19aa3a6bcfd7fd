"""The dense-layer helpers every factored family builds on: reading a dense layer's shape, writing one back."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tensorslim.layers._source import (
    dense_linear,
    factored_like,
    replacement_report,
    require_weights,
    resolve_for,
    uniform_bias_,
)
from tensorslim.layers.kron import KronConfig, KronLinear


def test_dense_linear_holds_copies_of_the_weight_and_bias() -> None:
    weight, bias = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    dense = dense_linear(weight, bias)
    x = torch.randn(2, 3, dtype=torch.float64)
    torch.testing.assert_close(dense(x), x @ weight.T + bias)
    weight.zero_()
    assert dense.weight.abs().sum() > 0 and dense_linear(weight, None).bias is None


def test_factored_like_shapes_a_layer_as_the_config_resolves_the_dense_one() -> None:
    linear = nn.Linear(8, 6, bias=False, dtype=torch.float64)
    layer, shape, weight = factored_like(KronLinear, linear, KronConfig(rank=2))
    assert shape == KronConfig(rank=2).resolve(8, 6) and weight is linear.weight
    assert layer.bias is None and layer.factor_a.dtype == torch.float64
    with pytest.raises(ValueError, match="^init='nkp' needs real weights, got a meta-device module"):
        require_weights(torch.empty(2, 2, device="meta"), "nkp")


def test_a_replacement_row_counts_the_dense_layer_and_names_it_in_errors() -> None:
    linear = nn.Linear(8, 6)
    row = replacement_report("fc", linear, new_shape="x", rank=2, params_after=10)
    assert (row.old_shape, row.params_before, row.kind) == ((8, 6), 8 * 6 + 6, "Linear")
    assert resolve_for("fc", linear, lambda d_in, d_out: (d_in, d_out)) == (8, 6)
    with pytest.raises(ValueError, match="^layer 'fc': rank=9 is out of range"):
        resolve_for("fc", linear, KronConfig(rank=9, in_factors=(2, 4), out_factors=(2, 3)).resolve)


def test_uniform_bias_draws_within_one_over_the_root_of_the_fan() -> None:
    bias = torch.zeros(4000)
    uniform_bias_(bias, 16)
    assert bias.abs().max() <= 0.25 and bias.abs().max() > 0.24 and abs(float(bias.mean())) < 0.02
    uniform_bias_(None, 16)  # a layer without a bias: nothing to do
