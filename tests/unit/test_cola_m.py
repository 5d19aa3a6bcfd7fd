"""CoLA-M (latent checkpointing): same numbers as CoLA, the saved-tensor formula, interchangeable weights."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.convert import convert_
from tensorslim.layers.cola_m import CoLAMConfig, CoLAMLinear, checkpoint_, find_blocks, uncheckpoint_
from tensorslim.layers.lowrank import CoLAConfig, LowRankConfig, LowRankLinear, SVDConfig
from tensorslim.models.llama import LlamaConfig, LlamaForCausalLM
from tensorslim.train.memory import count_saved_tensors

TINY = LlamaConfig(d_model=64, n_layers=2, n_heads=4, d_ff=172, vocab_size=256, max_seq_len=64)
FOUR_BLOCKS = LlamaConfig(d_model=256, n_layers=4, n_heads=4, d_ff=688, vocab_size=4096, max_seq_len=256)
RANK = 16


def causal_lm_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy (any loss through the whole model would do for these checks)."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def _cola(config: LlamaConfig = TINY, *, dtype: torch.dtype = torch.float64, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(dtype)
    convert_(model, CoLAConfig(rank=RANK, init="random"))
    return model


def _loss_and_grads(model: nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = causal_lm_loss(model(ids), ids)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def _saved_bytes(model: nn.Module, ids: torch.Tensor) -> int:
    with count_saved_tensors(model) as tally:
        loss = causal_lm_loss(model(ids), ids)
    loss.backward()
    return tally.bytes


@pytest.mark.parametrize("policy", ["latent", "layer"])
def test_same_loss_and_gradients_as_cola_float64(policy: str) -> None:
    cola = _cola()
    cola_m = copy.deepcopy(cola)
    assert checkpoint_(cola_m, policy=policy) == ["layers.0", "layers.1"]
    ids = torch.randint(0, TINY.vocab_size, (3, 20), generator=torch.Generator().manual_seed(1))
    loss, grads = _loss_and_grads(cola, ids)
    loss_m, grads_m = _loss_and_grads(cola_m, ids)
    torch.testing.assert_close(loss_m, loss, rtol=1e-12, atol=1e-12)
    assert grads_m.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grads_m[name], grad, rtol=1e-10, atol=1e-12, msg=name)


def test_gradients_via_autograd_grad_and_input_grads() -> None:
    """Parameters are explicit inputs of the block function, so ``torch.autograd.grad`` works (unlike reentrant
    checkpointing) and gradients reach a block input that requires grad."""
    cola = _cola()
    cola_m = copy.deepcopy(cola)
    checkpoint_(cola_m)
    x = torch.randn(2, 9, TINY.d_model, dtype=torch.float64, requires_grad=True)
    cos, sin = torch.randn(9, TINY.head_dim, dtype=torch.float64), torch.randn(9, TINY.head_dim, dtype=torch.float64)
    params = list(cola.layers[1].parameters())
    expected = torch.autograd.grad(cola.layers[1](x, cos, sin).square().sum(), [x, *params])
    got = torch.autograd.grad(cola_m.layers[1](x, cos, sin).square().sum(), [x, *cola_m.layers[1].parameters()])
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_saved_bytes_per_layer_equal_d_plus_7r() -> None:
    """One more CoLA-M block saves exactly ``(d + 7r) · tokens · bytes``: its residual input and the seven
    pre-activation latents (the paper's ``2d + 7r`` also keeps the mid-block residual, which we recompute)."""
    batch, seq = 2, 16
    ids = torch.randint(0, TINY.vocab_size, (batch, seq))
    saved = {}
    for n_layers in (2, 3):
        model = _cola(LlamaConfig(**{**TINY.__dict__, "n_layers": n_layers}), dtype=torch.float32)
        checkpoint_(model)
        saved[n_layers] = _saved_bytes(model, ids)
    assert saved[3] - saved[2] == (TINY.d_model + 7 * RANK) * batch * seq * 4


def test_saved_bytes_of_one_block_are_inputs_plus_latents() -> None:
    model = _cola(dtype=torch.float32)
    checkpoint_(model)
    batch, seq, d = 2, 10, TINY.d_model
    x = torch.randn(batch, seq, d, requires_grad=True)
    cos, sin = torch.randn(seq, TINY.head_dim), torch.randn(seq, TINY.head_dim)
    with count_saved_tensors(model) as tally:
        out = model.layers[0](x, cos, sin)
    out.sum().backward()
    rope_tables = 2 * seq * TINY.head_dim * 4  # shared by all blocks: saved once per model
    assert tally.bytes == (d + 7 * RANK) * batch * seq * 4 + rope_tables


def test_whole_layer_policy_saves_only_the_block_input() -> None:
    batch, seq = 2, 16
    ids = torch.randint(0, TINY.vocab_size, (batch, seq))
    saved = {}
    for n_layers in (2, 3):
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**{**TINY.__dict__, "n_layers": n_layers}))
        checkpoint_(model, policy="layer")  # works on a dense model too
        saved[n_layers] = _saved_bytes(model, ids)
    assert saved[3] - saved[2] == TINY.d_model * batch * seq * 4


