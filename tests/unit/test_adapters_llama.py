"""Prompt tuning (and prompt + LoRA) on our LLaMA: the references are the base model on hand-built token sequences."""

from __future__ import annotations

import pytest
import torch

from tensorslim.layers.adapters import GatedLoRAConfig, PELTConfig, PromptConfig, equip_, load_adapters, save_adapters
from tensorslim.models import build_model
from tensorslim.tasks.lm import lm_loss

VOCAB, LENGTH = 256, 4


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("tiny", vocab_size=VOCAB).eval()


def _prompted(combine: str = "prefix", **extra) -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor]:
    """A base, an equipped copy whose prompt rows are the embeddings of known tokens, and those tokens."""
    base, model = _llama(), _llama()
    equip_(model, PELTConfig(prompt=PromptConfig(length=LENGTH, combine=combine), **extra))
    words = torch.tensor([7, 99, 3, 200])
    with torch.no_grad():
        model.pelt_prompt.weight.copy_(base.embed_tokens.weight[words])
    return base, model, words


@pytest.mark.parametrize("combine", ["prefix", "prefix_after_bos"])
def test_prompt_logits_equal_the_base_on_the_prompt_tokens_put_into_the_sequence(combine: str) -> None:
    base, model, words = _prompted(combine)
    ids = torch.randint(0, VOCAB, (2, 9))
    cut = 1 if combine == "prefix_after_bos" else 0
    full = torch.cat([ids[:, :cut], words.expand(2, -1), ids[:, cut:]], dim=1)  # (2, 4 + 9)
    with torch.no_grad():
        expected = base(full)
        expected = torch.cat([expected[:, :cut], expected[:, cut + LENGTH :]], dim=1)  # the inputs' rows
        got = model(ids)
    assert got.shape == (2, 9, VOCAB)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_decoding_with_a_cache_equals_the_full_forward_and_sees_the_prompt() -> None:
    base, model, words = _prompted()
    ids = torch.randint(0, VOCAB, (1, 8))
    with torch.no_grad():
        full = model(ids)  # (1, 8, V)
        cache = model.new_cache()
        rows = [model(ids[:, :5], cache=cache)] + [model(ids[:, t : t + 1], cache=cache) for t in range(5, 8)]
        assert cache.length == LENGTH + 8  # the prompt's keys and values are cached once, before the tokens
        unprompted = base(ids)
    torch.testing.assert_close(torch.cat(rows, dim=1), full, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(full, unprompted, atol=1e-3)


def test_only_the_prompt_trains_and_the_base_stays_bit_identical() -> None:
    _, model, _ = _prompted()
    frozen = {name: p.clone() for name, p in model.named_parameters() if name != "pelt_prompt.weight"}
    start = model.pelt_prompt.weight.clone()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    ids = torch.randint(0, VOCAB, (2, 16))
    lm_loss(model, ids).backward()  # the LM task's fused head and loss: the hidden rows are cut to the inputs' too
    optimizer.step()
    assert [name for name, p in model.named_parameters() if p.requires_grad] == ["pelt_prompt.weight"]
    assert not torch.equal(model.pelt_prompt.weight, start)
    assert all(torch.equal(p, frozen[name]) for name, p in model.named_parameters() if name in frozen)


def test_prompt_and_lora_stack_and_save_then_load_onto_a_fresh_llama(tmp_path) -> None:
    _, model, _ = _prompted(lora=GatedLoRAConfig(rank=4, gate=False, targets=("q_proj", "v_proj")))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_b" in name:
                p.normal_()  # LoRA's B starts at zero; make the update count
    report = equip_(_llama(), model.pelt_config)
    d, layers = model.config.d_model, model.config.n_layers
    assert report["prompt"] == LENGTH * d
    assert report["lora"] == layers * 2 * 4 * (d + d)  # q and v: A (4, d) + B (d, 4) per layer
    save_adapters(model, tmp_path)
    fresh = _llama()
    load_adapters(fresh, tmp_path)
    ids = torch.randint(0, VOCAB, (2, 6))
    with torch.no_grad():
        assert torch.equal(fresh.eval()(ids), model(ids))


def test_prompt_that_does_not_fit_the_context_is_a_one_line_error() -> None:
    limit = _llama().config.max_seq_len
    with pytest.raises(ValueError, match=f"allowed: < {limit}"):
        equip_(_llama(), PELTConfig(prompt=PromptConfig(length=limit)))
    _, model, _ = _prompted()
    with pytest.raises(ValueError, match=f"allowed: sequences of at most {limit - LENGTH} tokens"):
        model(torch.zeros(1, limit - LENGTH + 1, dtype=torch.long))
