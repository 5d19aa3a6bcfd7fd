"""UniPELT's modules and the prompt layer (tensorslim.layers.adapters): gate formulas against hand computations, gates
off = the ungated methods, parity with peft, masks, frozen base, save/load, merge, and the bad inputs."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
import transformers
from torch import nn

from tensorslim.layers.adapters import (
    BottleneckConfig,
    GatedLoRAConfig,
    PELTConfig,
    PrefixConfig,
    PromptConfig,
    equip_,
    load_adapters,
    merge_lora_,
    save_adapters,
    trainable_parameters,
    unipelt,
)
from tensorslim.layers.adapters.modules import Gate, GatedLoRALinear, extend_mask

D, HEADS, LAYERS, CLASSES = 32, 4, 3, 3


def tiny_bert(seed: int = 0, *, hidden: int = D, layers: int = LAYERS, positions: int = 64) -> nn.Module:
    """A randomly initialised Hugging Face BERT classifier, dropout off."""
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=100,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        intermediate_size=2 * hidden,
        max_position_embeddings=positions,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=CLASSES,
    )
    return transformers.BertForSequenceClassification(config).eval()


def batch(seed: int = 1, length: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    """Two sequences, the second padded after 4 tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 100, (2, length), generator=g)
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, 4:] = 0
    return ids, mask


