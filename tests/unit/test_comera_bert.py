"""bert6 books under the ``comera`` method, BERT heads, CoMERA tensorization and truncation of a BERT, MLM masking."""

from __future__ import annotations

import pytest
import torch

from tensorslim.layers.tt import TTLinear
from tensorslim.layers.tt_embedding import TTEmbedding
from tensorslim.methods import build_for_method
from tensorslim.methods.comera import CoMERAObjective, build_optimizer, comera_, enable_gates, model_size, truncate_
from tensorslim.methods.comera.gates import tt_layers
from tensorslim.models.bert import (
    BERT_PRESETS,
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    get_bert_preset,
)
from tensorslim.tasks.mlm import mask_tokens, mlm_loss, padded_vocab


def _mlm(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, labels = batch
    return mlm_loss(model(inputs), labels)


def test_bert6_books_match_comera_counts():
    # Counted on the official CoMERA code (arXiv 2405.14377, §5's six-encoder model): 66,957,315 dense → 1,485,795
    # tensorized (45.1×), +4,362 rank gates.
    dense, _, _ = build_for_method("bert6", "dense", task="classify", device="meta")
    assert sum(p.numel() for p in dense.parameters()) == 66_957_315
    model, _, _ = build_for_method("bert6", "comera", task="classify", device="meta")
    assert sum(p.numel() for p in model.parameters()) == 1_485_795
    assert enable_gates(model) == 4_362  # what the trainer's CoMERA hook attaches
    assert sum(p.numel() for p in model.parameters()) == 1_485_795 + 4_362
    with torch.device("meta"):
        gated = BertForSequenceClassification(BERT_PRESETS["bert6"])
    comera_(gated)
    assert sum(p.numel() for p in gated.parameters()) == 1_485_795 + 4_362
    word = gated.encoder.embeddings.word
    assert isinstance(word, TTEmbedding) and word.row_factors == (16, 20, 10, 10) and word.ranks == (1, 32, 32, 32, 1)
    assert isinstance(gated.classifier["fc1"], TTLinear) and not isinstance(gated.classifier["fc2"], TTLinear)
    fc2 = gated.encoder.layers[0].ffn.fc2
    assert fc2.in_factors == (16, 16, 12) and fc2.out_factors == (8, 8, 12)


def test_attention_mask_hides_padding():
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, d_ff=32)).eval()
    ids = torch.tensor([[1, 2, 3, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0, 0]])
    changed = ids.clone()
    changed[0, 3:] = 7  # different padding tokens must not change the output
    torch.testing.assert_close(model(ids, attention_mask=mask), model(changed, attention_mask=mask))


def test_comera_bert_tiny_trains_and_truncates():
    torch.manual_seed(0)
    config = get_bert_preset("bert-tiny")
    model = BertForMaskedLM(BertConfig(**{**config.__dict__, "vocab_size": padded_vocab(1000)}))
    comera_(model)
    assert all(len(layer.gates) for _, layer in tt_layers(model))
    names = {name for name, _ in tt_layers(model)}
    assert {"lm_head", "transform", "encoder.embeddings.word", "encoder.layers.1.ffn.fc2"} <= names
    optimizer = build_optimizer(model)
    objective = CoMERAObjective()
    gen = torch.Generator().manual_seed(0)
    batch = mask_tokens(torch.randint(999, (2, 16), generator=gen), mask_id=999, vocab=999, generator=gen)
    for _ in range(2):
        loss, _ = objective.early(_mlm(model, batch), model)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    q = model.encoder.layers[0].attn.q
    rank = q.ranks[3]
    with torch.no_grad():
        q.gates[2][:3] = 0.0  # bond 3 loses three ranks
    before, size = model(batch[0]), float(model_size(model))
    truncate_(model, optimizer=optimizer)
    assert q.ranks[3] == rank - 3 and float(model_size(model)) == size
    torch.testing.assert_close(model(batch[0]), before)


def test_mask_tokens_follows_bert_recipe():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, (64, 64), generator=gen)
    inputs, labels = mask_tokens(ids, mask_id=100, vocab=100, generator=gen)
    chosen = labels != -100
    assert 0.12 < chosen.float().mean() < 0.18
    assert torch.equal(labels[chosen], ids[chosen])
    assert torch.equal(inputs[~chosen], ids[~chosen])
    assert 0.7 < (inputs[chosen] == 100).float().mean() < 0.9


def test_mean_pooling_averages_unmasked_tokens():
    config = BertConfig(**{**get_bert_preset("bert-tiny").__dict__, "pooling": "mean", "dropout": 0.0})
    torch.manual_seed(0)
    model = BertForSequenceClassification(config).eval()
    ids = torch.randint(config.vocab_size, (2, 7))
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    hidden = model.encoder(ids, attention_mask=mask)
    pooled = torch.stack([hidden[0].mean(0), hidden[1, :4].mean(0)])  # padding rows left out by hand
    expected = model.classifier["fc2"](torch.tanh(model.classifier["fc1"](pooled)))
    torch.testing.assert_close(model(ids, attention_mask=mask), expected)
    # the padded positions do not change the prediction
    changed = ids.clone()
    changed[1, 4:] = (ids[1, 4:] + 1) % config.vocab_size
    torch.testing.assert_close(model(changed, attention_mask=mask)[1], expected[1])


@pytest.mark.parametrize(
    "kwargs", [{"d_model": 10, "n_heads": 3}, {"dropout": 1.0}, {"n_layers": 0}, {"pooling": "max"}]
)
def test_bert_config_bad_input(kwargs):
    with pytest.raises(ValueError) as info:
        BertConfig(**kwargs)
    assert "\n" not in str(info.value)
