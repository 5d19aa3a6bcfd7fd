"""save_pretrained / load_pretrained: every converted layer family round-trips with bit-identical outputs, on our
LLaMA and on Hugging Face BERT and GPT-2 built from configs (no download)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch import nn

from tensorslim.convert import convert_
from tensorslim.layers.cola_m import CoLAMConfig
from tensorslim.layers.kron import KronConfig
from tensorslim.layers.lax import LaXCoLAConfig
from tensorslim.layers.lowrank import CoLAConfig, SVDConfig
from tensorslim.layers.tt import TTConfig
from tensorslim.layers.tt_embedding import TTEmbeddingConfig
from tensorslim.methods.comera.gates import truncate_
from tensorslim.models.registry import build_model
from tensorslim.pretrained import MANIFEST, WEIGHTS, RegisteredBase, load_pretrained, save_pretrained
from tensorslim.quant import RTNConfig, quantize_

VOCAB = 300


def _tiny_llama() -> nn.Module:
    torch.manual_seed(0)
    return build_model("tiny", vocab_size=VOCAB, max_seq_len=32)


def _is_embedding(name: str) -> Callable[[nn.Module, str], bool]:
    return lambda _, qualified: qualified == name


def _kill_first_rank(model: nn.Module) -> None:
    """Gate off one rank of the first bond of every gated TT layer, then slice it out (CoMERA's truncation)."""
    with torch.no_grad():
        for module in model.modules():
            if len(getattr(module, "gates", ())):
                module.gates[0][0] = 0.0
    truncate_(model)


def _convert(case: str, model: nn.Module) -> None:
    if case == "tt-truncated":
        convert_(model, TTConfig(rank=4, n_cores=4, init="random", rank_gates=True))
        _kill_first_rank(model)
    elif case == "tt-embedding":
        convert_(model, TTEmbeddingConfig(rank=4, n_cores=2, init="random"), filter_fn=_is_embedding("embed_tokens"))
    elif case == "rtn":
        quantize_(model, RTNConfig(bits=4), None)
    else:
        configs = {
            "cola": CoLAConfig(rank=16, init="random", only_lr_act=True),
            "svd": SVDConfig(rank=16, init="random"),
            "cola-m": CoLAMConfig(rank=16, init="random"),
            "lax-cola": LaXCoLAConfig(rank=16, init="random"),
            "tt": TTConfig(rank=4, n_cores=4, init="random"),
            "kron": KronConfig(rank=2, init="random"),
        }
        convert_(model, configs[case])


def _perturb(model: nn.Module) -> None:
    """Make every parameter distinct from any initialization (a wrongly rebuilt layer cannot match by chance)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.01 * torch.randn(param.shape, generator=generator, dtype=param.dtype))


CASES = ["cola", "svd", "cola-m", "lax-cola", "tt", "tt-truncated", "tt-embedding", "kron", "rtn"]


@pytest.mark.parametrize("case", CASES)
def test_tiny_llama_round_trip_is_exact(case: str, tmp_path: Path) -> None:
    model = _tiny_llama()
    _convert(case, model)
    _perturb(model)
    save_pretrained(model, tmp_path, base="tiny")
    loaded = load_pretrained(tmp_path)
    assert [(n, type(m)) for n, m in model.named_modules()] == [(n, type(m)) for n, m in loaded.named_modules()]
    expected, got = model.state_dict(), loaded.state_dict()
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model.embed_tokens(ids), loaded.embed_tokens(ids))
        assert torch.equal(model.eval()(ids), loaded(ids))


def test_only_lr_act_and_lax_crossings_are_rebuilt(tmp_path: Path) -> None:
    model = _tiny_llama()
    convert_(model, LaXCoLAConfig(rank=16, init="random", only_lr_act=True))
    save_pretrained(model, tmp_path, base="tiny")
    loaded = load_pretrained(tmp_path)
    assert isinstance(loaded.layers[1].mlp.act_fn, nn.Identity)
    assert not loaded.layers[0].self_attn.q_proj.crosses and loaded.layers[1].self_attn.q_proj.crosses


def test_manifest_records_names_configs_and_truncated_ranks(tmp_path: Path) -> None:
    model = _tiny_llama()
    _convert("tt-truncated", model)
    quantize_(model, RTNConfig(bits=3), None, filter_fn=lambda _, name: name == "lm_head")
    save_pretrained(model, tmp_path, base=RegisteredBase(name="tiny", vocab_size=VOCAB))
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert manifest["base"] == {
        "kind": "tensorslim",
        "name": "tiny",
        "task": "lm",
        "vocab_size": VOCAB,
        "max_seq_len": None,
        "n_classes": None,
    }
    layers = {entry["name"]: entry for entry in manifest["layers"]}
    q_proj = layers["layers.0.self_attn.q_proj"]
    assert q_proj["config"]["type"] == "tensorslim.layers.tt.TTConfig"
    truncated = model.layers[0].self_attn.q_proj.ranks
    assert truncated[1] == 3 and q_proj["config"]["fields"]["rank"] == list(truncated)
    assert layers["lm_head"]["kind"] == "quantize"
    assert layers["lm_head"]["state"] | {"dtype": None} == {
        "kind": "linear",
        "in": 256,
        "out": VOCAB,
        "bits": 3,
        "bias": False,
        "dtype": None,
    }


def _tiny_bert() -> nn.Module:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
    )
    return BertModel(config)


def test_hugging_face_bert_round_trip_is_exact(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    bert = _tiny_bert()
    convert_(bert, CoLAConfig(rank=8, init="random"), filter_fn=lambda _, name: ".attention." in name)
    convert_(bert, KronConfig(rank=2, init="random"), filter_fn=lambda _, name: name.endswith("intermediate.dense"))
    convert_(
        bert, TTEmbeddingConfig(rank=4, n_cores=2, init="random"), filter_fn=_is_embedding("embeddings.word_embeddings")
    )
    quantize_(
        bert,
        RTNConfig(bits=4),
        None,
        filter_fn=lambda _, name: name.endswith(".output.dense") and "attention" not in name,
    )
    _perturb(bert)
    save_pretrained(bert, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["BertModel"]
    loaded = load_pretrained(tmp_path)
    ids = torch.randint(0, 99, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(bert.eval()(ids).last_hidden_state, loaded(ids).last_hidden_state)
    assert type(loaded) is type(bert)


def test_hugging_face_gpt2_keeps_its_tied_head_and_truncated_ranks(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=40)
    gpt2 = transformers.GPT2LMHeadModel(config)
    convert_(gpt2, TTConfig(rank=3, n_cores=4, init="random", rank_gates=True))
    _kill_first_rank(gpt2)
    _perturb(gpt2)
    save_pretrained(gpt2, tmp_path)
    with safe_open(tmp_path / WEIGHTS, framework="pt") as weights:
        stored = set(weights.keys())
    assert "transformer.wte.weight" in stored and "lm_head.weight" not in stored
    loaded = load_pretrained(tmp_path)
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    ids = torch.randint(0, 99, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(gpt2.eval()(ids).logits, loaded(ids).logits)


def test_lora_adapters_round_trip_frozen(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from tensorslim.layers.lora import LoRAConfig, apply_lora_

    bert = _tiny_bert()
    apply_lora_(bert, LoRAConfig(rank=4, alpha=3.0, targets=("query", "value"), lax_gate="kronecker"))
    _perturb(bert)
    save_pretrained(bert, tmp_path)
    loaded = load_pretrained(tmp_path)
    ids = torch.randint(0, 99, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(bert.eval()(ids).last_hidden_state, loaded(ids).last_hidden_state)
    trainable = {name for name, p in loaded.named_parameters() if p.requires_grad}
    assert trainable == {name for name, p in bert.named_parameters() if p.requires_grad}


class _Custom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_a_custom_base_is_passed_to_load(tmp_path: Path) -> None:
    model = _Custom()
    convert_(model, SVDConfig(rank=2))
    save_pretrained(model, tmp_path)
    with pytest.raises(ValueError, match="pass model="):
        load_pretrained(tmp_path)
    loaded = load_pretrained(tmp_path, model=_Custom().to("meta"))
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert torch.equal(model.eval()(x), loaded(x))  # both in eval mode, as loaded


def test_unknown_config_types_and_formats_are_rejected(tmp_path: Path) -> None:
    model = _Custom()
    convert_(model, SVDConfig(rank=2))
    save_pretrained(model, tmp_path)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    manifest["layers"][0]["config"]["type"] = "os.system"
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="config type 'os.system' is unknown"):
        load_pretrained(tmp_path, model=_Custom())
    (tmp_path / MANIFEST).write_text(json.dumps({**manifest, "version": 99}))
    with pytest.raises(ValueError, match="version 99"):
        load_pretrained(tmp_path, model=_Custom())


def test_missing_or_corrupt_weights_are_a_value_error(tmp_path: Path) -> None:
    save_pretrained(_Custom(), tmp_path)
    (tmp_path / WEIGHTS).write_bytes(b"{ not safetensors")
    with pytest.raises(ValueError, match=f"{WEIGHTS} is missing or corrupt: "):
        load_pretrained(tmp_path, model=_Custom())
    (tmp_path / WEIGHTS).unlink()
    with pytest.raises(ValueError, match=f"{WEIGHTS} is missing or corrupt: "):
        load_pretrained(tmp_path, model=_Custom())


def test_cli_convert_save_writes_a_loadable_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import load_file

    from tensorslim.cli.main import main
    from tensorslim.layers.lowrank import LowRankLinear

    assert main(["convert", "--preset", "tiny", "--method", "svd", "--save", str(tmp_path / "tiny-svd")]) == 0
    assert f"saved {tmp_path / 'tiny-svd'}" in capsys.readouterr().out
    loaded = load_pretrained(tmp_path / "tiny-svd")
    assert sum(isinstance(m, LowRankLinear) for m in loaded.modules()) == 4 * 7
    weights = load_file(tmp_path / "tiny-svd" / WEIGHTS)
    assert weights.keys() == loaded.state_dict().keys()
    assert all(torch.equal(weights[k], v) for k, v in loaded.state_dict().items())


def _base_and_tuned() -> tuple[nn.Module, nn.Module]:
    """A frozen 64×64 body with a 2-way head (the base as built), and a copy whose head alone was trained."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    tuned = copy.deepcopy(base)
    with torch.no_grad():
        tuned[2].weight.add_(0.5)
    return base, tuned


def test_a_folder_saved_against_its_base_holds_only_what_changed(tmp_path: Path) -> None:
    base, tuned = _base_and_tuned()
    save_pretrained(tuned, tmp_path, reference=base)
    with safe_open(tmp_path / WEIGHTS, "pt") as file:
        assert set(file.keys()) == {"2.weight"}  # every tensor equal to the base's is left to it
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert manifest["base_weights"]["shapes"] == {"0.weight": [64, 64], "0.bias": [64], "2.bias": [2]}
    loaded = load_pretrained(tmp_path, model=copy.deepcopy(base))
    x = torch.randn(3, 64)
    with torch.no_grad():
        assert torch.equal(loaded(x), tuned.eval()(x))

    other = copy.deepcopy(base)
    with torch.no_grad():
        other[0].weight[0, 0] += 1e-3  # another version of the base's weights
    with pytest.raises(ValueError, match="SHA-256") as refused:
        load_pretrained(tmp_path, model=other)
    assert "\n" not in str(refused.value)
    with pytest.raises(ValueError, match="missing"):
        load_pretrained(tmp_path, model=nn.Sequential(nn.Linear(64, 2)))


def test_a_folder_whose_base_supplies_little_stands_alone(tmp_path: Path) -> None:
    base, tuned = _base_and_tuned()
    with torch.no_grad():
        tuned[0].weight.mul_(2)  # the body trained too: the base supplies under half the bytes
    save_pretrained(tuned, tmp_path, reference=base)
    assert "base_weights" not in json.loads((tmp_path / MANIFEST).read_text())
    with safe_open(tmp_path / WEIGHTS, "pt") as file:
        assert len(list(file.keys())) == 4