def randomize_(model: nn.Module, seed: int = 3) -> None:
    """Non-zero values in every trainable tensor (fresh adapters start as the identity)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))


def test_gate_is_the_sequence_mean_of_a_sigmoid() -> None:
    gate = Gate(D)
    x = torch.randn(2, 5, D)
    w, b = gate.linear.weight[0], gate.linear.bias[0]
    by_hand = torch.tensor([sum(1 / (1 + math.exp(-(x[i, t] @ w + b).item())) for t in range(5)) / 5 for i in range(2)])
    torch.testing.assert_close(gate(x)[:, 0], by_hand.float())


def test_gated_lora_replaces_alpha_over_r_by_the_gate() -> None:
    base = nn.Linear(D, D)
    layer = GatedLoRALinear(base, rank=4, alpha=8.0, gate=True)
    nn.init.normal_(layer.lora_b)
    x = torch.randn(2, 5, D)
    g = torch.sigmoid(x @ layer.lora_gate.linear.weight.T + layer.lora_gate.linear.bias).mean(1, keepdim=True)
    by_hand = x @ base.weight.T + base.bias + g * (x @ layer.lora_a.T @ layer.lora_b.T)
    torch.testing.assert_close(layer(x), by_hand)
    ungated = GatedLoRALinear(base, rank=4, alpha=8.0, gate=False)
    ungated.load_state_dict(layer.state_dict(), strict=False)
    plain = x @ base.weight.T + base.bias + 2.0 * (x @ layer.lora_a.T @ layer.lora_b.T)
    torch.testing.assert_close(ungated(x), plain)


def test_ungated_lora_equals_peft_lora() -> None:
    import peft

    ours, theirs = tiny_bert(), tiny_bert()
    equip_(ours, PELTConfig(lora=GatedLoRAConfig(rank=4, alpha=8.0, gate=False)))
    randomize_(ours)
    peft.inject_adapter_in_model(peft.LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"]), theirs)
    mine = dict(ours.named_parameters())
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                stem = name.split(".lora_")[0]
                p.copy_(mine[f"{stem}.lora_a" if "lora_A" in name else f"{stem}.lora_b"])
        theirs.classifier.load_state_dict(ours.classifier.state_dict())
    ids, mask = batch()
    torch.testing.assert_close(ours(ids, attention_mask=mask).logits, theirs(ids, attention_mask=mask).logits)


def _attention_by_hand(attn: nn.Module, x: torch.Tensor, key_mask: torch.Tensor, pk, pv, gate) -> torch.Tensor:
    """Softmax attention of BERT's heads with prefix keys/values ``g·P`` before the sequence ones."""
    inner = attn.inner
    b, t, _ = x.shape
    split = lambda y: y.view(b, -1, HEADS, D // HEADS).transpose(1, 2)  # noqa: E731
    q, k, v = split(inner.query(x)), split(inner.key(x)), split(inner.value(x))
    k = torch.cat([gate * pk.expand(b, -1, -1, -1), k], 2)
    v = torch.cat([gate * pv.expand(b, -1, -1, -1), v], 2)
    scores = q @ k.transpose(2, 3) / math.sqrt(D // HEADS)
    visible = torch.cat([torch.ones(b, pk.shape[1], dtype=torch.bool), key_mask.bool()], 1)
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, D)


def test_gated_prefix_attention_matches_a_hand_computation() -> None:
    model = tiny_bert()
    equip_(model, PELTConfig(prefix=PrefixConfig(length=4, mlp_dim=16)))
    randomize_(model)
    attn = model.bert.encoder.layer[1].attention.self
    x = torch.randn(2, 6, D)
    key_mask = torch.tensor([[1] * 6, [1] * 3 + [0] * 3])
    additive = (1 - key_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
    enc = model.pelt_prefix
    flat = enc.transform(enc.embedding.weight).view(4, LAYERS, 2, HEADS, D // HEADS)
    pk, pv = flat[:, 1, 0].transpose(0, 1), flat[:, 1, 1].transpose(0, 1)  # (H, n, hd)
    g = torch.sigmoid(x @ attn.prefix_gate.linear.weight.T + attn.prefix_gate.linear.bias).mean(1).view(2, 1, 1, 1)
    out, _ = attn(x, attention_mask=additive)
    torch.testing.assert_close(out, _attention_by_hand(attn, x, key_mask, pk, pv, g))
    attn.prefix_gate = None  # gate off: the plain prefix
    out, _ = attn(x, attention_mask=additive)
    torch.testing.assert_close(out, _attention_by_hand(attn, x, key_mask, pk, pv, 1.0))


def test_ungated_prefix_equals_peft_prefix_tuning_on_the_same_prefixes() -> None:
    import peft

    ours, base = tiny_bert(), tiny_bert()
    wrapped = peft.get_peft_model(
        base,
        peft.PrefixTuningConfig(
            task_type="SEQ_CLS", num_virtual_tokens=4, prefix_projection=True, encoder_hidden_size=16
        ),
    )
    equip_(ours, PELTConfig(prefix=PrefixConfig(length=4, mlp_dim=16, gate=False)))
    theirs = wrapped.prompt_encoder["default"]
    ours.pelt_prefix.load_state_dict(
        {"embedding.weight": theirs.embedding.weight, **theirs.transform.state_dict(prefix="transform.")}
    )
    ids, mask = batch()
    positions = torch.arange(ids.shape[1]).expand(2, -1)  # peft's cache would shift positions by the prefix length
    # peft's own prefix path (its forward cannot see BERT's renamed cache argument in transformers 5): its
    # past_key_values, the prefix-extended mask, BERT's classifier head.
    hidden = base.bert(
        ids,
        attention_mask=torch.cat([torch.ones(2, 4, dtype=torch.long), mask], 1),
        past_key_values=wrapped.get_prompt(batch_size=2),
        position_ids=positions,
    ).pooler_output
    expected = base.classifier(hidden)
    got = ours(ids, attention_mask=mask, position_ids=positions).logits
    torch.testing.assert_close(got, expected)


def test_gated_bottleneck_adapter_matches_a_hand_computation() -> None:
    model = tiny_bert()
    equip_(model, PELTConfig(bottleneck=BottleneckConfig(reduction=4)))
    randomize_(model)
    out = model.bert.encoder.layer[0].output
    norm = out.LayerNorm
    ln = norm.inner
    x, r = torch.randn(2, 5, 2 * D), torch.randn(2, 5, D)
    h = out.dense(x)
    z = ln(h + r)
    g = torch.sigmoid(z @ norm.adapter_gate.linear.weight.T + norm.adapter_gate.linear.bias).mean(1, keepdim=True)
    adapted = F.relu(z @ norm.down.weight.T + norm.down.bias) @ norm.up.weight.T + norm.up.bias
    torch.testing.assert_close(out(x, r), ln(h + g * adapted + r))
    norm.adapter_gate = None
    torch.testing.assert_close(out(x, r), ln(h + adapted + r))


def test_fresh_adapters_start_as_the_pretrained_model_when_ungated() -> None:
    model, reference = tiny_bert(), tiny_bert()
    ids, mask = batch()
    config = PELTConfig(lora=GatedLoRAConfig(gate=False), bottleneck=BottleneckConfig(gate=False))
    equip_(model, config)
    torch.testing.assert_close(model(ids, attention_mask=mask).logits, reference(ids, attention_mask=mask).logits)


def test_prompt_tuning_equals_peft_prompt_tuning() -> None:
    import peft

    ours, base = tiny_bert(), tiny_bert()
    wrapped = peft.get_peft_model(base, peft.PromptTuningConfig(task_type="SEQ_CLS", num_virtual_tokens=5))
    equip_(ours, PELTConfig(prompt=PromptConfig(length=5)))
    with torch.no_grad():
        ours.pelt_prompt.weight.copy_(wrapped.prompt_encoder["default"].embedding.weight)
    ids, mask = batch()
    token_types = torch.zeros_like(ids)
    expected = wrapped(input_ids=ids, attention_mask=mask, token_type_ids=token_types).logits
    torch.testing.assert_close(ours(ids, attention_mask=mask, token_type_ids=token_types).logits, expected)


def test_prompt_from_text_copies_word_embeddings_repeated_like_peft() -> None:
    model = tiny_bert()
    equip_(model, PELTConfig(prompt=PromptConfig(length=5, init_text="topic")), encode=lambda _: [7, 9])
    words = model.bert.embeddings.word_embeddings.weight
    torch.testing.assert_close(model.pelt_prompt.weight, words[[7, 9, 7, 9, 7]])


def test_prompt_after_the_first_token_equals_the_base_on_hand_built_embeddings() -> None:
    """AdapterHub's ``combine="prefix_after_bos"``: the base model run on ``[e(x₀), P, e(x₁…)]`` with the mask and
    token types widened at the same place gives the same logits; ``[CLS]`` stays at position 0 for the pooler."""
    model, base = tiny_bert(), tiny_bert()
    equip_(model, PELTConfig(prompt=PromptConfig(length=3, combine="prefix_after_bos")))
    ids, mask = batch()
    types = torch.ones_like(ids)  # non-zero, so where the prompt's zeros go shows
    words = base.bert.embeddings.word_embeddings(ids)  # (2, 7, d)
    prompt = model.pelt_prompt.weight.detach().expand(2, -1, -1)
    embeds = torch.cat([words[:, :1], prompt, words[:, 1:]], dim=1)
    ones, zeros = torch.ones(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long)
    wide_mask = torch.cat([mask[:, :1], ones, mask[:, 1:]], dim=1)
    wide_types = torch.cat([types[:, :1], zeros, types[:, 1:]], dim=1)
    expected = base(inputs_embeds=embeds, attention_mask=wide_mask, token_type_ids=wide_types).logits
    torch.testing.assert_close(model(ids, attention_mask=mask, token_type_ids=types).logits, expected)
    before = tiny_bert()
    equip_(before, PELTConfig(prompt=PromptConfig(length=3)))
    before.pelt_prompt.weight.data.copy_(model.pelt_prompt.weight)
    assert not torch.allclose(before(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits)


def test_prompt_from_the_vocabulary_draws_rows_of_the_frozen_embedding_table() -> None:
    """Lester et al.'s sampled-vocabulary start (arXiv 2104.08691, §3.2): each prompt token is the word embedding of
    an id drawn uniformly from the range, the draw peft's ``SAMPLE_VOCAB`` makes (``randint`` on the global
    generator); the prompt still adds exactly length × d parameters."""
    model, plain = tiny_bert(), tiny_bert()
    torch.manual_seed(11)
    report = equip_(model, PELTConfig(prompt=PromptConfig(length=6, init_vocab=(40, 60))))
    torch.manual_seed(11)
    ids = torch.randint(40, 60, (6,))
    words = model.bert.embeddings.word_embeddings.weight
    assert torch.equal(model.pelt_prompt.weight, words[ids])
    matches = (model.pelt_prompt.weight[:, None, :] == words[None, :, :]).all(-1)  # (6, V): which rows it is
    assert all(40 <= int(row.nonzero()[0]) < 60 for row in matches)
    assert torch.equal(words, plain.bert.embeddings.word_embeddings.weight) and not words.requires_grad
    assert report["prompt"] == 6 * D and report["trainable"] == 6 * D + D * CLASSES + CLASSES


def test_frequent_tokens_start_after_specials_reserved_slots_and_single_characters() -> None:
    from tensorslim.methods.adapters import frequent_token_range

    tokens = ["[PAD]", "[unused0]", "[CLS]", "a", "b", "!", "the", "##s", "of", "and"]
    assert frequent_token_range(tokens, {"[PAD]", "[CLS]"}, 3) == (6, 9)  # the, ##s, of
    with pytest.raises(ValueError, match="prompt_init_vocab=5 is more than the 4 frequency-ordered") as error:
        frequent_token_range(tokens, {"[PAD]", "[CLS]"}, 5)
    assert "\n" not in str(error.value)


def test_prompt_from_minilms_5000_most_frequent_tokens_starts_at_the() -> None:
    """``--prompt-init-vocab 5000`` on MiniLM draws from BERT's ids 1996 (``the``) … 6995, frequency order."""
    from tensorslim.methods import build_for_method

    torch.manual_seed(5)
    model, _, _ = build_for_method(
        "minilm", "prompt", task="classify", options={"prompt_init_vocab": 5000}, n_classes=5
    )
    assert model.pelt_config.prompt.init_vocab == (1996, 6996)
    words = model.get_input_embeddings().weight
    rows = (model.pelt_prompt.weight[:, None, :] == words[None, :, :]).all(-1).nonzero()[:, 1]
    assert len(rows) == 10 and all(1996 <= int(i) < 6996 for i in rows)


def test_masks_with_prefix_and_prompt_hide_padding() -> None:
    """Ungated (a gate averages over padding too), a padded sequence gives the logits of the unpadded one."""
    model = tiny_bert()
    config = PELTConfig(prefix=PrefixConfig(length=3, mlp_dim=8, gate=False), prompt=PromptConfig(length=2))
    equip_(model, config)
    randomize_(model)
    ids, mask = batch()
    padded = model(ids, attention_mask=mask).logits[1]
    alone = model(ids[1:, :4], attention_mask=mask[1:, :4]).logits[0]
    torch.testing.assert_close(padded, alone)
    bool_mask = torch.tensor([[[[True, False]]]])
    assert extend_mask(bool_mask, 2).tolist() == [[[[True, True, True, False]]]]
    additive = torch.tensor([[[[0.0, -1e9]]]])
    assert extend_mask(additive, 1).tolist() == [[[[0.0, 0.0, -1e9]]]]
    assert extend_mask(None, 3) is None


def test_unipelt_count_equals_adapterhub_formula_and_prompt_adds_length_times_d() -> None:
    model = tiny_bert(hidden=384, layers=6, positions=32)
    counts = equip_(model, unipelt())
    d, layers, bottleneck = 384, 6, 384 // 16
    # AdapterHub's UniPELTConfig: PrefixTuning(10, bottleneck 512) shared pool + one shared gate Linear(d, 1) per
    # layer; SeqBn(reduction 16) down/up with biases + gate Linear(d, 1); LoRA(r 8) on q and v, each gate Linear(d, 1).
    prefix = 10 * d + (d * 512 + 512) + (512 * layers * 2 * d + layers * 2 * d) + layers * (d + 1)
    adapter = layers * ((d * bottleneck + bottleneck) + (bottleneck * d + d) + (d + 1))
    lora = layers * 2 * (8 * d + d * 8 + (d + 1))
    assert (counts["prefix"], counts["bottleneck"], counts["lora"]) == (prefix, adapter, lora)
    assert counts["other"] == d * CLASSES + CLASSES  # the classifier head
    with_prompt = equip_(tiny_bert(hidden=384, layers=6, positions=32), unipelt(prompt=True))
    assert with_prompt["trainable"] - counts["trainable"] == 10 * 384 == 3840


def test_from_layer_adapts_only_the_later_layers() -> None:
    model = tiny_bert()
    report = equip_(model, unipelt(from_layer=2))
    assert all(".layer.2." in name for kind in ("lora", "prefix", "bottleneck") for name in report["layers"][kind])
    assert model.pelt_prefix.n_layers == 1
    assert type(model.bert.encoder.layer[0].output.LayerNorm) is nn.LayerNorm


def test_training_leaves_the_frozen_base_bit_identical() -> None:
    model = tiny_bert()
    before = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("classifier")}
    equip_(model, unipelt(prompt=True))
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids, mask = batch()
    for _ in range(3):
        F.cross_entropy(model(ids, attention_mask=mask).logits, torch.tensor([0, 2])).backward()
        optimizer.step()
        optimizer.zero_grad()
    state = {k.replace(".inner.", ".").replace(".base.", "."): v for k, v in model.state_dict().items()}
    for name, value in before.items():
        assert torch.equal(state[name], value), name
    assert not torch.equal(model.classifier.weight, tiny_bert().classifier.weight)


def test_save_then_load_onto_a_fresh_base_gives_identical_logits(tmp_path) -> None:
    model = tiny_bert()
    equip_(model, unipelt(prompt=True))
    randomize_(model)
    save_adapters(model, tmp_path)
    fresh = tiny_bert(seed=0)
    fresh.classifier.reset_parameters()  # the head comes from the file
    load_adapters(fresh, tmp_path)
    ids, mask = batch()
    torch.testing.assert_close(fresh(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapters.json", "adapters.safetensors"]


def test_a_prompt_started_from_text_loads_without_a_tokenizer(tmp_path) -> None:
    """The trained prompt replaces its start, so loading needs no ``encode``; the saved config is kept."""
    model = tiny_bert()
    equip_(model, PELTConfig(prompt=PromptConfig(length=3, init_text="topic")), encode=lambda _: [7])
    randomize_(model)
    save_adapters(model, tmp_path)
    fresh = tiny_bert()
    load_adapters(fresh, tmp_path)
    assert torch.equal(fresh.pelt_prompt.weight, model.pelt_prompt.weight)
    assert fresh.pelt_config == model.pelt_config


def test_merging_ungated_lora_is_exact_and_gated_lora_refuses() -> None:
    model = tiny_bert()
    equip_(model, PELTConfig(lora=GatedLoRAConfig(gate=False)))
    randomize_(model)
    ids, mask = batch()
    before = model(ids, attention_mask=mask).logits
    assert len(merge_lora_(model)) == 2 * LAYERS
    assert isinstance(model.bert.encoder.layer[0].attention.self.query, nn.Linear)
    torch.testing.assert_close(model(ids, attention_mask=mask).logits, before, atol=1e-5, rtol=1e-5)
    gated = tiny_bert()
    equip_(gated, PELTConfig(lora=GatedLoRAConfig(gate=True)))
    with pytest.raises(ValueError, match="gated LoRA update depends on the input"):
        merge_lora_(gated)


def test_trainable_report_counts_what_the_optimizer_sees() -> None:
    model = tiny_bert()
    report = equip_(model, unipelt(prompt=True))
    assert report["trainable"] == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert report == {**trainable_parameters(model), "layers": report["layers"]}


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: equip_(tiny_bert(), PELTConfig(lora=GatedLoRAConfig(targets=("qkv",)))),
            r"targets=\('qkv',\) match no",
        ),
        (lambda: PrefixConfig(length=0), "length=0 is invalid"),
        (lambda: PrefixConfig(length=-2), "length=-2 is invalid"),
        (lambda: equip_(tiny_bert(positions=8), PELTConfig(prompt=PromptConfig(length=8))), "the position table"),
        (lambda: equip_(nn.Sequential(nn.Linear(4, 4)), PELTConfig(prefix=PrefixConfig())), "has none it recognizes"),
        (lambda: equip_(nn.Sequential(nn.Linear(4, 4)), PELTConfig(bottleneck=BottleneckConfig())), "BERT-family"),
        (lambda: PELTConfig(), "has no module"),
        (lambda: PromptConfig(init_vocab=(5, 5)), r"init_vocab=\(5, 5\) is invalid"),
        (
            lambda: PromptConfig(combine="suffix"),
            r"combine='suffix' is invalid; allowed: \['prefix', 'prefix_after_bos'\]",
        ),
        (lambda: PromptConfig(init_vocab=(0, 9), init_text="x"), "init_vocab and init_text are both set"),
        (
            lambda: equip_(tiny_bert(), PELTConfig(prompt=PromptConfig(init_vocab=(0, 101)))),
            r"reaches past the 100-token vocabulary",
        ),
    ],
)
def test_bad_input_is_a_one_line_error(build, message) -> None:
    with pytest.raises(ValueError, match=message) as error:
        build()
    assert "\n" not in str(error.value)


def test_prompt_plus_sequence_longer_than_the_position_table_is_a_one_line_error() -> None:
    model = tiny_bert(positions=10)
    equip_(model, PELTConfig(prompt=PromptConfig(length=4)))
    ids = torch.randint(5, 100, (1, 7))
    with pytest.raises(ValueError, match=r"prompt length 4 \+ sequence length 7 exceeds the 10-position table"):
        model(ids)


def test_loading_adapters_onto_a_base_of_another_shape_is_a_one_line_error(tmp_path) -> None:
    model = tiny_bert()
    equip_(model, unipelt())
    save_adapters(model, tmp_path)
    with pytest.raises(ValueError, match="trained on a base of another shape") as error:
        load_adapters(tiny_bert(hidden=48), tmp_path)
    assert "\n" not in str(error.value)
    deeper = tiny_bert(layers=LAYERS + 1)
    with pytest.raises(ValueError, match="another shape"):
        load_adapters(deeper, tmp_path)


def test_new_modules_follow_the_model_mode() -> None:
    model = tiny_bert()  # in eval mode
    equip_(model, unipelt(prompt=True))
    assert not any(m.training for m in model.modules())


def test_a_model_is_equipped_once() -> None:
    model = tiny_bert()
    equip_(model, unipelt())
    with pytest.raises(ValueError, match="equipped already"):
        equip_(model, unipelt())
    assert copy.deepcopy(model).pelt_config == unipelt()


def test_prefix_encoder_starts_from_berts_init_near_zero_prefixes() -> None:
    from tensorslim.layers.adapters.modules import PrefixEncoder

    torch.manual_seed(0)
    enc = PrefixEncoder(length=10, dim=64, n_layers=2, n_heads=4, mlp_dim=128)
    first, _, second = enc.transform
    for weight in (enc.embedding.weight, first.weight, second.weight):  # UniPELT's code: BERT's N(0, 0.02)
        assert abs(weight.std().item() - 0.02) < 0.003
    assert not first.bias.any() and not second.bias.any()
    # E·W₁ has std √64·0.02·0.02 ≈ 0.003, so P = W₂·tanh(·) ≈ √128·0.003·0.02 ≈ 7e-4; PyTorch's default init
    # (E ~ N(0, 1), Kaiming-uniform weights, uniform biases) gives prefixes of about ±0.3.
    keys, values = enc.layer(1)
    assert keys.abs().max() < 0.01 and values.abs().max() < 0.01


def _prefixes_by_hand(enc) -> torch.Tensor:
    """``P = W₂·tanh(W₁·E + b₁) + b₂`` of every layer in peft's layout ``(layer, key/value, head, length, hd)``."""
    first, _, second = enc.transform
    flat = torch.tanh(enc.embedding.weight @ first.weight.T + first.bias) @ second.weight.T + second.bias
    return flat.view(enc.length, enc.n_layers, 2, enc.n_heads, enc.dim // enc.n_heads).permute(1, 2, 3, 0, 4)


@pytest.mark.parametrize("change", ["data", "copy_", "load_state_dict", "optimizer step"])
def test_prefixes_without_gradients_follow_every_way_a_weight_changes(change: str) -> None:
    from tensorslim.layers.adapters.modules import PrefixEncoder

    torch.manual_seed(0)
    enc = PrefixEncoder(length=3, dim=16, n_layers=2, n_heads=2, mlp_dim=8)
    with torch.no_grad():
        before = enc.layer(1)
    weight = enc.transform[2].weight
    if change == "data":  # not seen by the version counter
        weight.data.add_(0.5)
    elif change == "copy_":
        with torch.no_grad():
            weight.copy_(torch.randn_like(weight))
    elif change == "load_state_dict":
        state = {key: torch.randn_like(value) for key, value in enc.state_dict().items()}
        enc.load_state_dict(state)
    else:
        optimizer = torch.optim.SGD(enc.parameters(), lr=1.0)
        keys, values = enc.layer(1)
        (keys.sum() + values.sum()).backward()
        optimizer.step()
    with torch.no_grad():
        after = enc.layer(1)
        reference = _prefixes_by_hand(enc)[1]
    assert not torch.equal(after[0], before[0])
    torch.testing.assert_close(torch.stack(after), reference)


def test_prompt_from_the_class_names_starts_where_peft_text_init_starts() -> None:
    """Our prompt and peft's ``PromptTuningInit.TEXT`` from the same text (the classes, as ``finetune --prompt-init
    labels`` passes) start at the same word embeddings of MiniLM's tokenizer."""
    from tensorslim.methods import build_for_method

    text = "business entertainment politics sports tech"
    options = {"prompt_init_text": text}
    ours, _, _ = build_for_method("minilm", "prompt", task="classify", options=options, n_classes=5)
    theirs, _, _ = build_for_method("minilm", "peft-prompt", task="classify", options=options, n_classes=5)
    expected = theirs.peft_prompt_encoder["default"].embedding.weight
    torch.testing.assert_close(ours.pelt_prompt.weight, expected)
    words = ours.get_input_embeddings().weight
    assert not torch.equal(expected[1], expected[2]) and torch.equal(expected[1], words[2449])  # "business"


def test_blank_prompt_init_text_is_a_one_line_error() -> None:
    from tensorslim.methods.adapters import PELTOptions

    with pytest.raises(ValueError, match="prompt_init_text=' ' is invalid") as error:
        PELTOptions(prompt_init_text=" ")
    assert "\n" not in str(error.value)


def test_the_prompt_trains_in_its_own_group_at_its_multiple_of_the_rate() -> None:
    """One AdamW step from zero moments moves each weight by ``lr · g / (|g| + eps)`` (Kingma & Ba, arXiv 1412.6980,
    Alg. 1, bias-corrected): ≈ 10 × the run's rate for the prompt, the run's rate for the adapters and the head; the
    frozen base does not move."""
    from tensorslim.methods.adapters import PromptRateHook

    model = tiny_bert()
    equip_(model, unipelt(prompt=True))
    model.train()
    frozen = {n: p.clone() for n, p in model.named_parameters() if not p.requires_grad}
    optimizer = PromptRateHook(10.0).build_optimizer(model, lr=1e-3, weight_decay=0.0)
    other, prompt = optimizer.param_groups
    assert (prompt["name"], prompt["lr"], prompt["lr_scale"]) == ("prompt", 1e-2, 10.0)
    assert (other["name"], other["lr"], other["lr_scale"]) == ("other", 1e-3, 1.0)
    assert [id(p) for p in prompt["params"]] == [id(model.pelt_prompt.weight)]
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert {id(p) for p in other["params"]} == trainable - {id(model.pelt_prompt.weight)}
    start = {id(p): p.detach().clone() for p in model.parameters() if p.requires_grad}
    ids, mask = batch()
    F.cross_entropy(model(ids, attention_mask=mask).logits, torch.tensor([0, 2])).backward()
    optimizer.step()
    for group in optimizer.param_groups:
        for p in group["params"]:
            expected = start[id(p)] - group["lr"] * p.grad / (p.grad.abs() + 1e-8)
            torch.testing.assert_close(p.detach(), expected, atol=1e-7, rtol=1e-5)
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)


def test_the_prompt_methods_put_their_prompt_after_cls_by_default() -> None:
    from tensorslim.methods.adapters import PELTOptions, pelt_config

    assert pelt_config("unipelt-prompt", PELTOptions()).prompt.combine == "prefix_after_bos"
    assert unipelt(prompt=True) == pelt_config("unipelt-prompt", PELTOptions())  # the API shortcut: the same
    assert pelt_config("prompt", PELTOptions()).prompt.combine == "prefix_after_bos"
    assert pelt_config("unipelt-prompt", PELTOptions(prompt_combine="prefix")).prompt.combine == "prefix"
    with pytest.raises(ValueError, match="prompt_combine='end' is invalid") as error:
        PELTOptions(prompt_combine="end")
    assert "\n" not in str(error.value)


def test_prompt_rate_defaults_ten_times_for_unipelt_prompt_and_once_for_prompt() -> None:
    from tensorslim.methods.adapters import PELTOptions, PromptRateHook, prompt_lr_scale

    assert prompt_lr_scale("unipelt-prompt", PELTOptions()) == 10.0
    assert prompt_lr_scale("prompt", PELTOptions()) == 1.0
    assert prompt_lr_scale("prompt", PELTOptions(prompt_lr_scale=3)) == 3.0
    model = tiny_bert()
    equip_(model, unipelt(prompt=True))
    assert PromptRateHook(1.0).build_optimizer(model, lr=1e-3, weight_decay=0.0) is None  # the trainer's default
    unprompted = tiny_bert()
    equip_(unprompted, unipelt())
    assert PromptRateHook(10.0).build_optimizer(unprompted, lr=1e-3, weight_decay=0.0) is None
    for bad in (0, -1.0, True, "10"):
        with pytest.raises(ValueError, match=f"prompt_lr_scale={bad!r} is invalid") as error:
            PELTOptions(prompt_lr_scale=bad)
        assert "\n" not in str(error.value)


def test_train_pooler_trains_berts_pooler_with_the_head_and_nothing_else_of_the_base() -> None:
    """``train_pooler=True`` adds the pooler's d·d + d parameters; with fresh (identity) adapters its gradient is the
    one full fine-tuning gives the same model, and one step moves it while the rest of the base stays bit-identical.
    Off (the default): the pooler is frozen, as in the official UniPELT code and peft."""
    from dataclasses import replace

    frozen = tiny_bert()
    off = equip_(frozen, PELTConfig(lora=GatedLoRAConfig(gate=False)))
    assert off["pooler"] == 0 and not any(p.requires_grad for p in frozen.bert.pooler.parameters())
    model = tiny_bert()
    on = equip_(model, replace(frozen.pelt_config, train_pooler=True))
    assert on["pooler"] == D * D + D and on["trainable"] - off["trainable"] == D * D + D
    dense = tiny_bert()
    ids, mask = batch()
    labels = torch.tensor([0, 2])
    for m in (model, dense):
        F.cross_entropy(m(ids, attention_mask=mask).logits, labels).backward()
    torch.testing.assert_close(model.bert.pooler.dense.weight.grad, dense.bert.pooler.dense.weight.grad)
    base = {n: p.clone() for n, p in model.named_parameters() if not p.requires_grad}
    pooler = model.bert.pooler.dense.weight.clone()
    torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2).step()
    assert not torch.equal(model.bert.pooler.dense.weight, pooler)
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if n in base)


