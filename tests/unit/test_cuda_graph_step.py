"""The static-shape training step (CoMERA's CUDA-graph path, arXiv 2405.14377 §4) run eagerly on CPU: it equals plain
steps, its warm-up is undone in place, CoMERA's late stage with the sync-free gate freeze runs through it, and it has
no host sync."""

from __future__ import annotations

import collections
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from tensorslim.convert import convert_
from tensorslim.layers.tt import TTConfig
from tensorslim.layers.tt_embedding import TTEmbeddingConfig
from tensorslim.methods.comera import CoMERAConfig, CoMERAObjective, build_optimizer, comera_, model_size, param_groups
from tensorslim.methods.comera.static import GateFreeze, stage_loss, static_lookups
from tensorslim.models.bert import BertConfig, BertForMaskedLM, get_bert_preset
from tensorslim.tasks.mlm import mask_tokens, mlm_loss, padded_vocab
from tensorslim.train.execution import GraphedStep

EXACT = {"rtol": 0.0, "atol": 0.0}
# Ops that read a device value on the host (.item(), float(), bool(), .tolist() reach _local_scalar_dense) or whose
# output shape depends on the data: neither can be captured in a CUDA graph.
SYNCING = {
    "_local_scalar_dense",
    "nonzero",
    "masked_select",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "unique_dim_consecutive",
    "bincount",
    "equal",
    "repeat_interleave",
}


