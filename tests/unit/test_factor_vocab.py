"""The factored vocabulary (``--factor-vocab``, ``--factor-embedding``): a low-rank LM head, and optionally a low-rank
token embedding, on our LLaMA, checked against the dense model, gradcheck, the FLOP counter and a save/load round
trip."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tensorslim
from tensorslim.books import count_params, flops_per_token
from tensorslim.functional.cross_entropy import linear_cross_entropy
from tensorslim.layers.lowrank import LowRankLinear
from tensorslim.layers.lowrank_embedding import LowRankEmbedding
from tensorslim.methods import build_for_method
from tensorslim.methods.vocab import factor_vocabulary_, plan_vocabulary
from tensorslim.models.llama import LlamaConfig, LlamaForCausalLM
from tensorslim.tasks.lm import fused_head, lm_loss
from tensorslim.train.config import TrainConfig

CONFIG = LlamaConfig(d_model=16, n_layers=1, n_heads=2, d_ff=24, vocab_size=40, max_seq_len=8)


def _dense(dtype: torch.dtype = torch.float64) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(CONFIG).to(dtype)


def _ids() -> torch.Tensor:
    return torch.randint(0, CONFIG.vocab_size, (2, 6), generator=torch.Generator().manual_seed(1))


def _reference_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of full ``(B, T, V)`` logits, in their dtype."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


@pytest.mark.parametrize("embedding", [False, True])
def test_full_rank_factorization_equals_the_dense_model(embedding: bool) -> None:
    dense = _dense()
    factored = copy.deepcopy(dense)
    factor_vocabulary_(factored, CONFIG.d_model, embedding=embedding, init="svd")
    assert isinstance(factored.lm_head, LowRankLinear)
    assert isinstance(factored.embed_tokens, LowRankEmbedding if embedding else nn.Embedding)
    ids = _ids()
    torch.testing.assert_close(factored(ids), dense(ids), rtol=1e-10, atol=1e-10)
    # The LM task's fused loss over the factored head equals the dense logits' cross-entropy.
    assert fused_head(factored) is factored.lm_head
    torch.testing.assert_close(lm_loss(factored, ids), _reference_loss(dense(ids), ids), rtol=1e-10, atol=1e-10)


def test_fused_factored_loss_gradients_equal_the_logits_path() -> None:
    model = _dense()
    factor_vocabulary_(model, 5, embedding=True, init="random")
    ids = _ids()
    fused = torch.autograd.grad(lm_loss(model, ids), list(model.parameters()))
    plain = torch.autograd.grad(_reference_loss(model(ids), ids), list(model.parameters()))
    for a, b in zip(fused, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_gradcheck_of_the_factored_head_and_loss() -> None:
    generator = torch.Generator().manual_seed(2)
    hidden = torch.randn(5, 6, dtype=torch.float64, generator=generator, requires_grad=True)
    weight_a = torch.randn(3, 6, dtype=torch.float64, generator=generator, requires_grad=True)
    weight_b = torch.randn(11, 3, dtype=torch.float64, generator=generator, requires_grad=True)
    targets = torch.tensor([0, 4, -100, 10, 2])

    def loss(h: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return linear_cross_entropy(F.linear(h, a), b, targets, chunk_size=2)

    assert torch.autograd.gradcheck(loss, (hidden, weight_a, weight_b))


def test_head_only_plan_and_books_leave_the_embedding_dense() -> None:
    rank, d, vocab, seq = 4, CONFIG.d_model, CONFIG.vocab_size, 6
    model = _dense(torch.float32)
    dense_params, dense_flops = count_params(model), flops_per_token(model, seq_len=seq)
    (head_plan,) = plan_vocabulary(model, rank)
    assert [layer.name for layer in head_plan.layers] == ["lm_head"]
    assert head_plan.layers[0].params_after == rank * (d + vocab)
    embedding = model.embed_tokens
    factor_vocabulary_(model, rank, init="random")
    assert model.embed_tokens is embedding
    assert dense_params.total - count_params(model).total == vocab * d - rank * (vocab + d)
    # Per token the head drops from 2·V·d to 2·r·(d + V); nothing else changes.
    assert flops_per_token(model, seq_len=seq) == dense_flops - 2 * vocab * d + 2 * rank * (d + vocab)


def test_plan_and_flops_books_with_the_embedding_are_exact() -> None:
    rank, d, vocab, seq = 4, CONFIG.d_model, CONFIG.vocab_size, 6
    model = _dense(torch.float32)
    dense_params, dense_flops = count_params(model), flops_per_token(model, seq_len=seq)
    head_plan, table_plan = plan_vocabulary(model, rank, embedding=True)
    assert isinstance(model.lm_head, nn.Linear)  # plan changes nothing
    assert [layer.name for layer in head_plan.layers] == ["lm_head"]
    assert [layer.name for layer in table_plan.layers] == ["embed_tokens"]
    assert head_plan.layers[0].params_after == rank * (d + vocab)
    assert table_plan.layers[0].params_after == rank * (vocab + d)
    factor_vocabulary_(model, rank, embedding=True, init="random")
    params = count_params(model)
    saved = 2 * vocab * d - 2 * rank * (vocab + d)
    assert dense_params.total - params.total == saved
    assert params.non_embedding == dense_params.non_embedding  # both factored layers count as embedding
    # Per token: the head drops from 2·V·d to 2·r·(d + V); the embedding adds the projection's 2·r·d.
    expected = dense_flops - 2 * vocab * d + 2 * rank * (d + vocab) + 2 * rank * d
    assert flops_per_token(model, seq_len=seq) == expected
    assert model.lm_head.flops(seq) + model.embed_tokens.flops(seq) == seq * (expected - dense_flops + 2 * vocab * d)


@pytest.mark.parametrize("embedding", [False, True])
def test_save_load_round_trip(tmp_path: Path, embedding: bool) -> None:
    model, _, _ = build_for_method(
        "tiny", "cola", factor_vocab=8, factor_embedding=embedding, vocab_size=64, max_seq_len=16
    )
    ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(3))
    model.eval()
    tensorslim.save_pretrained(model, tmp_path / "saved", base="tiny")
    loaded = tensorslim.load_pretrained(tmp_path / "saved")
    assert isinstance(loaded.lm_head, LowRankLinear)
    assert isinstance(loaded.embed_tokens, LowRankEmbedding if embedding else nn.Embedding)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model(ids), rtol=0, atol=0)


def test_a_fresh_model_starts_from_the_truncated_svd_of_the_dense_init() -> None:
    """Training from scratch, the factored head is the best rank-r approximation of the dense head it replaces (its
    random init), not CoLA's much smaller random init, and no warning about lossy conversion is raised."""
    sizes = {"vocab_size": 64, "max_seq_len": 16}
    torch.manual_seed(4)
    dense, _, _ = build_for_method("tiny", "cola", **sizes)
    torch.manual_seed(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        factored, _, _ = build_for_method("tiny", "cola", factor_vocab=8, **sizes)
    u, s, vh = torch.linalg.svd(dense.lm_head.weight.double(), full_matrices=False)
    best = (u[:, :8] * s[:8]) @ vh[:8]  # Eckart–Young
    product = factored.lm_head.weight_b.double() @ factored.lm_head.weight_a.double()
    torch.testing.assert_close(product, best, rtol=1e-5, atol=1e-6)
    assert torch.equal(factored.embed_tokens.weight, dense.embed_tokens.weight)  # the table stays as it was


def test_refused_requests_change_nothing() -> None:
    model = _dense()
    before = {name: p.clone() for name, p in model.state_dict().items()}
    with pytest.raises(ValueError, match="factor_vocab=17 is out of range; allowed 1..16"):
        factor_vocabulary_(model, 17, embedding=True)
    with pytest.raises(ValueError, match="factor_vocab=0 is invalid"):
        factor_vocabulary_(model, 0)
    with pytest.raises(TypeError, match="embedding='yes' is invalid; allowed: True or False"):
        factor_vocabulary_(model, 4, embedding="yes")
    assert isinstance(model.lm_head, nn.Linear) and isinstance(model.embed_tokens, nn.Embedding)
    assert all(torch.equal(before[name], p) for name, p in model.state_dict().items())
    factor_vocabulary_(model, 4, init="random")
    with pytest.raises(ValueError, match="already converted"):
        factor_vocabulary_(model, 4)
    with pytest.raises(ValueError, match="factor_vocab=-1 is invalid; allowed: an integer >= 0"):
        TrainConfig(factor_vocab=-1)
    with pytest.raises(ValueError, match="factor_embedding=True needs factor_vocab > 0"):
        TrainConfig(factor_embedding=True)
    with pytest.raises(ValueError, match="factor_embedding=True needs factor_vocab > 0"):
        build_for_method("tiny", "cola", factor_embedding=True, device="meta")