def test_cola_m_saves_less_than_cola() -> None:
    ids = torch.randint(0, TINY.vocab_size, (2, 32))
    cola = _cola(dtype=torch.float32)
    cola_m = copy.deepcopy(cola)
    checkpoint_(cola_m)
    assert _saved_bytes(cola_m, ids) < 0.5 * _saved_bytes(cola, ids)


def test_state_dicts_are_interchangeable_with_cola() -> None:
    cola = _cola()
    torch.manual_seed(5)
    cola_m = LlamaForCausalLM(TINY).double()
    convert_(cola_m, CoLAMConfig(rank=RANK, init="random"))
    assert isinstance(cola_m.layers[0].mlp.down_proj, CoLAMLinear)
    assert cola_m.state_dict().keys() == cola.state_dict().keys()
    cola_m.load_state_dict(cola.state_dict(), strict=True)
    ids = torch.randint(0, TINY.vocab_size, (2, 8))
    torch.testing.assert_close(cola_m(ids), cola(ids), rtol=0, atol=0)
    cola.load_state_dict(cola_m.state_dict(), strict=True)


def _meta_llama(config: LowRankConfig) -> LlamaForCausalLM:
    with torch.device("meta"):
        model = LlamaForCausalLM(FOUR_BLOCKS)
    convert_(model, config)
    return model


def test_convert_with_cola_m_config_checkpoints_every_block() -> None:
    model = _meta_llama(CoLAMConfig(rank=64, init="random", only_lr_act=True))
    assert sum(isinstance(m, CoLAMLinear) for m in model.modules()) == 7 * 4
    assert all(type(b).__name__ == "CheckpointedBlock" for _, b in find_blocks(model))
    assert all(isinstance(b.mlp.act_fn, nn.Identity) for _, b in find_blocks(model))  # CoLA's only_lr_act


def test_eval_and_no_grad_bypass_the_checkpoint() -> None:
    model = _cola(dtype=torch.float32)
    reference = copy.deepcopy(model)
    checkpoint_(model)
    ids = torch.randint(0, TINY.vocab_size, (2, 8))
    with torch.no_grad(), count_saved_tensors(model) as tally:
        torch.testing.assert_close(model(ids), reference(ids))
    assert tally.bytes == 0


def test_uncheckpoint_restores_the_classes() -> None:
    model = _cola()
    checkpoint_(model)
    uncheckpoint_(model)
    assert all(type(b).__name__ == "Block" for _, b in find_blocks(model))
    assert isinstance(model.layers[0].self_attn.q_proj, LowRankLinear)


def test_svd_layers_and_bf16_autocast() -> None:
    """Identity-activation layers work too; under bf16 autocast the replayed latents keep their dtype."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(TINY)
    convert_(model, SVDConfig(rank=RANK, init="random"))
    cola_m = copy.deepcopy(model)
    checkpoint_(cola_m)
    ids = torch.randint(0, TINY.vocab_size, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, grads = _loss_and_grads(model, ids)
        loss_m, grads_m = _loss_and_grads(cola_m, ids)
    torch.testing.assert_close(loss_m, loss)
    for name, grad in grads.items():  # the replay runs the forward's own bf16 products again
        torch.testing.assert_close(grads_m[name], grad, rtol=0, atol=0, msg=name)


def test_hugging_face_llama_with_dropout_matches() -> None:
    """Any converted model: a Hugging Face LLaMA with attention dropout (RNG state is replayed in backward)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        attention_dropout=0.3,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).double().train()
    convert_(model, CoLAConfig(rank=8, init="random"))
    cola_m = copy.deepcopy(model)
    assert checkpoint_(cola_m) == ["model.layers.0", "model.layers.1"]
    ids = torch.randint(0, 128, (2, 10))
    results = []
    for m in (model, cola_m):
        torch.manual_seed(7)
        m.zero_grad()
        loss = m(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in m.parameters()]))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-12, atol=1e-12)
    for a, b in zip(results[1][1], results[0][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="policy='chunk' is unknown"):
        CoLAMConfig(policy="chunk")
    with pytest.raises(ValueError, match="policy='chunk' is unknown"):
        checkpoint_(_cola(), policy="chunk")
    with pytest.raises(ValueError, match="needs low-rank layers"):
        checkpoint_(LlamaForCausalLM(TINY))
    with pytest.raises(ValueError, match="no nn.ModuleList"):
        checkpoint_(nn.Linear(4, 4), policy="layer")


def test_flop_counter_with_backward_counts_the_recompute() -> None:
    """``tensorslim bench`` counts train FLOPs with FlopCounterMode around backward (its module hooks must not
    break the recompute); CoLA-M's count is CoLA's plus the recomputed part, but not a full second forward."""
    from tensorslim.books import flops_per_token

    cola = _meta_llama(CoLAConfig(rank=64, init="random"))
    cola_m = _meta_llama(CoLAMConfig(rank=64, init="random"))
    train, train_m = (flops_per_token(m, seq_len=32, backward=True) for m in (cola, cola_m))
    forward = flops_per_token(cola, seq_len=32)
    assert flops_per_token(cola_m, seq_len=32) == forward
    assert train < train_m < train + forward