class _Net(nn.Module):
    """Parameters, running-stat buffers (BatchNorm) and dropout: everything a warm-up can disturb."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.norm, self.drop, self.fc2 = nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Dropout(0.3), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.norm(self.fc1(x)))))


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    x, y = batch
    loss = F.cross_entropy(model(x), y)
    return loss, {"loss": loss.detach()}


def _squared(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    x, _ = batch
    loss = model(x).square().mean()
    return loss, {"loss": loss.detach()}


def _batches(n: int, *, seed: int = 1, rows: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(rows, 6, generator=gen), torch.randint(3, (rows,), generator=gen)) for _ in range(n)]


def _pair(**adam) -> tuple[nn.Module, torch.optim.Optimizer, nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = _Net()
    twin = copy.deepcopy(model)
    return model, torch.optim.AdamW(model.parameters(), **adam), twin, torch.optim.AdamW(twin.parameters(), **adam)


def _plain_steps(model, optimizer, batches, loss_fn=_loss) -> list[float]:
    """The reference: a textbook PyTorch training loop."""
    losses = []
    for batch in batches:
        loss, _ = loss_fn(model, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _assert_same_training_state(model_a, opt_a, model_b, opt_b) -> None:
    torch.testing.assert_close(model_a.state_dict(), model_b.state_dict(), **EXACT)
    state_a, state_b = opt_a.state_dict()["state"], opt_b.state_dict()["state"]
    assert state_a.keys() == state_b.keys() and state_a
    torch.testing.assert_close(state_a, state_b, **EXACT)


def _addresses(tensors: list[torch.Tensor]) -> list[tuple[int, int]]:
    """Object and storage address of each tensor: what a captured graph reads and writes."""
    return [(id(t), t.data_ptr()) for t in tensors]


def _run(step: GraphedStep, batches) -> list[float]:
    return [float(step(batch)["loss"]) for batch in batches]


# ------------------------------------------------------------------------------------------------- (a) plain steps


def test_static_steps_equal_plain_steps():
    model, opt, twin, twin_opt = _pair(lr=1e-2)
    batches = _batches(5)
    torch.manual_seed(7)
    static = _run(GraphedStep(model, opt, _loss, warmup=0), batches)
    torch.manual_seed(7)
    plain = _plain_steps(twin, twin_opt, batches)
    assert static == plain
    _assert_same_training_state(model, opt, twin, twin_opt)


def test_the_step_reads_a_copy_of_each_batch_in_fixed_buffers():
    model, opt, *_ = _pair()
    step = GraphedStep(model, opt, _loss, warmup=0)
    first, second = _batches(2)
    step(first)
    buffers = step.batch
    step(second)
    assert step.batch is buffers and all(b is not s for b, s in zip(buffers, second, strict=True))
    torch.testing.assert_close(step.batch, second, **EXACT)


# -------------------------------------------------------------------------------------------- (b) warm-up undone


@pytest.mark.parametrize("trained_before", [False, True], ids=["fresh-optimizer", "optimizer-with-state"])
def test_warmup_is_undone_in_place(trained_before):
    model, opt, twin, twin_opt = _pair(lr=1e-2, amsgrad=True)
    if trained_before:  # the recapture case: moments and step already exist and must be copied back
        torch.manual_seed(3)
        _plain_steps(model, opt, _batches(2, seed=5))
        torch.manual_seed(3)
        _plain_steps(twin, twin_opt, _batches(2, seed=5))
    addresses_before = _addresses([*model.parameters(), *model.buffers()])
    calls = torch.zeros((), dtype=torch.long)
    seen = []  # addresses at every update, warm-up included: a graph captured at any of them must stay valid

    def counting_update() -> None:
        opt.step()
        calls.add_(1)
        seen.append(
            _addresses([*model.parameters(), *model.buffers(), *(v for s in opt.state.values() for v in s.values())])
        )

    step = GraphedStep(model, opt, _loss, warmup=3, update=counting_update, extra_state=(calls,))
    batches = _batches(4)
    torch.manual_seed(7)
    losses = _run(step, batches)
    torch.manual_seed(7)
    plain = _plain_steps(twin, twin_opt, batches)

    assert losses == plain
    _assert_same_training_state(model, opt, twin, twin_opt)
    assert int(calls) == 4  # 3 warm-up + 4 real updates ran (see `seen` below); the warm-up's were undone
    expected_step = 4 + 2 * trained_before
    assert all(float(s["step"]) == expected_step for s in opt.state.values())
    # In place: a graph holds these addresses, so no tensor may be swapped after the warm-up.
    assert _addresses([*model.parameters(), *model.buffers()]) == addresses_before
    assert len(seen) == 3 + 4 and all(addresses == seen[0] for addresses in seen)


def test_warmup_alone_leaves_no_trace():
    """Warm-up then restore, before any real step: parameters, buffers and the lazily created Adam state
    (step, exp_avg, exp_avg_sq, max_exp_avg_sq) are back to their fresh values, and the RNG is where it was."""
    model, opt, twin, _ = _pair(lr=1e-1, amsgrad=True)
    step = GraphedStep(model, opt, _loss, warmup=2)
    torch.manual_seed(11)
    step._load(_batches(1)[0])
    step._prepare()  # what the first call does before its real step
    after = torch.rand(3)
    torch.manual_seed(11)
    assert torch.equal(after, torch.rand(3))
    torch.testing.assert_close(model.state_dict(), twin.state_dict(), **EXACT)
    assert len(opt.state) == len(list(model.parameters()))
    for state in opt.state.values():
        assert set(state) == {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}
        assert all(not value.any() for value in state.values())


def test_recapture_switches_the_loss_like_a_plain_loop():
    model, opt, twin, twin_opt = _pair(lr=1e-2)
    batches = _batches(6)
    step = GraphedStep(model, opt, _loss, warmup=2)
    torch.manual_seed(7)
    losses = _run(step, batches[:3])
    step.recapture(loss_fn=_squared)
    losses += _run(step, batches[3:])
    torch.manual_seed(7)
    plain = _plain_steps(twin, twin_opt, batches[:3]) + _plain_steps(twin, twin_opt, batches[3:], _squared)
    assert losses == plain
    _assert_same_training_state(model, opt, twin, twin_opt)


def test_replaced_parameters_need_a_recapture():
    model, opt, *_ = _pair()
    step = GraphedStep(model, opt, _loss, warmup=1)
    batch = _batches(1)[0]
    step(batch)
    model.fc2.bias = nn.Parameter(torch.zeros(3))
    with pytest.raises(RuntimeError, match="replaced since the step was prepared; call recapture"):
        step(batch)
    step.recapture()
    step(batch)


# ------------------------------------------------------------------------------------------------ (e) bad input


def test_a_batch_of_another_shape_or_dtype_is_refused():
    model, opt, *_ = _pair()
    step = GraphedStep(model, opt, _loss, warmup=0)
    x, y = _batches(1)[0]
    step((x, y))
    with pytest.raises(
        ValueError, match=r"expected \[\(4, 6\) float32, \(4,\) int64\], got \[\(3, 6\) float32, \(3,\) int64\]"
    ):
        step((x[:3], y[:3]))
    with pytest.raises(ValueError, match=r"got \[\(4, 6\) float64, \(4,\) int64\]"):
        step((x.double(), y))
    with pytest.raises(ValueError, match=r"got \[\(4, 6\) float32\]"):
        step(x)
    with pytest.raises(ValueError, match="a batch must be a tensor or a tuple of tensors, got dict"):
        step({"x": x})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_capture_without_cuda_is_refused():
    model, opt, *_ = _pair(lr=1e-3)
    with pytest.raises(ValueError, match=r"needs a CUDA device, but torch.cuda.is_available\(\) is False"):
        GraphedStep(model, opt, _loss, capture=True)


def test_bad_warmup_and_optimizer_are_refused():
    model, _, *_ = _pair()
    with pytest.raises(ValueError, match="warmup=-1 is invalid"):
        GraphedStep(model, torch.optim.AdamW(model.parameters()), _loss, warmup=-1)
    with pytest.raises(ValueError, match="warmup=2 needs torch.optim.Adam or AdamW.*got SGD"):
        GraphedStep(model, torch.optim.SGD(model.parameters(), lr=0.1), _loss, warmup=2)
    GraphedStep(model, torch.optim.SGD(model.parameters(), lr=0.1), _loss, warmup=0)  # no warm-up, any optimizer


# ------------------------------------------------------------------------------------- (d) no host sync inside


class _OpRecorder(TorchDispatchMode):
    """Counts every aten op that reaches the dispatcher, backward and optimizer kernels included."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _ops_of_one_step(step: GraphedStep, batch) -> collections.Counter[str]:
    step(batch)  # prepares (warm-up, restore) outside the recorded region, as the capture is
    with _OpRecorder() as recorder:
        step(batch)
    return recorder.ops


