"""QuantLinear's optional dequantized-weight cache: same outputs as dequantizing in every call, rebuilt when the codes
change."""

from __future__ import annotations

import torch
from torch import nn

from tensorslim.quant import QuantLinear, RTNConfig, quantize_, set_weight_cache
from tensorslim.quant.quantizer import dequantize


def _quantized_mlp() -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 16), nn.ReLU(), nn.Linear(16, 8))
    quantize_(model, RTNConfig(bits=4), None)
    assert set_weight_cache(model, True) == 2  # off by default: the packed kernels run instead
    return model


def test_cached_forward_equals_dequantize_every_call_and_is_reused():
    model = _quantized_mlp()
    x = torch.randn(5, 24)
    layer = model[0]
    reference = x @ dequantize(layer.codes(), layer.grid).t() + layer.bias  # independent: codes → float → matmul
    torch.testing.assert_close(layer(x), reference)
    first = layer.dequantized_weight()
    assert layer.dequantized_weight() is first  # built once, reused
    # the float copy, plus the copies of the codes (as packed), row scales and zero points that check it
    assert layer.cached_bytes() == 16 * 24 * 4 + layer.packed.numel() + 16 * 4 + 16
    cached_out = model(x)
    assert set_weight_cache(model, False) == 2
    assert layer.cached_bytes() == 0 and layer.dequantized_weight() is not first
    with torch.enable_grad():  # with input gradients the float weight is used, dequantized in every call
        torch.testing.assert_close(model(x.requires_grad_()), cached_out, rtol=0, atol=0)


def test_cache_follows_changed_codes_scales_and_device_moves():
    model = _quantized_mlp()
    layer: QuantLinear = model[2]
    x = torch.randn(3, 16)
    before = layer(x)
    with torch.no_grad():
        layer.scale.mul_(2.0)  # in place: the buffer's version changes
    expected = x @ dequantize(layer.codes(), layer.grid).t() + layer.bias
    torch.testing.assert_close(layer(x), expected)
    assert not torch.allclose(layer(x), before)
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    state["packed"] = torch.zeros_like(state["packed"])  # every code 0 → weight = -scale·zero
    layer.load_state_dict(state)
    torch.testing.assert_close(layer(x), x @ dequantize(layer.codes(), layer.grid).t() + layer.bias)
    layer.double()
    assert layer.cached_bytes() == 0
    assert layer(x.double()).dtype == torch.float64


def test_cached_weight_passes_input_gradients():
    layer = _quantized_mlp()[0]
    x = torch.randn(4, 24, requires_grad=True)
    layer(x).sum().backward()
    torch.testing.assert_close(x.grad, dequantize(layer.codes(), layer.grid).sum(0).expand(4, 24))
