"""Our GPT-2 against Hugging Face's ``GPT2LMHeadModel``: names, logits, weight transfer both ways, books and init."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tensorslim.books import count_params
from tensorslim.models import build_model, get_model
from tensorslim.models.gpt2 import GPT2Config, GPT2ForCausalLM

transformers = pytest.importorskip("transformers")

SMALL = GPT2Config(d_model=64, n_layers=3, n_heads=4, d_ff=256, vocab_size=211, max_seq_len=48)


def _hf(config: GPT2Config) -> nn.Module:
    hf_config = transformers.GPT2Config(
        n_embd=config.d_model,
        n_layer=config.n_layers,
        n_head=config.n_heads,
        n_inner=config.d_ff,
        vocab_size=config.vocab_size,
        n_positions=config.max_seq_len,
        bos_token_id=0,
        eos_token_id=0,
    )
    hf_config._attn_implementation = "eager"
    return transformers.GPT2LMHeadModel(hf_config)


def _randomize_(model: nn.Module) -> None:
    """Non-trivial LayerNorm and bias values too (HF's init leaves them at 1 and 0)."""
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.2)


def test_module_and_parameter_names_equal_hugging_face() -> None:
    ours, hf = GPT2ForCausalLM(SMALL), _hf(SMALL)
    assert list(ours.state_dict()) == list(hf.state_dict())
    conv1d = {name for name, module in hf.named_modules() if isinstance(module, transformers.pytorch_utils.Conv1D)}
    linear = {name for name, module in ours.named_modules() if isinstance(module, nn.Linear)}
    assert linear == conv1d | {"lm_head"}
    assert len(conv1d) == 4 * SMALL.n_layers


def test_logits_equal_hugging_face_with_its_weights() -> None:
    torch.manual_seed(0)
    hf = _hf(SMALL).eval()
    _randomize_(hf)
    ours = GPT2ForCausalLM.from_hf_state_dict(hf.state_dict(), GPT2Config.from_hf(hf.config)).eval()
    ids = torch.randint(0, SMALL.vocab_size, (2, 40))
    with torch.no_grad():
        diff = (ours(ids) - hf(ids).logits).abs().max().item()
    assert diff < 1e-5


def test_hugging_face_reproduces_our_logits_from_to_hf_state_dict() -> None:
    torch.manual_seed(1)
    ours = GPT2ForCausalLM(SMALL).eval()
    _randomize_(ours)
    hf = _hf(SMALL).eval()
    hf.load_state_dict(ours.to_hf_state_dict())
    ids = torch.randint(0, SMALL.vocab_size, (3, 17))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids), rtol=0, atol=1e-5)


def test_bare_gpt2model_state_dict_loads_with_tied_head() -> None:
    torch.manual_seed(2)
    hf = _hf(SMALL)
    ours = GPT2ForCausalLM(SMALL)
    ours.load_hf_state_dict(hf.transformer.state_dict())  # no "transformer." prefix, no lm_head
    torch.testing.assert_close(ours.transformer.h[1].attn.c_attn.weight, hf.transformer.h[1].attn.c_attn.weight.t())
    assert ours.lm_head.weight is ours.transformer.wte.weight
    torch.testing.assert_close(ours.lm_head.weight, hf.transformer.wte.weight)


@pytest.mark.parametrize("name", ["gpt2-tiny", "gpt2-small"])
def test_param_count_equals_hugging_face(name: str) -> None:
    config = get_model(name).config
    ours = build_model(name, device="meta")
    with torch.device("meta"):
        hf = _hf(config)
    assert count_params(ours).total == sum(p.numel() for p in hf.parameters())


def test_gpt2_small_has_the_124m_shape() -> None:
    config = get_model("gpt2-small").config
    assert (config.d_model, config.n_layers, config.n_heads, config.d_ff) == (768, 12, 12, 3072)
    assert (config.vocab_size, config.max_seq_len) == (50257, 1024)
    assert count_params(build_model("gpt2-small", device="meta")).total == 124_439_808


def test_config_from_hf_default_is_gpt2_small() -> None:
    assert GPT2Config.from_hf(transformers.GPT2Config()) == get_model("gpt2-small").config


def test_init_scales_residual_projections() -> None:
    torch.manual_seed(0)
    config = GPT2Config(d_model=128, n_layers=8, n_heads=4, d_ff=512, vocab_size=64, max_seq_len=16)
    model = GPT2ForCausalLM(config)
    block = model.transformer.h[0]
    assert block.mlp.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert block.mlp.c_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.02)
    assert block.attn.c_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert block.attn.c_attn.bias.abs().max().item() == 0.0
    assert model.lm_head.weight is model.transformer.wte.weight


def test_causal_the_past_does_not_see_the_future() -> None:
    torch.manual_seed(0)
    model = GPT2ForCausalLM(SMALL).eval()
    ids = torch.randint(0, SMALL.vocab_size, (1, 12))
    changed = ids.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % SMALL.vocab_size
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[:, :8], model(changed)[:, :8])
        assert not torch.allclose(model(ids)[:, 8:], model(changed)[:, 8:])


def test_convert_treats_its_projections_as_linears_and_keeps_the_head() -> None:
    from tensorslim.convert import convert_
    from tensorslim.layers.lowrank import SVDConfig

    model = GPT2ForCausalLM(SMALL)
    report = convert_(model, SVDConfig(rank=8, init="random"))
    assert len(report.layers) == 4 * SMALL.n_layers
    assert type(model.lm_head) is nn.Linear and model.lm_head.weight is model.transformer.wte.weight
    assert model(torch.zeros(1, 5, dtype=torch.long)).shape == (1, 5, SMALL.vocab_size)


def test_bad_configs_and_lengths() -> None:
    with pytest.raises(ValueError, match="n_heads=5"):
        GPT2Config(d_model=64, n_layers=1, n_heads=5, d_ff=8)
    with pytest.raises(ValueError, match="dropout=1.0"):
        GPT2Config(d_model=64, n_layers=1, n_heads=4, d_ff=8, dropout=1.0)
    with pytest.raises(ValueError, match="activation_function='relu'"):
        GPT2Config.from_hf(transformers.GPT2Config(activation_function="relu"))
    with pytest.raises(ValueError, match="exceeds max_seq_len=48"):
        GPT2ForCausalLM(SMALL)(torch.zeros(1, 49, dtype=torch.long))
