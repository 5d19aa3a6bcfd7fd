"""UniPELT's modules and the prompt layer on our own BERT (tensorslim.models.bert).

The reference is Hugging Face's BERT carrying the same weights and the same adapter tensors: its adapter modules are
checked against hand computations and peft in test_adapters.py, so equal hidden states here check ours end to end.
"""

from __future__ import annotations

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
    save_adapters,
    trainable_parameters,
    unipelt,
)
from tensorslim.models import build_model
from tensorslim.models.bert import BertConfig, BertForMaskedLM, BertForSequenceClassification

D, HEADS, LAYERS, CLASSES, VOCAB, POSITIONS = 32, 4, 3, 3, 100, 24
# Hugging Face name → ours: the embeddings, then each block's layers, then the attention projections.
_RENAMES = (
    ("bert.embeddings.word_embeddings", "encoder.embeddings.word"),
    ("bert.embeddings.position_embeddings", "encoder.embeddings.position"),
    ("bert.embeddings.token_type_embeddings", "encoder.embeddings.token_type"),
    ("bert.embeddings.LayerNorm", "encoder.embeddings.norm"),
    ("bert.encoder.layer.", "encoder.layers."),
    (".attention.self.", ".attn."),
    (".attention.output.dense", ".attn.o"),
    (".attention.output.LayerNorm", ".norm1"),
    (".intermediate.dense", ".ffn.fc1"),
    (".output.dense", ".ffn.fc2"),
    (".output.LayerNorm", ".norm2"),
    (".query.", ".q."),
    (".key.", ".k."),
    (".value.", ".v."),
)


def _ours(name: str) -> str:
    for theirs, mine in _RENAMES:
        name = name.replace(theirs, mine)
    return name


def hf_bert(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=D,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=2 * D,
        max_position_embeddings=POSITIONS,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        layer_norm_eps=1e-12,
        num_labels=CLASSES,
    )
    return transformers.BertForSequenceClassification(config).eval()


def our_bert(pooling: str = "mean", *, positions: int = POSITIONS) -> BertForSequenceClassification:
    config = BertConfig(
        vocab_size=VOCAB,
        d_model=D,
        n_layers=LAYERS,
        n_heads=HEADS,
        d_ff=2 * D,
        max_seq_len=positions,
        norm_eps=1e-12,
        dropout=0.0,
        n_classes=CLASSES,
        pooling=pooling,
    )
    torch.manual_seed(1)
    return BertForSequenceClassification(config).eval()


