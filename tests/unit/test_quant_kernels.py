"""QuantLinear on PyTorch's packed int4/int8 CPU kernels: same products as the dequantized weight, files in the
portable bit stream, one copy of the weight in memory, and derived tensors that follow the buffers they came from."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tensorslim.models.llama import LlamaConfig, LlamaForCausalLM
from tensorslim.quant import QuantLinear, RTNConfig, load_quantized, quantize_, save_quantized, set_weight_cache
from tensorslim.quant.quantizer import dequantize, pack_codes

# bf16 keeps 8 significant bits: rounding the activations, the kernel's scale table and its output each costs at most
# 2**-9 of the magnitude they carry, so |y − y_ref| ≤ 4·2**-9·(|x| |W|ᵀ) bounds the bf16 path with room to spare.
BF16_BOUND = 4 * 2**-9


def _layer(bits: int, d_in: int, d_out: int, *, seed: int = 0) -> QuantLinear:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(d_in, d_out))
    quantize_(model, RTNConfig(bits=bits), None)
    return model[0]


def _reference(layer: QuantLinear, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 product with the dequantized weight, and ``|x| |W|ᵀ`` (the scale of its rounding errors)."""
    weight = dequantize(layer.codes(), layer.grid, dtype=torch.float64)
    return x.double() @ weight.t() + layer.bias.double(), x.double().abs() @ weight.abs().t()


# 4 and 8 bits are held in the kernels' layouts; 3 and 6 bits keep the stream and derive the kernel operand;
# shapes off the kernels' 16x32 / 16 blocks exercise the padding
@pytest.mark.parametrize("bits", [3, 4, 6, 8])
@pytest.mark.parametrize("shape", [(64, 48), (40, 20)])
def test_packed_kernels_equal_the_dequantized_product(bits: int, shape: tuple[int, int]) -> None:
    layer = _layer(bits, *shape)
    x = torch.randn(7, 3, shape[0])
    reference, magnitude = _reference(layer, x)
    with torch.no_grad():
        layer.activations = "float32"  # exact up to fp32 accumulation
        torch.testing.assert_close(layer(x).double(), reference, rtol=1e-5, atol=1e-5)
        layer.activations = "bfloat16"
        y = layer(x)
    assert y.dtype == torch.float32
    assert ((y.double() - reference).abs() <= BF16_BOUND * magnitude + 1e-6).all()


def test_weight_is_held_once_in_the_kernel_layout_and_files_hold_the_stream(tmp_path) -> None:
    for bits, layout, bytes_per_weight in [(4, "int4pack", 0.5), (8, "int8", 1)]:
        layer = _layer(bits, 64, 48)
        codes = layer.codes()
        with torch.no_grad():
            layer(torch.randn(2, 64))
        assert layer.layout == layout
        # per-row scale tables and the copy of the row scales/zero points that checks them: no float copy, no
        # second copy of the codes
        assert layer.cached_bytes() <= 16 * 48
        assert layer.packed.numel() == 64 * 48 * bytes_per_weight
        assert torch.equal(layer.state_dict()["packed"], pack_codes(codes, bits))
        fresh = QuantLinear(64, 48, bits=bits)
        fresh.load_state_dict(layer.state_dict())
        assert torch.equal(fresh.codes(), codes) and torch.equal(fresh.packed, layer.packed)


def test_quantized_llama_logits_on_the_kernels_match_the_dequantized_model(tmp_path) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(d_model=64, n_layers=2, n_heads=4, d_ff=172, vocab_size=256, max_seq_len=64)
    ids = torch.randint(0, 256, (2, 16))
    for bits in (4, 8):
        model = LlamaForCausalLM(config).eval()
        quantize_(model, RTNConfig(bits=bits), None)
        with torch.no_grad():
            set_weight_cache(model, True)
            reference = model(ids)  # the dequantized float weights through F.linear
            set_weight_cache(model, False)
            fast = model(ids)
        # bf16 activations (or fp32 on a scalar build): a few 2**-9 roundings per layer on logits of std ~0.16
        torch.testing.assert_close(fast, reference, rtol=0, atol=0.02 * float(reference.std()))
        assert torch.equal(fast.argmax(-1), reference.argmax(-1))
        save_quantized(model, tmp_path / f"w{bits}.safetensors")
        loaded = load_quantized(LlamaForCausalLM(config).eval(), tmp_path / f"w{bits}.safetensors")
        with torch.no_grad():
            assert torch.equal(loaded(ids), fast)