def test_the_recorder_sees_host_syncs():
    """The check can fail: a non-fused, non-capturable AdamW reads its step counter with .item()."""
    model, opt, *_ = _pair()
    ops = _ops_of_one_step(GraphedStep(model, opt, _loss, warmup=0), _batches(1)[0])
    assert ops["_local_scalar_dense"] > 0
    with _OpRecorder() as recorder:
        float(torch.ones(()).sum())
    assert recorder.ops["_local_scalar_dense"] == 1


def test_plain_step_has_no_host_sync():
    model, opt, *_ = _pair(fused=True)
    ops = _ops_of_one_step(GraphedStep(model, opt, _loss, warmup=2), _batches(1)[0])
    assert ops["mm"] >= 2 and ops["addmm"] == 2  # backward's weight/input gradients, forward's linears
    assert ops["_fused_adamw_"] == 1 and ops["native_batch_norm_backward"] == 1
    assert not SYNCING & set(ops)


def _tt_model(*, embedding: bool) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Embedding(30, 12)] if embedding else []
    model = nn.Sequential(*layers, nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 12))
    convert_(model, TTConfig(rank=4, n_cores=4, init="random", rank_gates=True))
    if embedding:
        convert_(model, TTEmbeddingConfig(rank=4, n_cores=2, init="random", rank_gates=True))
    return model


def _late_step(model: nn.Module, batch) -> GraphedStep:
    """A late-stage CoMERA step with the sync-free gate freeze, as a CUDA graph would capture it."""
    optimizer = torch.optim.AdamW(param_groups(model), weight_decay=0.0, fused=True)
    objective = CoMERAObjective(CoMERAConfig(target_ratio=0.5))

    def task(model: nn.Module, batch) -> torch.Tensor:
        x, y = batch
        return (model(x) - y).square().mean()

    freeze = GateFreeze(model, optimizer, objective)
    objective.start_late(model, target_loss=1.0)
    loss = stage_loss(objective, task, late=True)
    step = GraphedStep(model, optimizer, loss, warmup=2, update=freeze.step, extra_state=(freeze.frozen,))
    step(batch)
    return step


