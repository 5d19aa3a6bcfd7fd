"""convert_ / plan on our LLaMA and on Hugging Face models built from tiny local configs."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tensorslim.convert import METHODS, convert_, plan
from tensorslim.layers.lowrank import CoLAConfig, LowRankLinear, SVDConfig
from tensorslim.models.llama import LlamaForCausalLM
from tests.helpers import TINY_LLAMA

transformers = pytest.importorskip("transformers")


def _n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _check_report_books(model: nn.Module, before: int, report) -> None:  # noqa: ANN001
    assert report.model_params_before == before
    assert report.model_params_after == _n_params(model)
    for layer in report.layers:
        assert model.get_submodule(layer.name).num_params() == layer.params_after


def test_convert_our_llama_keeps_head_and_embeddings_dense() -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(TINY_LLAMA)
    before = _n_params(model)
    report = convert_(model, CoLAConfig())
    assert len(report.layers) == 7 * TINY_LLAMA.n_layers
    assert isinstance(model.lm_head, nn.Linear) and not isinstance(model.lm_head, LowRankLinear)
    assert all(isinstance(model.get_submodule(layer.name), LowRankLinear) for layer in report.layers)
    assert {layer.rank for layer in report.layers} == {16}  # 0.25 · min(64, 172)
    _check_report_books(model, before, report)
    assert torch.isfinite(model(torch.randint(0, 256, (2, 16)))).all()


def test_plan_leaves_model_untouched_and_matches_convert() -> None:
    model = LlamaForCausalLM(TINY_LLAMA)
    snapshot = copy.deepcopy(model.state_dict())
    planned = plan(model, SVDConfig(rank=8))
    assert model.state_dict().keys() == snapshot.keys()
    assert not any(isinstance(m, LowRankLinear) for m in model.modules())
    assert planned.layers == convert_(model, SVDConfig(rank=8)).layers


def test_full_rank_svd_conversion_preserves_outputs() -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(TINY_LLAMA).double()
    ids = torch.randint(0, 256, (2, 12))
    expected = model(ids)
    convert_(model, SVDConfig(rank_ratio=1.0))
    torch.testing.assert_close(model(ids), expected, rtol=1e-9, atol=1e-9)


def test_bad_rank_leaves_model_untouched() -> None:
    model = LlamaForCausalLM(TINY_LLAMA)
    with pytest.raises(ValueError, match=r"layer 'layers.0.self_attn.q_proj': rank=65 is out of range"):
        convert_(model, CoLAConfig(rank=65))
    assert not any(isinstance(m, LowRankLinear) for m in model.modules())


def test_filter_fn_selects_layers() -> None:
    model = LlamaForCausalLM(TINY_LLAMA)
    report = convert_(model, CoLAConfig(), filter_fn=lambda module, name: name.endswith("mlp.up_proj"))
    assert [layer.name for layer in report.layers] == ["layers.0.mlp.up_proj", "layers.1.mlp.up_proj"]


def test_unregistered_config_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="no registered transform"):
        convert_(LlamaForCausalLM(TINY_LLAMA), object())


def test_method_registry_names() -> None:
    assert METHODS["cola"] is CoLAConfig and METHODS["svd"] is SVDConfig


def test_hf_llama_with_only_lr_act() -> None:
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=128
    )
    model = transformers.LlamaForCausalLM(config)
    before = _n_params(model)
    report = convert_(model, CoLAConfig(only_lr_act=True))
    assert len(report.layers) == 14
    assert isinstance(model.model.layers[0].mlp.act_fn, nn.Identity)
    _check_report_books(model, before, report)
    assert torch.isfinite(model(torch.randint(0, 128, (1, 10))).logits).all()


def test_hf_gpt2_conv1d() -> None:
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=32)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 128, (1, 10))
    expected = model(ids).logits
    before = _n_params(model)
    # c_attn (64->192), c_proj (64->64), c_fc (64->256), mlp.c_proj (256->64) per block; lm_head is tied, skipped.
    report = convert_(model, SVDConfig(rank_ratio=1.0))
    assert [layer.kind for layer in report.layers] == ["Conv1D"] * 8
    _check_report_books(model, before, report)
    torch.testing.assert_close(model(ids).logits, expected, rtol=1e-3, atol=1e-3)


def test_hf_bert_model() -> None:
    config = transformers.BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=100
    )
    model = transformers.BertModel(config).eval()
    before = _n_params(model)
    report = convert_(model, CoLAConfig(rank=8))
    # q, k, v, attention output, intermediate, output per layer, plus the pooler.
    assert len(report.layers) == 6 * 2 + 1
    _check_report_books(model, before, report)
    out = model(torch.randint(0, 100, (2, 9)))
    assert torch.isfinite(out.last_hidden_state).all()


def test_meta_model_needs_random_init() -> None:
    with torch.device("meta"):
        model = LlamaForCausalLM(TINY_LLAMA)
    with pytest.raises(ValueError, match="init='random'"):
        convert_(model, CoLAConfig())
    report = convert_(model, CoLAConfig(init="random"))
    assert report.model_params_after == _n_params(model)