def twins() -> tuple[nn.Module, nn.Module]:
    """A Hugging Face BERT and ours with the same encoder weights."""
    theirs, ours = hf_bert(), our_bert()
    mine = dict(ours.named_parameters())
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if name.startswith("bert.encoder") or name.startswith("bert.embeddings"):
                mine[_ours(name)].copy_(p)
    return theirs, ours


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two sequences of 7 tokens, the second padded after 4."""
    ids = torch.randint(5, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 4:] = 0
    return ids, mask


def _randomize_and_copy(theirs: nn.Module, ours: nn.Module) -> None:
    """Non-zero values in every adapter tensor of ``theirs`` (fresh adapters start as the identity), copied to ours."""
    generator = torch.Generator().manual_seed(3)
    mine = {name: p for name, p in ours.named_parameters() if p.requires_grad and not name.startswith("classifier")}
    copied = set()
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if p.requires_grad and not name.startswith("classifier"):
                p.copy_(0.2 * torch.randn(p.shape, generator=generator))
                mine[_ours(name)].copy_(p)
                copied.add(_ours(name))
    assert copied == set(mine)  # the same adapter tensors, under the same names but for the layers' own


def test_our_bert_carrying_hugging_faces_weights_computes_its_hidden_states() -> None:
    theirs, ours = twins()
    ids, mask = batch()
    expected = theirs.bert(ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(ours.encoder(ids, attention_mask=mask), expected)


@pytest.mark.parametrize(
    "config",
    [
        PELTConfig(lora=GatedLoRAConfig()),
        PELTConfig(prefix=PrefixConfig(length=4, mlp_dim=16)),
        PELTConfig(prefix=PrefixConfig(length=4, mlp_dim=None, gate=False)),
        PELTConfig(bottleneck=BottleneckConfig(reduction=4)),
        PELTConfig(prompt=PromptConfig(length=3)),
        PELTConfig(prompt=PromptConfig(length=3, combine="prefix_after_bos")),
        unipelt(),
        unipelt(prompt=True, gates=False),
        unipelt(prompt=True, from_layer=1),
    ],
    ids=["lora", "prefix", "prefix-direct-ungated", "adapter", "prompt", "prompt-after-cls", "unipelt",
         "unipelt-prompt-ungated", "unipelt-prompt-from-1"],
)  # fmt: skip
def test_every_module_on_our_bert_equals_it_on_hugging_faces(config: PELTConfig) -> None:
    theirs, ours = twins()
    equip_(theirs, config)
    equip_(ours, config)  # LoRA finds each model's own names for W_q and W_v: query/value there, q/v here
    _randomize_and_copy(theirs, ours)
    ids, mask = batch()
    expected = theirs.bert(ids, attention_mask=mask).last_hidden_state
    if config.prompt is not None:  # Hugging Face's keeps the prompt's rows; ours returns the input's only
        expected = theirs.pelt_prompt.remove(expected)
    got = ours.encoder(ids, attention_mask=mask)
    assert got.shape == (2, 7, D)
    torch.testing.assert_close(got, expected)


def test_masks_with_prefix_and_prompt_hide_padding_from_our_mean_pooled_classifier() -> None:
    """Ungated (a gate averages over padding too), a padded sequence gives the logits of the unpadded one."""
    model = our_bert()
    config = PELTConfig(prefix=PrefixConfig(length=3, mlp_dim=8, gate=False), prompt=PromptConfig(length=2))
    equip_(model, config)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.normal_(0, 0.3)
    ids, mask = batch()
    padded = model(ids, attention_mask=mask)[1]
    alone = model(ids[1:, :4], attention_mask=mask[1:, :4])[0]
    torch.testing.assert_close(padded, alone)


def test_the_prompt_reaches_the_mlm_head_at_the_inputs_own_positions() -> None:
    torch.manual_seed(0)
    base = BertForMaskedLM(our_bert().encoder.config).eval()
    model = BertForMaskedLM(base.encoder.config).eval()
    model.load_state_dict(base.state_dict())
    equip_(model, PELTConfig(prompt=PromptConfig(length=4)))
    words = torch.tensor([9, 8, 7, 6])
    with torch.no_grad():
        model.pelt_prompt.weight.copy_(base.encoder.embeddings.word.weight[words])
    ids, _ = batch()
    chosen = torch.zeros(2, 7, dtype=torch.bool)
    chosen[:, [1, 5]] = True
    with torch.no_grad():
        got = model(ids, positions=chosen)  # (4, V): the head on the chosen input positions only
        full = torch.cat([words.expand(2, -1), ids], dim=1)  # the prompt's tokens put before the input
        expected = base(full, positions=torch.cat([torch.zeros(2, 4, dtype=torch.bool), chosen], dim=1))
    torch.testing.assert_close(got, expected)


def test_adapters_on_our_bert_train_the_head_and_leave_the_encoder_bit_identical() -> None:
    model = our_bert()
    frozen = {name: p.clone() for name, p in model.named_parameters() if name.startswith("encoder.")}
    head = model.classifier["fc2"].weight.clone()
    report = equip_(model, unipelt(prompt=True))
    assert report["other"] == D * D + D + D * CLASSES + CLASSES  # classifier fc1 and fc2: the task head
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids, mask = batch()
    for _ in range(3):
        F.cross_entropy(model(ids, attention_mask=mask), torch.tensor([0, 2])).backward()
        optimizer.step()
        optimizer.zero_grad()
    state = {name.replace(".inner.", ".").replace(".base.", "."): p for name, p in model.named_parameters()}
    assert all(torch.equal(state[name], value) for name, value in frozen.items())
    assert not torch.equal(model.classifier["fc2"].weight, head)


def test_unipelt_on_our_bert_counts_adapterhubs_formula() -> None:
    model = build_model("bert-small", task="classify", n_classes=5)
    counts = trainable_parameters(model)  # before: everything trains
    assert counts["trainable"] == counts["total"]
    counts = equip_(model, unipelt(prompt=True))
    d, layers, bottleneck = 192, 2, 192 // 16
    prefix = 10 * d + (d * 512 + 512) + (512 * layers * 2 * d + layers * 2 * d) + layers * (d + 1)
    adapter = layers * ((d * bottleneck + bottleneck) + (bottleneck * d + d) + (d + 1))
    lora = layers * 2 * (8 * d + d * 8 + (d + 1))
    assert (counts["prefix"], counts["bottleneck"], counts["lora"], counts["prompt"]) == (prefix, adapter, lora, 10 * d)


def test_save_then_load_onto_a_fresh_bert_gives_identical_logits(tmp_path) -> None:
    model = our_bert()
    equip_(model, unipelt(prompt=True))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.normal_(0, 0.1)
    save_adapters(model, tmp_path)
    fresh = our_bert()
    load_adapters(fresh, tmp_path)
    ids, mask = batch()
    torch.testing.assert_close(fresh(ids, attention_mask=mask), model(ids, attention_mask=mask), rtol=0, atol=0)


def test_bad_input_on_our_bert_is_a_one_line_error() -> None:
    with pytest.raises(ValueError, match=r"targets=\('query',\) match no nn.Linear") as error:
        equip_(our_bert(), PELTConfig(lora=GatedLoRAConfig(targets=("query",))))
    assert "allowed here:" in str(error.value) and "'q'" in str(error.value)
    with pytest.raises(ValueError, match=r"targets=None \(the first of \[\('query', 'value'\)"):
        equip_(nn.Sequential(nn.Linear(4, 4)), PELTConfig(lora=GatedLoRAConfig()))
    with pytest.raises(ValueError, match="prompt length=8 leaves no position"):
        equip_(our_bert(positions=8), PELTConfig(prompt=PromptConfig(length=8)))
    model = our_bert(positions=10)
    equip_(model, PELTConfig(prompt=PromptConfig(length=4)))
    with pytest.raises(ValueError, match=r"prompt length 4 \+ sequence length 7 exceeds the 10-position table") as e:
        model(torch.randint(5, VOCAB, (1, 7)))
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="train_pooler=True needs a base model with a pooler"):
        equip_(our_bert(), PELTConfig(prompt=PromptConfig(), train_pooler=True))
