"""LoRA, attention memory and QAT as families of the registry: ``plan`` previews them, ``convert_`` applies them,
``save_pretrained``/``load_pretrained`` record and rebuild them, and they compose with the layer families."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from tensorslim.convert import convert_, plan
from tensorslim.layers.lora import LoRAConfig, LoRALinear, apply_lora_
from tensorslim.layers.lowrank import CoLAConfig, LowRankLinear, SVDConfig
from tensorslim.layers.memory import MemoryConfig, equip_memory_, memory_stores, reset_memory_
from tensorslim.layers.memory.equip import LlamaMemoryAttention
from tensorslim.layers.tt import TTConfig, TTLinear
from tensorslim.pretrained import load_pretrained, parameters_on_meta, save_pretrained
from tensorslim.quant import QATConfig, RTNConfig, prepare_qat_
from tensorslim.quant.qat import ActivationQuantTT
from tensorslim.quant.qlinear import QuantLowRankLinear
from tests.contracts import ROWS, _tiny_llama, assert_unchanged, dense_model, sample_inputs, snapshot


def _trainable(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _ids() -> torch.Tensor:
    return torch.randint(0, 31, (2, 14), generator=torch.Generator().manual_seed(0))


def _stream(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Logits of ``ids`` fed in two calls through the memory, from an empty memory."""
    reset_memory_(model)
    with torch.no_grad():
        return torch.cat([model(ids[:, :9]), model(ids[:, 9:])], dim=1)


def test_memory_equipped_through_the_python_api_survives_save_and_load(tmp_path: Path) -> None:
    """The memory is recorded in the folder and rebuilt: the loaded model evicts as the saved one did."""
    model = _tiny_llama().eval()
    reference = copy.deepcopy(model)  # full attention: what a folder without its memory would load as
    config = MemoryConfig(capacity=8, chunk=4, policy="lfa")
    report = equip_memory_(model, config)
    assert report.layers == ("layers.0.self_attn", "layers.1.self_attn") and report.kind == "causal"
    ids = _ids()
    out = _stream(model, ids)
    reset_memory_(reference)
    assert not torch.allclose(out, torch.cat([reference(ids[:, :9]), reference(ids[:, 9:])], dim=1), atol=1e-4)

    save_pretrained(model, tmp_path / "memory")
    with parameters_on_meta():
        base = _tiny_llama()
    loaded = load_pretrained(tmp_path / "memory", model=base)
    assert [type(m) for m in loaded.modules()] == [type(m) for m in model.modules()]
    assert all(store.config == config for store in memory_stores(loaded)) and len(memory_stores(loaded)) == 2
    torch.testing.assert_close(_stream(loaded, ids), out, rtol=0, atol=0)


def test_memory_keeps_converted_projections_and_both_are_rebuilt(tmp_path: Path) -> None:
    """Memory on a CoLA model: the projections it keeps are recorded before it, and rebuilt first."""
    model = _tiny_llama().eval()
    convert_(model, CoLAConfig(rank=4), filter_fn=lambda module, name: name.endswith(("q_proj", "v_proj")))
    equip_memory_(model, MemoryConfig(capacity=8, chunk=4))
    assert isinstance(model.layers[0].self_attn, LlamaMemoryAttention)
    assert isinstance(model.layers[0].self_attn.q_proj, LowRankLinear)
    save_pretrained(model, tmp_path / "cola-memory")
    with parameters_on_meta():
        base = _tiny_llama()
    loaded = load_pretrained(tmp_path / "cola-memory", model=base)
    assert isinstance(loaded.layers[1].self_attn.v_proj, LowRankLinear)
    torch.testing.assert_close(_stream(loaded, _ids()), _stream(model, _ids()), rtol=0, atol=0)


