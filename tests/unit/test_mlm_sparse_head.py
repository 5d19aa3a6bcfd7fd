"""The MLM head on the labelled positions only gives the loss and gradients of the full-logits loss."""

from __future__ import annotations

import torch

from tensorslim.models.bert import BERT_PRESETS, BertForMaskedLM
from tensorslim.tasks.mlm import MaskedLM, mask_tokens, mlm_loss


def test_sparse_prediction_equals_full_logits_loss_and_grads():
    torch.manual_seed(0)
    model = BertForMaskedLM(BERT_PRESETS["bert-tiny"]).eval()  # eval: no dropout, so both passes see the same network
    ids = torch.randint(0, 999, (3, 16), generator=torch.Generator().manual_seed(1))
    inputs, labels = mask_tokens(ids, mask_id=999, vocab=999, generator=torch.Generator().manual_seed(2))
    assert 0 < int((labels != -100).sum()) < labels.numel()
    params = list(model.parameters())
    sparse = MaskedLM().loss(model, (inputs, labels))
    sparse_grads = torch.autograd.grad(sparse, params)
    full = mlm_loss(model(inputs), labels)  # independent: every position's logits, ignore_index=-100
    full_grads = torch.autograd.grad(full, params)
    torch.testing.assert_close(sparse, full)
    for a, b in zip(sparse_grads, full_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    chosen = labels != -100
    assert model(inputs, positions=chosen).shape == (int(chosen.sum()), 1000)
