"""The layer registry, and convert_ / plan on our LLaMA and on Hugging Face models built from tiny local configs."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn

from tensorslim.convert import convert_, plan
from tensorslim.layers.cola_m import CoLAMConfig
from tensorslim.layers.kron import KronConfig
from tensorslim.layers.lax import LaXCoLAConfig, LaXConfig
from tensorslim.layers.lax_tt import LaXTTConfig
from tensorslim.layers.lowrank import CoLAConfig, LowRankConfig, LowRankLinear, SVDConfig
from tensorslim.layers.tt import TTConfig
from tensorslim.layers.tt_embedding import TTEmbeddingConfig
from tensorslim.models.llama import LlamaForCausalLM
from tensorslim.registry import TRANSFORMS, LayerReport, Transform, register_transform, transform_for
from tests.helpers import TINY_LLAMA


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
    convert_(model, SVDConfig(rank_ratio=1.0), allow_larger=True)
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


def test_every_family_registers_itself_and_subclasses_resolve_by_mro() -> None:
    families = {LowRankConfig, CoLAMConfig, LaXConfig, TTConfig, LaXTTConfig, TTEmbeddingConfig, KronConfig}
    assert families <= set(TRANSFORMS)
    assert transform_for(CoLAConfig()) is TRANSFORMS[LowRankConfig]  # no entry of its own: its base class's
    assert transform_for(SVDConfig()) is TRANSFORMS[LowRankConfig]
    assert transform_for(CoLAMConfig()) is TRANSFORMS[CoLAMConfig]  # the nearest registered class wins
    assert transform_for(LaXCoLAConfig()) is TRANSFORMS[LaXConfig]


def test_a_new_family_is_one_registration() -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class ScaleConfig:
        factor: float = 2.0

    class Scaled(nn.Module):
        def __init__(self, module: nn.Module, config: ScaleConfig) -> None:
            super().__init__()
            self.inner, self.factor = module, config.factor

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.factor * self.inner(x)

    def plan_row(name: str, module: nn.Module, config: ScaleConfig) -> LayerReport:
        n = sum(p.numel() for p in module.parameters())
        return LayerReport(name, "Linear", (module.in_features, module.out_features), "scaled", 0, n, n)

    transform = Transform(lambda m: isinstance(m, nn.Linear), plan_row, Scaled)
    register_transform(ScaleConfig, transform)
    try:
        register_transform(ScaleConfig, transform)  # the same transform again is harmless
        with pytest.raises(ValueError, match="ScaleConfig already has a transform"):
            register_transform(ScaleConfig, dataclasses.replace(transform, finalize=lambda *args: None))
        model = nn.Sequential(nn.Linear(3, 4, bias=False), nn.ReLU(), nn.Linear(4, 2, bias=False))
        x = torch.randn(5, 3)
        expected = 4 * model(x)  # ReLU is positively homogeneous
        report = convert_(model, ScaleConfig())
        assert [row.name for row in report.layers] == ["0", "2"] and isinstance(model[2], Scaled)
        torch.testing.assert_close(model(x), expected)
    finally:
        del TRANSFORMS[ScaleConfig]


def test_hf_llama_with_only_lr_act() -> None:
    transformers = pytest.importorskip("transformers")
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
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=32)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 128, (1, 10))
    expected = model(ids).logits
    before = _n_params(model)
    # c_attn (64->192), c_proj (64->64), c_fc (64->256), mlp.c_proj (256->64) per block; lm_head is tied, skipped.
    report = convert_(model, SVDConfig(rank_ratio=1.0), allow_larger=True)
    assert [layer.kind for layer in report.layers] == ["Conv1D"] * 8
    _check_report_books(model, before, report)
    torch.testing.assert_close(model(ids).logits, expected, rtol=1e-3, atol=1e-3)


def test_hf_bert_model() -> None:
    transformers = pytest.importorskip("transformers")
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


def test_a_default_tt_embedding_conversion_takes_only_the_token_table() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128
    )
    model = transformers.BertModel(config)
    report = convert_(model, TTEmbeddingConfig(rank=8))  # the 2-row token-type table cannot be factored
    assert [layer.name for layer in report.layers] == ["embeddings.word_embeddings"]
    assert {name for name, _ in report.skipped} == {
        "embeddings.position_embeddings",
        "embeddings.token_type_embeddings",
    }
    assert model(torch.randint(1000, (2, 8))).last_hidden_state.shape == (2, 8, 64)


def test_hugging_face_classification_heads_stay_dense_and_plans_say_so() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=100, hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128
    )
    model = transformers.BertForSequenceClassification(config)  # classifier 64 -> 2: rank_ratio would give rank 1
    planned = plan(model, CoLAConfig())
    assert "classifier" not in {layer.name for layer in planned.layers}
    assert ("classifier", "output head") in planned.skipped
    assert "layers to convert (plan)" in planned.table() and "converted" not in planned.table().splitlines()[-1]
    report = convert_(model, CoLAConfig())
    assert isinstance(model.classifier, nn.Linear) and "layers converted" in report.table()