def test_plan_previews_memory_lora_and_qat_without_touching_the_model() -> None:
    """The plan's rows and books are the built model's; planning changes nothing."""
    cases = [
        (_tiny_llama(), MemoryConfig(capacity=8, chunk=4)),
        (dense_model(ROWS[0]), LoRAConfig(rank=2, targets=("up", "down"), lax_gate="dense")),
        (dense_model(ROWS[0]), LoRAConfig(rank=3, targets=("up",))),
    ]
    tt_model = dense_model(ROWS[0])
    convert_(tt_model, TTConfig(rank=3, n_cores=4))
    cases += [(copy.deepcopy(tt_model), QATConfig()), (copy.deepcopy(tt_model), QATConfig(mode="weight+activation"))]
    for model, config in cases:
        before = snapshot(model)
        planned = plan(model, config)
        assert_unchanged(before, snapshot(model))
        applied = convert_(model, config)
        assert [row.name for row in planned.layers] == [row.name for row in applied.layers] and planned.layers
        assert planned.model_params_after == applied.model_params_after == sum(p.numel() for p in model.parameters())
        assert planned.model_trainable_after == _trainable(model), type(config).__name__


def test_lora_through_convert_is_apply_lora_and_freezes_all_but_the_adapters() -> None:
    config = LoRAConfig(rank=2, alpha=4.0, targets=("up",))
    torch.manual_seed(3)
    ours = dense_model(ROWS[0])
    report = convert_(ours, config)
    torch.manual_seed(3)
    theirs = dense_model(ROWS[0])
    info = apply_lora_(theirs, config)
    assert info["layers"] == [row.name for row in report.layers] == ["blocks.0.up", "blocks.1.up"]
    assert info["trainable"] == _trainable(ours) == report.model_trainable_after == 2 * 2 * (8 + 12)
    for key, value in ours.state_dict().items():
        assert torch.equal(theirs.state_dict()[key], value), key
    assert {n for n, p in ours.named_parameters() if p.requires_grad} == {
        f"blocks.{i}.up.lora_{m}" for i in (0, 1) for m in "ab"
    }


def test_lora_on_a_full_rank_svd_model_equals_peft_lora_on_the_dense_model() -> None:
    """An independent reference: at full rank the SVD layers are the dense ones, so LoRA on them is peft's LoRA."""
    peft = pytest.importorskip("peft")
    dense = dense_model(ROWS[0])
    ours = copy.deepcopy(dense)
    convert_(ours, SVDConfig(rank=8), allow_larger=True)  # rank 8 = min(8, 12): exact
    convert_(ours, LoRAConfig(rank=2, alpha=6.0, targets=("up", "down")))
    theirs = peft.get_peft_model(
        copy.deepcopy(dense), peft.LoraConfig(r=2, lora_alpha=6.0, target_modules=["up", "down"], lora_dropout=0.0)
    )
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, module in ours.named_modules():
            if isinstance(module, LoRALinear):
                assert isinstance(module.base, LowRankLinear)
                module.lora_b.copy_(torch.randn(module.lora_b.shape, generator=generator, dtype=torch.float64))
                target = theirs.base_model.model.get_submodule(name)
                target.lora_A["default"].weight.copy_(module.lora_a)
                target.lora_B["default"].weight.copy_(module.lora_b)
    x = sample_inputs(ROWS[0])
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-10, atol=1e-10)
    assert _trainable(ours) == _trainable(theirs)


