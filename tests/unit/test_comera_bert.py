"""bert6 preset books, heads, CoMERA tensorization of the encoder, and the experiment's helpers."""

from __future__ import annotations

import pytest
import torch

from tensorslim.comera import CoMERAObjective, build_optimizer, model_size, truncate_
from tensorslim.comera.gates import tt_layers
from tensorslim.comera_experiment import mask_tokens, mlm_loss, padded_vocab
from tensorslim.layers.tt import TTLinear
from tensorslim.layers.tt_embedding import TTEmbedding
from tensorslim.models.bert import (
    BERT_PRESETS,
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    comera_,
    get_bert_preset,
)


def test_bert6_books_match_comera_counts():
    # Digest §1.4 (counted on the official code): 66,957,315 dense → 1,485,795 tensorized (45.1×), +4,362 gates.
    with torch.device("meta"):
        model = BertForSequenceClassification(BERT_PRESETS["bert6"])
    assert sum(p.numel() for p in model.parameters()) == 66_957_315
    comera_(model, rank_gates=False)
    assert sum(p.numel() for p in model.parameters()) == 1_485_795
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
    model = BertForMaskedLM(BertConfig(**{**config.__dict__, "vocab_size": padded_vocab(999)}))
    comera_(model)
    assert all(len(layer.gates) for _, layer in tt_layers(model))
    names = {name for name, _ in tt_layers(model)}
    assert {"lm_head", "transform", "encoder.embeddings.word", "encoder.layers.1.ffn.fc2"} <= names
    optimizer = build_optimizer(model)
    objective = CoMERAObjective()
    gen = torch.Generator().manual_seed(0)
    batch = mask_tokens(torch.randint(999, (2, 16), generator=gen), mask_id=999, vocab=999, generator=gen)
    for _ in range(2):
        loss, _ = objective.early(mlm_loss(model, batch), model)
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


def test_experiment_dense_loop_equals_a_plain_loop():
    """The experiment's dense runs go through the static-shape step; it must train exactly like a plain loop."""
    from tensorslim.comera_experiment import _train_plain, build, optimizer_for

    gen = torch.Generator().manual_seed(0)
    data = [
        mask_tokens(torch.randint(90, (2, 16), generator=gen), mask_id=90, vocab=90, generator=gen) for _ in range(3)
    ]
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(build("bert-tiny", "dense", vocab_size=96))
    static_model, plain_model = models
    torch.manual_seed(1)
    opt = optimizer_for(static_model, "dense", lr=1e-3, lr_cores=1e-3, lr_gates=1e-2)
    static_losses = _train_plain(static_model, opt, iter(data), mlm_loss, steps=3)
    torch.manual_seed(1)  # the same dropout masks
    opt = optimizer_for(plain_model, "dense", lr=1e-3, lr_cores=1e-3, lr_gates=1e-2)
    plain_losses = []
    for batch in data:
        loss = mlm_loss(plain_model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        plain_losses.append(loss.item())
    assert static_losses == plain_losses
    for a, b in zip(static_model.parameters(), plain_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_experiment_capturable_optimizers():
    from tensorslim.comera_experiment import build, optimizer_for

    model = build("bert-tiny", "comera", vocab_size=96)
    groups = optimizer_for(model, "comera", lr=1e-3, lr_cores=1e-3, lr_gates=1e-2, capturable=True).param_groups
    assert [g["capturable"] for g in groups] == [True] * 3
    with pytest.raises(ValueError, match="galore"):
        optimizer_for(model, "galore", lr=1e-3, lr_cores=1e-3, lr_gates=1e-2, capturable=True)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(
            ["--cuda-graphs", "--parts", "mlm", "--mlm-methods", "dense,comera"],
            "needs a CUDA device",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of CPU-only machines"),
        ),
        (["--cuda-graphs", "--parts", "mlm"], "cannot capture GaLore"),
        (["--pooling", "max"], "invalid choice"),
        (["--parts", "mlm", "--mlm-methods", "comera"], "needs L*"),
        (["--parts", "classify", "--classify-methods", "comera,dense", "--classify-ratios", "0.5"], "needs L*"),
        (["--parts", "classify", "--classify-methods", "dense,lora"], "--classify-methods 'dense,lora' is invalid"),
        (["--parts", "mlm,train"], "unknown parts ['train']"),
    ],
)
def test_experiment_cli_refuses_bad_flags(argv, message, capsys):
    from tensorslim.comera_experiment import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err
