"""quantize_ on converted models: CoLA/SVD factors A and B, TT cores; books and storage round trip."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.convert import convert_
from tensorslim.layers.lowrank import CoLAConfig, LowRankLinear, SVDConfig
from tensorslim.layers.tt import TTConfig, TTLinear
from tensorslim.quant import COMQConfig, GPTQConfig, RTNConfig, gptq_quantize, load_quantized, quantize_, save_quantized
from tensorslim.quant.qlinear import QuantLinear, QuantLowRankLinear, QuantTTLinear, set_kernel_activations

CONFIGS = [RTNConfig(bits=4), GPTQConfig(bits=3), COMQConfig(bits=4, sweeps=2)]


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(12, 16)
        self.down = nn.Linear(16, 12, bias=False)
        self.lm_head = nn.Linear(12, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.down(F.gelu(self.up(x))))


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _batches(n: int = 3) -> list[torch.Tensor]:
    return [torch.randn(4, 6, 12, generator=_gen(10 + i)) for i in range(n)]


def _converted(config: object, seed: int = 0) -> _Mlp:
    torch.manual_seed(seed)
    model = _Mlp()
    convert_(model, config)
    return model


def _rtn_by_hand(w: torch.Tensor, bits: int) -> torch.Tensor:
    """Min/max asymmetric grid per row with 0 on the grid (GPTQ's ``Quantizer``), rounded to nearest."""
    w = w.double()
    lo, hi = w.min(dim=1, keepdim=True).values.clamp(max=0), w.max(dim=1, keepdim=True).values.clamp(min=0)
    scale = (hi - lo) / (2**bits - 1)
    zero = torch.round(-lo / scale)
    return scale * (torch.clamp(torch.round(w / scale) + zero, 0, 2**bits - 1) - zero)


def _tt_dense(cores: list[torch.Tensor]) -> torch.Tensor:
    """``W (d_in, d_out)`` of a 4-core TT layer (2 input modes, 2 output modes) by one explicit einsum."""
    w = torch.einsum("xia,ajb,bkc,clz->ijkl", *cores)
    return w.reshape(cores[0].shape[1] * cores[1].shape[1], -1)


def _state_nbytes(module: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("lowrank", [CoLAConfig(rank=4), SVDConfig(rank=5)])
def test_every_low_rank_factor_is_quantized_and_the_forward_uses_them(config: object, lowrank: object) -> None:
    model = _converted(lowrank)
    float_factors = {n: (m.weight_a.detach().clone(), m.weight_b.detach().clone()) for n, m in _low_rank(model)}
    report = quantize_(model, config, _batches())
    set_kernel_activations(model, "float32")  # the packed kernels' products, exact up to fp32 rounding
    assert [r.name for r in report.layers] == ["up.A", "up.B", "down.A", "down.B"]
    assert {r.method for r in report.layers} == {type(config).__name__}
    assert isinstance(model.up, QuantLowRankLinear) and isinstance(model.down, QuantLowRankLinear)
    assert isinstance(model.lm_head, nn.Linear)  # the output head stays float by default
    x = torch.randn(3, 5, 12, generator=_gen(99))
    # independent forward: B σ(A x) + b with the dequantized factors, σ by name
    sigma = F.silu if lowrank.activation == "silu" else (lambda t: t)
    hidden = F.linear(sigma(F.linear(x, model.up.a.to_dense())), model.up.b.to_dense(), model.up.b.bias)
    hidden = F.gelu(hidden)
    out = F.linear(sigma(F.linear(hidden, model.down.a.to_dense())), model.down.b.to_dense())
    with torch.no_grad():
        torch.testing.assert_close(model(x), model.lm_head(out))
    if isinstance(config, RTNConfig):
        for name, (a, b) in float_factors.items():
            layer = getattr(model, name)
            torch.testing.assert_close(layer.a.to_dense().double(), _rtn_by_hand(a, config.bits))
            torch.testing.assert_close(layer.b.to_dense().double(), _rtn_by_hand(b, config.bits))


def _low_rank(model: nn.Module) -> list[tuple[str, LowRankLinear]]:
    return [(n, m) for n, m in model.named_modules() if type(m) is LowRankLinear]


def test_cola_b_is_solved_on_the_latent_sigma_of_a_x() -> None:
    model = _converted(CoLAConfig(rank=4))
    batches = _batches()
    a, b = model.up.weight_a.detach(), model.up.weight_b.detach()
    # independent capture of B's input: silu(x Aᵀ) of every calibration row, in float64
    latent = torch.cat([F.silu(x.reshape(-1, 12).double() @ a.double().T) for x in batches])  # (n, r)
    expected = gptq_quantize(b, latent.T @ latent, GPTQConfig(bits=3)).dequantize(dtype=torch.float64)
    report = quantize_(model, GPTQConfig(bits=3), batches)
    torch.testing.assert_close(model.up.b.to_dense().double(), expected, rtol=0, atol=1e-6)
    row = next(r for r in report.layers if r.name == "up.B")
    error = torch.linalg.norm(latent @ (b.double() - expected).T) / torch.linalg.norm(latent @ b.double().T)
    assert row.rows == latent.shape[0] and row.shape == (4, 16)
    assert row.rel_output_error == pytest.approx(float(error), rel=1e-5)


@pytest.mark.parametrize("config", CONFIGS)
def test_tt_cores_are_rounded_to_nearest_and_the_forward_uses_them(config: object) -> None:
    model = _converted(TTConfig(rank=3, n_cores=4), seed=1)
    float_cores = [c.detach().clone() for c in model.up.effective_cores()]
    report = quantize_(model, config, _batches())
    assert [r.name for r in report.layers] == [f"{n}.cores.{k}" for n in ("up", "down") for k in range(4)]
    assert {r.method for r in report.layers} == {"RTNConfig"}  # a TT core has no input of its own
    assert all(r.rel_output_error is None for r in report.layers)
    assert isinstance(model.up, QuantTTLinear) and isinstance(model.down, QuantTTLinear)
    for core, stored in zip(float_cores, model.up.dequantized_cores(), strict=True):
        expected = _rtn_by_hand(core.reshape(core.shape[0], -1), config.bits).view_as(core)
        torch.testing.assert_close(stored.double(), expected)
    x = torch.randn(3, 5, 12, generator=_gen(7))
    hidden = F.gelu(x @ _tt_dense(model.up.dequantized_cores()) + model.up.bias)
    out = hidden @ _tt_dense(model.down.dequantized_cores())
    with torch.no_grad():
        torch.testing.assert_close(model(x), model.lm_head(out))


def test_tt_gates_are_folded_into_the_quantized_cores() -> None:
    model = _converted(TTConfig(rank=3, n_cores=4, rank_gates=True), seed=2)
    with torch.no_grad():
        model.up.gates[0].copy_(torch.tensor([1.0, 0.5, 0.0]))
    folded = [c.detach().clone() for c in model.up.effective_cores()]
    quantize_(model, RTNConfig(bits=8), None)
    for core, stored in zip(folded, model.up.dequantized_cores(), strict=True):
        torch.testing.assert_close(stored.double(), _rtn_by_hand(core.reshape(core.shape[0], -1), 8).view_as(core))


@pytest.mark.parametrize("convert", [CoLAConfig(rank=4), TTConfig(rank=3, n_cores=4)])
def test_report_bytes_are_the_packed_tensors(convert: object) -> None:
    model = _converted(convert)
    report = quantize_(model, RTNConfig(bits=3), None)
    for name in ("up", "down"):
        layer = getattr(model, name)
        rows = [r for r in report.layers if r.name.startswith(f"{name}.")]
        assert sum(r.bytes_after for r in rows) == layer.storage_bytes() == _state_nbytes(layer)
        matrices = [m for m in layer.modules() if isinstance(m, QuantLinear)]
        for row, packed in zip(rows, matrices, strict=True):
            d_in, d_out = row.shape
            assert row.bits == 3 and packed.packed.numel() == (d_in * d_out * 3 + 7) // 8
            assert row.bytes_before >= 4 * d_in * d_out
    assert "2 layers quantized with RTNConfig (" in report.table()
    assert {r.layer for r in report.layers} == {"up", "down"}


@pytest.mark.parametrize("convert", [CoLAConfig(rank=4), SVDConfig(rank=3), TTConfig(rank=3, n_cores=4)])
def test_save_load_round_trip_gives_identical_outputs(convert: object, tmp_path) -> None:  # noqa: ANN001
    model = _converted(convert)
    quantize_(model, GPTQConfig(bits=4), _batches())
    path = tmp_path / "q.safetensors"
    save_quantized(model, path)
    loaded = load_quantized(_converted(convert, seed=5), path)
    assert type(loaded.up) is type(model.up) and isinstance(loaded.lm_head, nn.Linear)
    x = torch.randn(2, 3, 12, generator=_gen(3))
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_dense_and_factored_layers_in_one_model() -> None:
    model = _converted(TTConfig(rank=3, n_cores=4))
    model.extra = nn.Linear(12, 12)
    report = quantize_(model, COMQConfig(bits=4), _batches(), filter_fn=lambda m, n: n in ("up", "lm_head"))
    assert [(r.name, r.method) for r in report.layers] == [(f"up.cores.{k}", "RTNConfig") for k in range(4)] + [
        ("lm_head", "COMQConfig")
    ]
    assert isinstance(model.down, TTLinear) and isinstance(model.lm_head, QuantLinear)


def test_nothing_to_quantize_is_a_one_line_value_error() -> None:
    model = nn.Sequential(nn.Embedding(10, 4), nn.LayerNorm(4))
    with pytest.raises(ValueError, match="^no layer to quantize: [^\n]*$"):
        quantize_(model, RTNConfig(), None)
    converted = _converted(CoLAConfig(rank=4))
    with pytest.raises(ValueError, match="^no layer to quantize"):
        quantize_(converted, RTNConfig(), None, filter_fn=lambda m, n: False)


def test_a_subclass_of_a_factored_layer_is_not_quantized_by_its_factors_alone() -> None:
    class _Crossed(LowRankLinear):  # an extra term the factors A and B alone do not describe, as LaX's crossing
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) + x

    model = nn.Sequential(_Crossed(8, 8, 2), nn.Linear(8, 8))
    report = quantize_(model, RTNConfig(), None)
    assert [r.name for r in report.layers] == ["1"] and type(model[0]) is _Crossed
    with pytest.raises(TypeError, match="^layer '0' of type _Crossed cannot be quantized; supported: [^\n]*$"):
        quantize_(model, RTNConfig(), None, filter_fn=lambda m, n: n == "0")