def test_low_rank_then_4_bit_and_lora_survive_save_and_load(tmp_path: Path) -> None:
    """Low rank everywhere, then 4-bit on ``down`` and LoRA on ``up``: each layer is recorded innermost first."""
    model = dense_model(ROWS[0])
    convert_(model, SVDConfig(rank=4))
    convert_(model, RTNConfig(bits=4), filter_fn=lambda module, name: name.endswith("down"))
    convert_(model, LoRAConfig(rank=2, targets=("up",)))
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoRALinear):
                module.lora_b.normal_()
    save_pretrained(model, tmp_path / "stack")
    loaded = load_pretrained(tmp_path / "stack", model=dense_model(ROWS[0]))
    assert type(loaded.blocks[0].up) is LoRALinear and type(loaded.blocks[0].up.base) is LowRankLinear
    assert type(loaded.blocks[1].down) is QuantLowRankLinear
    assert {n for n, p in loaded.named_parameters() if p.requires_grad} == {
        n for n, p in model.named_parameters() if p.requires_grad
    }
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    x = sample_inputs(ROWS[0])  # a loaded factor may be stored in another memory layout, which reorders the sums
    torch.testing.assert_close(loaded(x), model(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", ["weight", "weight+activation"])
def test_qat_survives_save_and_load(tmp_path: Path, mode: str) -> None:
    model = dense_model(ROWS[0]).float()
    convert_(model, TTConfig(rank=3, n_cores=4))
    prepare_qat_(model, QATConfig(mode=mode, bits=3))
    x = sample_inputs(ROWS[0]).float()
    expected = model(x)  # the first batch sets the activation scales
    save_pretrained(model, tmp_path / mode)
    loaded = load_pretrained(tmp_path / mode, model=dense_model(ROWS[0]).float())
    kind = ActivationQuantTT if mode == "weight+activation" else TTLinear
    assert type(loaded.blocks[1].down) is kind
    assert [type(m).__name__ for m in loaded.modules()] == [type(m).__name__ for m in model.modules()]
    torch.testing.assert_close(loaded(x), expected, rtol=0, atol=0)


def test_unipelt_with_a_prompt_is_planned_and_survives_save_and_load(tmp_path: Path) -> None:
    """The adapters family: the plan books what equip_ builds, and save_pretrained/load_pretrained rebuild the
    prompt, prefixes, gated LoRA and bottlenecks as save_adapters/load_adapters (the adapters' own files) do."""
    from tensorslim.layers.adapters import equip_, load_adapters, save_adapters, unipelt
    from tests.unit.test_adapters import batch, randomize_, tiny_bert

    config = unipelt(prompt=True)
    model = tiny_bert()
    planned = plan(model, config)
    info = equip_(model, config)
    assert planned.model_params_after == info["total"] == sum(p.numel() for p in model.parameters())
    assert planned.model_trainable_after == info["trainable"]
    assert [row.name for row in planned.layers if row.name != "pelt_prefix"] == [
        name for kind in ("prompt", "lora", "prefix", "bottleneck") for name in info["layers"][kind]
    ]
    randomize_(model)
    ids, mask = batch()
    expected = model(input_ids=ids, attention_mask=mask).logits

    save_pretrained(model, tmp_path / "unipelt")
    loaded = load_pretrained(tmp_path / "unipelt")
    assert [type(m).__name__ for m in loaded.modules()] == [type(m).__name__ for m in model.modules()]
    torch.testing.assert_close(loaded(input_ids=ids, attention_mask=mask).logits, expected, rtol=0, atol=0)

    save_adapters(model, tmp_path / "adapters")
    reference = tiny_bert(seed=0)
    load_adapters(reference, tmp_path / "adapters")
    torch.testing.assert_close(reference(input_ids=ids, attention_mask=mask).logits, expected, rtol=0, atol=0)


def test_a_quantized_layer_recorded_without_a_config_still_loads(tmp_path: Path) -> None:
    """The first manifests recorded a quantized layer with its layout only (no config): it is rebuilt by the
    quantization family's shell, as now."""
    import json

    model = dense_model(ROWS[0]).float()
    convert_(model, SVDConfig(rank=4), filter_fn=lambda module, name: name.endswith("up"))
    convert_(model, RTNConfig(bits=4))
    folder = save_pretrained(model, tmp_path / "rtn")
    manifest = json.loads((folder / "tensorslim.json").read_text())
    assert {entry["kind"] for entry in manifest["layers"]} == {"quantize"}
    for entry in manifest["layers"]:
        entry["config"] = None
    (folder / "tensorslim.json").write_text(json.dumps(manifest))
    loaded = load_pretrained(folder, model=dense_model(ROWS[0]).float())
    assert type(loaded.blocks[0].up) is QuantLowRankLinear
    x = sample_inputs(ROWS[0]).float()
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