def test_a_trained_pooler_saves_and_loads_with_the_adapters(tmp_path) -> None:
    from dataclasses import replace

    model = tiny_bert()
    equip_(model, replace(unipelt(), train_pooler=True))
    randomize_(model)
    save_adapters(model, tmp_path)
    fresh = tiny_bert()
    load_adapters(fresh, tmp_path)
    ids, mask = batch()
    torch.testing.assert_close(fresh(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits)
    assert fresh.pelt_config.train_pooler and torch.equal(fresh.bert.pooler.dense.bias, model.bert.pooler.dense.bias)


def test_train_pooler_defaults_off_for_our_methods_and_peft_refuses_it() -> None:
    from tensorslim.methods import build_for_method
    from tensorslim.methods.adapters import PELTOptions, pelt_config

    for method in ("lora", "prefix", "adapter", "prompt", "unipelt", "unipelt-prompt"):
        assert pelt_config(method, PELTOptions()).train_pooler is False, method
        assert pelt_config(method, PELTOptions(train_pooler=True)).train_pooler is True, method
    with pytest.raises(ValueError, match="peft-lora keeps peft's frozen pooler") as error:
        build_for_method("minilm", "peft-lora", task="classify", options={"train_pooler": True}, n_classes=5)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: PELTConfig(lora=GatedLoRAConfig(), train_pooler="yes"), "train_pooler='yes' is invalid"),
        (
            lambda: equip_(
                nn.Sequential(nn.Linear(4, 4)), PELTConfig(lora=GatedLoRAConfig(targets=("0",)), train_pooler=True)
            ),
            "train_pooler=True needs a base model with a pooler; Sequential has none",
        ),
    ],
)
def test_bad_train_pooler_is_a_one_line_error(build, message) -> None:
    with pytest.raises(ValueError, match=message) as error:
        build()
    assert "\n" not in str(error.value)