def test_comera_late_step_has_no_host_sync():
    model = _tt_model(embedding=False)
    batch = (torch.randn(5, 12), torch.randn(5, 12))
    ops = _ops_of_one_step(_late_step(model, batch), batch)
    groups = len(param_groups(model))  # cores, gates, rest: one fused kernel each
    assert ops["_fused_adamw_"] == groups and ops["mm"] > 0 and ops["where"] > 0  # optimizer, backward, gate freeze
    assert ops["threshold_backward"] > 0  # gradients through the gate masks
    assert not SYNCING & set(ops)


def test_tt_embedding_step_is_sync_free_only_with_static_lookups():
    """By default ``TTEmbedding`` syncs (its id range check, ``torch.unique``, the half-table lookup's ``bincount``);
    under :func:`static_lookups` none of that runs."""
    model = _tt_model(embedding=True)
    batch = (torch.randint(30, (3, 4)), torch.randn(3, 4, 12))
    default_ops = _ops_of_one_step(_late_step(model, batch), batch)
    assert {"_unique2", "bincount", "_local_scalar_dense"} <= set(default_ops)
    with static_lookups(model):
        ops = _ops_of_one_step(_late_step(model, batch), batch)
    assert not SYNCING & set(ops)


def test_static_lookups_keep_the_rows_and_restore_the_layer():
    model = _tt_model(embedding=True)
    emb = model[0]
    ids = torch.tensor([[0, 29, 4, 4], [7, 7, 7, 1]])
    before = emb(ids)
    with static_lookups(model):
        assert (emb.unique, emb.lookup, emb.check_ids) == (False, "chain", False)
        torch.testing.assert_close(emb(ids), before)
    assert (emb.unique, emb.lookup, emb.check_ids) == (True, "halves", True)


# ------------------------------------------------------------------------------- (c) CoMERA's late stage, frozen


def _tiny_bert() -> nn.Module:
    torch.manual_seed(0)
    preset = get_bert_preset("bert-tiny")
    model = BertForMaskedLM(BertConfig(**{**preset.__dict__, "vocab_size": padded_vocab(1000)}))
    comera_(model, rank=4, emb_rank=4)
    return model


def _mlm_batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [
        mask_tokens(torch.randint(999, (2, 12), generator=gen), mask_id=999, vocab=999, generator=gen) for _ in range(n)
    ]


def _mlm(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, labels = batch
    return mlm_loss(model(inputs), labels)


def test_gates_stop_moving_once_the_target_is_reached():
    """The sync-free freeze: after the first late step (S ≤ S* = S at the switch) the gates never change, while
    the cores keep training."""
    model = _tiny_bert()
    optimizer = build_optimizer(model, lr_cores=1e-2, lr_gates=1e-2)
    objective = CoMERAObjective(CoMERAConfig(target_ratio=1.0))
    objective.start_late(model, target_loss=1.0)
    freeze = GateFreeze(model, optimizer, objective)
    step = GraphedStep(
        model,
        optimizer,
        stage_loss(objective, _mlm, late=True),
        warmup=1,
        update=freeze.step,
        extra_state=(freeze.frozen,),
    )
    gates, cores = [], []
    for batch in _mlm_batches(4):
        step(batch)
        gates.append(torch.cat([g.detach().clone() for g in model.lm_head.gates]))
        cores.append(model.lm_head.cores[0].detach().clone())
    assert bool(freeze.frozen) and float(model_size(model)) <= float(objective.target_size)
    assert not torch.equal(gates[0], _first_gates())  # the first late step still moved them
    assert all(torch.equal(gates[0], later) for later in gates[1:])
    assert not torch.equal(cores[1], cores[3])


def _first_gates() -> torch.Tensor:
    return torch.cat([g.detach().clone() for g in _tiny_bert().lm_head.gates])
