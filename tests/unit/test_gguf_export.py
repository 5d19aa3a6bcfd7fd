"""GGUF export read back with the gguf package's own reader: llama.cpp's names, metadata, tokenizer and weights (RoPE
rows interleaved), low-rank layers merged, and the refusals."""

from __future__ import annotations

import inspect
import json

import pytest
import torch

from tensorslim.convert import convert_
from tensorslim.data.tokenizer import EOS_TOKEN, TextTokenizer, _train_bpe
from tensorslim.export import to_gguf
from tensorslim.export.gguf import rope_interleave
from tensorslim.layers.lowrank import CoLAConfig, SVDConfig
from tensorslim.models.llama import LlamaConfig, LlamaForCausalLM

gguf = pytest.importorskip("gguf", reason="GGUF export needs the deploy extra: pip install 'tensorslim[deploy]'")

CONFIG = LlamaConfig(d_model=64, n_layers=2, n_heads=4, d_ff=128, vocab_size=320, max_seq_len=128)


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    backend = _train_bpe([inspect.getdoc(m) or "" for m in (json, inspect, torch.nn)], vocab_size=300)
    return TextTokenizer(backend, name="bpe300:test", eos_id=backend.token_to_id(EOS_TOKEN), identity="bpe300-test")


def _model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(CONFIG).eval()


def _read(path) -> tuple[dict, dict]:
    reader = gguf.GGUFReader(str(path))
    tensors = {}
    for t in reader.tensors:
        shape = [int(n) for n in reversed(t.shape.tolist())]  # GGUF lists dims innermost first
        values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)
        tensors[t.name] = (t.tensor_type.name, torch.from_numpy(values.astype("float32")))
    return reader.fields, tensors


def _field(fields: dict, key: str):
    field = fields[key]
    values = [field.parts[i] for i in field.data]
    as_text = [bytes(v).decode() if v.dtype == "uint8" else v.tolist()[0] for v in values]
    return as_text if len(as_text) > 1 else as_text[0]


@pytest.mark.parametrize(
    ("dtype", "kind", "tolerance"), [("f16", "F16", 1e-3), ("q8_0", "Q8_0", 1e-2), ("q4_0", "Q4_0", 0.15)]
)
def test_weights_names_and_metadata_read_back(tmp_path, tokenizer, dtype: str, kind: str, tolerance: float) -> None:
    model = _model()
    path = tmp_path / f"m-{dtype}.gguf"
    report = to_gguf(model, path, tokenizer=tokenizer, dtype=dtype)
    fields, tensors = _read(path)
    assert report["types"] == {kind: 2 + 7 * CONFIG.n_layers, "F32": 1 + 2 * CONFIG.n_layers}
    assert _field(fields, "general.architecture") == "llama" and _field(fields, "llama.block_count") == 2
    assert _field(fields, "tokenizer.ggml.model") == "gpt2" and _field(fields, "tokenizer.ggml.pre") == "gpt-2"
    tokens = _field(fields, "tokenizer.ggml.tokens")
    assert len(tokens) == CONFIG.vocab_size and tokens[tokenizer.eos_id] == EOS_TOKEN
    assert tokens[: tokenizer.vocab_size] == [tokenizer.backend.id_to_token(i) for i in range(tokenizer.vocab_size)]
    block = model.layers[1]
    expected = {
        "token_embd.weight": model.embed_tokens.weight,
        "blk.1.attn_q.weight": rope_interleave(block.self_attn.q_proj.weight, CONFIG.n_heads),
        "blk.1.attn_k.weight": rope_interleave(block.self_attn.k_proj.weight, CONFIG.n_heads),
        "blk.1.attn_v.weight": block.self_attn.v_proj.weight,
        "blk.1.ffn_down.weight": block.mlp.down_proj.weight,
        "output.weight": model.lm_head.weight,
    }
    for name, weight in expected.items():
        stored_kind, stored = tensors[name]
        assert stored_kind == kind and stored.shape == weight.shape
        assert torch.linalg.norm(stored - weight) <= tolerance * torch.linalg.norm(weight), name
    assert tensors["blk.0.attn_norm.weight"][0] == "F32"


def test_rope_interleave_moves_rotate_half_pairs_next_to_each_other() -> None:
    heads, head_dim = 2, 8
    rows = torch.arange(heads * head_dim, dtype=torch.float32)[:, None]  # row r holds r
    moved = rope_interleave(rows, heads).flatten().tolist()
    # rotate-half pairs (i, i + hd/2) of each head become (2i, 2i + 1)
    assert moved[:8] == [0, 4, 1, 5, 2, 6, 3, 7] and moved[8:] == [8, 12, 9, 13, 10, 14, 11, 15]


def test_svd_model_is_merged_back_to_dense(tmp_path, tokenizer) -> None:
    model = _model()
    convert_(model, SVDConfig(rank=8, init="random"))
    to_gguf(model, tmp_path / "svd.gguf", tokenizer=tokenizer, dtype="f16")
    _, tensors = _read(tmp_path / "svd.gguf")
    up = model.layers[0].mlp.up_proj
    torch.testing.assert_close(tensors["blk.0.ffn_up.weight"][1], up.weight_b @ up.weight_a, rtol=0, atol=2e-3)


def test_refusals_change_nothing(tmp_path, tokenizer) -> None:
    cola = _model()
    convert_(cola, CoLAConfig(rank=8, init="random"))
    with pytest.raises(ValueError, match="activation='identity'"):
        to_gguf(cola, tmp_path / "cola.gguf", tokenizer=tokenizer)
    assert not (tmp_path / "cola.gguf").exists()
    with pytest.raises(ValueError, match="dtype='q3_k'"):
        to_gguf(_model(), tmp_path / "x.gguf", tokenizer=tokenizer, dtype="q3_k")
    existing = tmp_path / "mine.gguf"
    existing.write_text("keep me")
    with pytest.raises(ValueError, match="overwrite=True"):
        to_gguf(_model(), existing, tokenizer=tokenizer)
    assert existing.read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["mine.gguf"]