def _change_by_data(layer: QuantLinear) -> None:
    layer.scale.data = layer.scale.data * 2  # a new tensor


def _change_by_copy(layer: QuantLinear) -> None:
    with torch.no_grad():
        layer.zero.copy_(torch.clamp(layer.zero.to(torch.int32) + 1, max=15))  # in place


def _change_by_load(layer: QuantLinear) -> None:
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    state["packed"] = torch.full_like(state["packed"], 0x35)  # every code now 5 (low nibble) or 3 (high nibble)
    layer.load_state_dict(state)


def _change_by_optimizer(layer: QuantLinear) -> None:
    layer.scale.requires_grad_(True)  # fine-tuning the scales, as learned-step-size methods do
    optimizer = torch.optim.SGD([layer.scale], lr=0.5)
    layer.to_dense().square().sum().backward()
    optimizer.step()
    layer.scale.requires_grad_(False)


def _scale_through_data_in_place(layer: QuantLinear) -> None:
    layer.scale.data.mul_(2)  # same storage, and .data bumps no version counter


def _zero_through_data_in_place(layer: QuantLinear) -> None:
    layer.zero.data.copy_(torch.clamp(layer.zero.data.to(torch.int32) + 1, max=2**layer.bits - 1))


def _codes_through_data_in_place(layer: QuantLinear) -> None:
    layer.packed.data.bitwise_xor_(0x21)  # flips low bits of the codes in every layout


@pytest.mark.parametrize("bits", [3, 4, 8])  # a derived kernel weight (stream) and the kernels' own layouts
@pytest.mark.parametrize(
    "change", [_scale_through_data_in_place, _zero_through_data_in_place, _codes_through_data_in_place]
)
@pytest.mark.parametrize("cache", [True, False])
def test_writes_through_data_in_place_reach_the_next_forward(bits: int, change, cache: bool) -> None:
    layer = _layer(bits, 64, 48)
    layer.cache_weight, layer.activations = cache, "float32"
    x = torch.randn(3, 64)
    with torch.no_grad():
        before = layer(x)  # builds the float copy or the kernel operands
        change(layer)
        after = layer(x)
    reference, _ = _reference(layer, x)
    assert not torch.allclose(after, before)
    torch.testing.assert_close(after.double(), reference, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("change", [_change_by_data, _change_by_copy, _change_by_load, _change_by_optimizer])
@pytest.mark.parametrize("cache", [True, False])
def test_derived_tensors_follow_every_change_of_the_buffers(change, cache: bool) -> None:
    layer = _layer(4, 64, 48)
    layer.cache_weight, layer.activations = cache, "float32"
    x = torch.randn(3, 64)
    with torch.no_grad():
        before = layer(x)  # builds the float copy or the kernel operands
    change(layer)
    with torch.no_grad():
        after = layer(x)
    reference, _ = _reference(layer, x)
    assert not torch.allclose(after, before)
    torch.testing.assert_close(after.double(), reference, rtol=1e-4, atol=1e-4)


def _scale_strided(layer: QuantLinear) -> None:
    layer.scale.data = torch.cat([layer.scale.data, layer.scale.data], dim=1)[:, :1]  # same values, column stride 2
    assert not layer.scale.is_contiguous()


def _scale_as_parameter(layer: QuantLinear) -> None:
    layer.scale = nn.Parameter(layer.scale.detach().clone(), requires_grad=False)  # as scale-learning methods hold it


@pytest.mark.parametrize("hold", [_scale_strided, _scale_as_parameter])
@pytest.mark.parametrize("cache", [True, False])
def test_in_place_writes_reach_the_forward_whatever_holds_the_scales(hold, cache: bool) -> None:
    layer = _layer(4, 64, 48)
    layer.cache_weight, layer.activations = cache, "float32"
    x = torch.randn(3, 64)
    hold(layer)
    with torch.no_grad():
        before = layer(x)  # builds the float copy or the kernel operands from the scales as now held
        torch.testing.assert_close(before.double(), _reference(layer, x)[0], rtol=1e-4, atol=1e-4)
        layer.scale.data.mul_(2)
        after = layer(x)
    assert not torch.allclose(after, before)
    torch.testing.assert_close(after.double(), _reference(layer, x)[0], rtol=1e-4, atol=1e-4)
