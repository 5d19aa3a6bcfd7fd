"""Module swaps compose: low rank then 4-bit, and LoRA on a CoLA model, each against a hand-computed reference and
through a save_pretrained/load_pretrained round trip (one manifest for every family)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tensorslim.convert import convert_, plan
from tensorslim.layers.lora import LoRAConfig, LoRALinear, apply_lora_
from tensorslim.layers.lowrank import CoLAConfig, LowRankLinear, SVDConfig
from tensorslim.pretrained import load_pretrained, save_pretrained
from tensorslim.quant import GPTQConfig, RTNConfig, quantize_
from tensorslim.quant.qlinear import QuantLowRankLinear
from tests.contracts import ROWS, dense_model, sample_inputs


def _rtn_by_hand(weight: torch.Tensor, bits: int) -> torch.Tensor:
    """Per-row min/max grid through zero, nearest code, dequantized (GPTQ's ``Quantizer``, symmetric=False)."""
    maxq = 2**bits - 1
    lo, hi = weight.amin(dim=1, keepdim=True).clamp(max=0), weight.amax(dim=1, keepdim=True).clamp(min=0)
    scale = (hi - lo) / maxq
    zero = torch.round(-lo / scale)
    return scale * (torch.clamp(torch.round(weight / scale) + zero, 0, maxq) - zero)


def test_low_rank_then_4_bit_equals_the_rounded_factors_and_survives_save_and_load(tmp_path: Path) -> None:
    model = dense_model(ROWS[0])  # float64: the float path, not the CPU int4/int8 inference kernels
    x = sample_inputs(ROWS[0])
    convert_(model, SVDConfig(rank=4))
    factors = {
        name: (m.weight_a.detach().clone(), m.weight_b.detach().clone(), m.bias)
        for name, m in model.named_modules()
        if isinstance(m, LowRankLinear)
    }
    quantize_(model, RTNConfig(bits=4), None)
    assert all(isinstance(model.get_submodule(name), QuantLowRankLinear) for name in factors)

    reference = dense_model(ROWS[0])
    for block, prefix in zip(reference.blocks, ("blocks.0", "blocks.1"), strict=True):
        for proj in ("up", "down"):
            a, b, bias = factors[f"{prefix}.{proj}"]
            layer = getattr(block, proj)
            with torch.no_grad():
                layer.weight.copy_(_rtn_by_hand(b.double(), 4) @ _rtn_by_hand(a.double(), 4))
                if bias is not None:
                    layer.bias.copy_(bias)
    torch.testing.assert_close(model(x), reference(x), rtol=1e-12, atol=1e-12)

    save_pretrained(model, tmp_path / "svd-4bit")
    loaded = load_pretrained(tmp_path / "svd-4bit", model=dense_model(ROWS[0]))
    assert type(loaded.blocks[0].up) is QuantLowRankLinear
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


def test_lora_on_a_cola_model_adds_the_update_to_the_cola_output_and_survives_save_and_load(tmp_path: Path) -> None:
    model = dense_model(ROWS[0])
    x = sample_inputs(ROWS[0])
    convert_(model, CoLAConfig(rank=4))
    cola = copy.deepcopy(model)
    report = apply_lora_(model, LoRAConfig(rank=2, alpha=3.0, targets=("up", "down")))
    assert report["layers"] == ["blocks.0.up", "blocks.0.down", "blocks.1.up", "blocks.1.down"]
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"{name}.{p}" for name in report["layers"] for p in ("lora_a", "lora_b")}
    torch.testing.assert_close(model(x), cola(x), rtol=0, atol=0)  # B = 0 at init (LoRA §4.1)

    torch.manual_seed(1)
    for module in model.modules():
        if isinstance(module, LoRALinear):
            torch.nn.init.normal_(module.lora_b)

    def by_hand(h: torch.Tensor) -> torch.Tensor:
        for index, block in enumerate(cola.blocks):

            def adapted(
                proj: str, inp: torch.Tensor, index: int = index, block: torch.nn.Module = block
            ) -> torch.Tensor:
                lora = model.get_submodule(f"blocks.{index}.{proj}")
                update = F.linear(F.linear(inp, lora.lora_a), lora.lora_b)
                return getattr(block, proj)(inp) + 1.5 * update  # alpha / rank = 3 / 2

            h = h + adapted("down", F.silu(adapted("up", h)))
        return h

    torch.testing.assert_close(model(x), by_hand(x), rtol=1e-12, atol=1e-12)

    save_pretrained(model, tmp_path / "cola-lora")
    loaded = load_pretrained(tmp_path / "cola-lora", model=dense_model(ROWS[0]))
    assert type(loaded.blocks[1].down) is LoRALinear and type(loaded.blocks[1].down.base) is LowRankLinear
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    # the same weights; a loaded factor may be stored in another memory layout, which reorders the sums
    torch.testing.assert_close(loaded(x), model(x), rtol=1e-12, atol=1e-12)


def test_a_quantized_layer_recorded_in_the_first_manifest_layout_still_loads(tmp_path: Path) -> None:
    """Folders whose quantized dense layers were recorded as ``in_features``/``out_features`` load unchanged."""
    model = dense_model(ROWS[0]).float()
    quantize_(model, RTNConfig(bits=4), None)
    folder = save_pretrained(model, tmp_path / "rtn")
    manifest = json.loads((folder / "tensorslim.json").read_text())
    for entry in manifest["layers"]:
        state = entry["state"]
        entry["state"] = {"in_features": state.pop("in"), "out_features": state.pop("out"), **state}
        del entry["state"]["kind"]
    (folder / "tensorslim.json").write_text(json.dumps(manifest))
    loaded = load_pretrained(folder, model=dense_model(ROWS[0]).float())
    x = sample_inputs(ROWS[0]).float()
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


def test_convert_with_rtn_is_quantize_without_calibration_and_composes_after_low_rank() -> None:
    """Quantization as a registry family: ``plan`` books what ``convert_`` builds, the layers equal ``quantize_``'s
    bit for bit, and low rank then 4-bit is two ``convert_`` calls."""
    x = sample_inputs(ROWS[0])
    by_verb, by_registry = dense_model(ROWS[0]), dense_model(ROWS[0])
    for model in (by_verb, by_registry):
        convert_(model, SVDConfig(rank=4))
    quantize_(by_verb, RTNConfig(bits=4), None)
    planned = plan(by_registry, RTNConfig(bits=4))
    report = convert_(by_registry, RTNConfig(bits=4))
    assert (
        [layer.name for layer in planned.layers]
        == [layer.name for layer in report.layers]
        == list(name for name, m in by_verb.named_modules() if isinstance(m, QuantLowRankLinear))
    )
    for layer in report.layers:
        built = by_registry.get_submodule(layer.name)
        assert layer.params_after == sum(p.numel() for p in built.parameters())
    assert by_registry.state_dict().keys() == by_verb.state_dict().keys()
    for key, value in by_verb.state_dict().items():
        assert torch.equal(by_registry.state_dict()[key], value), key
    torch.testing.assert_close(by_registry(x), by_verb(x), rtol=0, atol=0)


def test_convert_refuses_a_quantizer_that_needs_calibration_before_touching_the_model() -> None:
    model = dense_model(ROWS[0])
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match="GPTQConfig needs calibration data"):
        convert_(model, GPTQConfig(bits=4))
    assert all(type(m) is not QuantLowRankLinear for m in model.modules())
    for key, value in before.items():
        assert torch.equal(model.state_dict()[key], value)
