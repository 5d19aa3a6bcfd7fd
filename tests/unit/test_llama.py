"""Our LLaMA against Hugging Face's reference implementation, and the presets' books."""

from __future__ import annotations

import pytest
import torch

from tensorslim.books import count_params, flops_per_token
from tensorslim.methods import build_for_method
from tensorslim.models import get_model, model_names
from tensorslim.models.llama import CONFIGS, KVCache, LlamaConfig, LlamaForCausalLM
from tests.helpers import TINY_LLAMA


def _hf_twin(config: LlamaConfig) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.LlamaConfig(
        hidden_size=config.d_model,
        intermediate_size=config.d_ff,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_heads,
        vocab_size=config.vocab_size,
        rms_norm_eps=config.norm_eps,
        max_position_embeddings=config.max_seq_len,
        tie_word_embeddings=False,
    )
    hf_config._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(hf_config)


def test_logits_equal_hugging_face_llama() -> None:
    torch.manual_seed(0)
    ours = LlamaForCausalLM(TINY_LLAMA)
    hf = _hf_twin(TINY_LLAMA)
    state = {("" if k == "lm_head.weight" else "model.") + k: v for k, v in ours.state_dict().items()}
    hf.load_state_dict(state)
    ids = torch.randint(0, TINY_LLAMA.vocab_size, (2, 24))
    torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=1e-4, atol=1e-5)


def test_param_count_equals_hugging_face() -> None:
    assert count_params(LlamaForCausalLM(TINY_LLAMA)).total == sum(p.numel() for p in _hf_twin(TINY_LLAMA).parameters())


# Derived from the GaLore/CoLA model configs (CoLA, arXiv 2502.10940): total params full -> CoLA, in millions, and
# the forward FLOPs per token at s = 256 including attention and the head.
PAPER_BOOKS = {
    "60m": (58.1, 42.8, 87.6, 57.0),
    "130m": (134.1, 94.0, 228.5, 148.2),
    "350m": (368.0, 185.2, 695.5, 330.0),
    "1b": (1339.1, 609.3, 2597, 1138),
    "7b": (6738, 2821, 13348, 5513),
}


@pytest.mark.parametrize("name", list(PAPER_BOOKS))
def test_preset_books_reproduce_the_cola_tables(name: str) -> None:
    dense, _, _ = build_for_method(name, "dense", device="meta")
    cola, (report,), _ = build_for_method(name, "cola", device="meta")
    params_dense, params_cola, flops_dense, flops_cola = PAPER_BOOKS[name]
    assert round(count_params(dense).total / 1e6, 1) == pytest.approx(params_dense, abs=0.51)
    assert round(count_params(cola).total / 1e6, 1) == pytest.approx(params_cola, abs=0.51)
    assert flops_per_token(dense, seq_len=256) / 1e6 == pytest.approx(flops_dense, rel=1e-3)
    assert flops_per_token(cola, seq_len=256) / 1e6 == pytest.approx(flops_cola, rel=1e-3)
    assert report.model_params_after == count_params(cola).total
    assert len(report.layers) == 7 * CONFIGS[name].n_layers


def test_only_lr_act_follows_the_cola_configs() -> None:
    small, _, _ = build_for_method("60m", "cola", device="meta")
    large, _, _ = build_for_method("350m", "cola", device="meta")
    assert isinstance(small.layers[0].mlp.act_fn, torch.nn.SiLU)
    assert isinstance(large.layers[0].mlp.act_fn, torch.nn.Identity)


def test_all_models_have_the_paper_dims() -> None:
    configs = {name: get_model(name).config for name in model_names("lm") if get_model(name).family.name == "llama"}
    dims = {name: (c.d_model, c.d_ff, c.n_heads, c.n_layers) for name, c in configs.items()}
    assert list(dims) == ["tiny", "60m", "130m", "350m", "1b", "7b"]
    assert dims["60m"] == (512, 1376, 8, 8)
    assert dims["130m"] == (768, 2048, 12, 12)
    assert dims["350m"] == (1024, 2736, 16, 24)
    assert dims["1b"] == (2048, 5461, 32, 24)
    assert dims["7b"] == (4096, 11008, 32, 32)


def test_unknown_preset_and_bad_shapes() -> None:
    with pytest.raises(ValueError, match="model='3b' is unknown"):
        get_model("3b")
    with pytest.raises(ValueError, match="n_heads=5"):
        LlamaConfig(d_model=64, n_layers=1, n_heads=5, d_ff=8)
    with pytest.raises(ValueError, match="exceeds max_seq_len=64"):
        LlamaForCausalLM(TINY_LLAMA)(torch.zeros(1, 65, dtype=torch.long))


def _decode_in_chunks(model: LlamaForCausalLM, ids: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    cache, logits, start = model.new_cache(), [], 0
    for size in sizes:
        logits.append(model(ids[:, start : start + size], cache=cache))
        start += size
        assert cache.length == start
    return torch.cat(logits, dim=1)


@pytest.mark.parametrize("sizes", [[1] * 20, [7, 1, 1, 1, 5, 5], [20]], ids=["tokens", "chunks", "prefill"])
def test_cached_decoding_equals_the_full_forward(sizes: list[int]) -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(TINY_LLAMA).eval()
    ids = torch.randint(0, TINY_LLAMA.vocab_size, (2, sum(sizes)))
    with torch.no_grad():
        torch.testing.assert_close(_decode_in_chunks(model, ids, sizes), model(ids), rtol=1e-4, atol=1e-5)


def test_cached_decoding_of_a_cola_model_equals_its_full_forward() -> None:
    torch.manual_seed(0)
    model, _, _ = build_for_method("tiny", "cola")
    model.eval()
    ids = torch.randint(0, model.config.vocab_size, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(_decode_in_chunks(model, ids, [4, 1, 1, 6]), model(ids), rtol=1e-4, atol=1e-5)


def test_cache_continues_positions_and_checks_its_bounds() -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(TINY_LLAMA).eval()
    ids = torch.randint(0, TINY_LLAMA.vocab_size, (1, 2))
    with torch.no_grad():
        cache = model.new_cache()
        model(ids[:, :1], cache=cache)
        second = model(ids[:, 1:], cache=cache)
        assert not torch.allclose(second, model(ids[:, 1:]))  # position 1 (and token 0) differ from a fresh start
        cache = model.new_cache()
        model(torch.zeros(1, 60, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="sequence length 65 exceeds max_seq_len=64"):
            model(torch.zeros(1, 5, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="cache has 3 layers; allowed: the model's 2"):
            model(ids, cache=KVCache(3))


def test_a_tt_embedding_replaces_the_token_table() -> None:
    from tensorslim.convert import convert_
    from tensorslim.layers.tt_embedding import TTEmbedding, TTEmbeddingConfig

    model = LlamaForCausalLM(TINY_LLAMA)
    ids = torch.randint(TINY_LLAMA.vocab_size, (2, 8))
    convert_(model, TTEmbeddingConfig(rank=4, n_cores=2, init="ttm_svd"))
    assert isinstance(model.embed_tokens, TTEmbedding)
    assert model(ids).shape == (2, 8, TINY_LLAMA.vocab_size)  # forward reads no .weight of the embedding
