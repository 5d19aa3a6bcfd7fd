"""CoMERA rank gates, size accounting, two-stage objective, truncation, optimizer groups and convert_ wiring."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from tensorslim.convert import convert_, plan
from tensorslim.decomp.tt import ttm_to_full
from tensorslim.layers.tt import TTConfig, TTLinear
from tensorslim.layers.tt_embedding import TTEmbedding, TTEmbeddingConfig
from tensorslim.methods.comera import (
    CoMERAConfig,
    CoMERAObjective,
    build_optimizer,
    enable_gates,
    gate_penalty,
    model_size,
    param_groups,
    prune_to_size_,
    rank_report,
    truncate_,
)
from tensorslim.methods.comera.gates import format_rank_report, layer_size


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, 12)
        self.fc1 = nn.Linear(12, 16)
        self.fc2 = nn.Linear(16, 12)
        self.norm = nn.LayerNorm(12)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(self.norm(self.emb(ids)))))


def _tiny_comera(seed: int = 0) -> Tiny:
    torch.manual_seed(seed)
    model = Tiny()
    convert_(model, TTConfig(rank=4, n_cores=4, init="random"))
    convert_(model, TTEmbeddingConfig(rank=4, n_cores=2, init="random"))
    enable_gates(model)
    return model


def _kill(gates: nn.ParameterList, which: dict[int, list[int]], value: float = 5e-3) -> None:
    with torch.no_grad():
        for k, idx in which.items():
            gates[k][idx] = value


def test_convert_plan_and_build_tt_layers():
    model = Tiny()
    report = plan(model, TTConfig(rank=4, n_cores=4, rank_gates=True))
    assert [layer.name for layer in report.layers] == ["fc1", "fc2"]
    convert_(model, TTConfig(rank=4, n_cores=4, rank_gates=True))
    assert report.params_after == model.fc1.num_params() + model.fc2.num_params()
    emb_report = convert_(model, TTEmbeddingConfig(rank=4, n_cores=2))
    assert isinstance(model.emb, TTEmbedding) and emb_report.params_after == model.emb.num_params()
    assert model(torch.tensor([[1, 2, 29]])).shape == (1, 3, 12)


def test_convert_tt_svd_at_full_rank_keeps_the_model_function():
    torch.manual_seed(0)
    model = Tiny().double()
    ids = torch.tensor([[0, 5, 29, 7]])
    before = model(ids)
    convert_(model, TTConfig(rank=1000, n_cores=4), allow_larger=True)
    convert_(model, TTEmbeddingConfig(rank=1000, n_cores=2), allow_larger=True)
    torch.testing.assert_close(model(ids), before)


def test_convert_bad_factors_name_the_layer():
    with pytest.raises(ValueError, match=r"layer 'fc1': in_factors=\[5, 3\] has product 15; it must equal 12"):
        plan(Tiny(), TTConfig(in_factors=(5, 3), out_factors=(4, 4)))


def test_dead_gates_equal_the_sliced_rank_model():
    model = _tiny_comera()
    layer = model.fc1
    with torch.no_grad():
        for gate in layer.gates:
            gate.uniform_(0.5, 1.5)
    _kill(layer.gates, {0: [1], 1: [0, 2]})
    x = torch.randn(5, 12)
    gated = layer(x)
    # Independent reference: a fresh layer with the smaller ranks whose cores are the sliced, gate-scaled cores.
    keep = [torch.nonzero(g > 1e-2).flatten() for g in layer.gates]
    ranks = (1, *(len(k) for k in keep), 1)
    ref = TTLinear(layer.in_factors, layer.out_factors, ranks)
    with torch.no_grad():
        for k, core in enumerate(layer.cores):
            c = core.clone()
            if k > 0:
                c = c[keep[k - 1]]
            if k < len(keep):
                c = (c * layer.gates[k])[..., keep[k]]
            ref.cores[k].copy_(c)
        ref.bias.copy_(layer.bias)
    torch.testing.assert_close(gated, ref(x))
    assert truncate_(model)["fc1"] == ranks
    torch.testing.assert_close(layer(x), gated)
    assert layer.num_params() < ref.num_params() + sum(len(k) for k in keep) + 1


def test_dead_gates_equal_sliced_embedding():
    model = _tiny_comera(1)
    emb = model.emb
    _kill(emb.gates, {0: [0, 3]})
    ids = torch.tensor([[0, 29, 4, 4]])
    before = emb(ids)
    full = ttm_to_full([c.detach() for c in emb.effective_cores()])
    torch.testing.assert_close(before, full[ids])
    truncate_(model)
    assert emb.ranks == (1, 2, 1)
    torch.testing.assert_close(emb(ids), before)


def test_a_fully_dead_bond_removes_the_layer():
    model = _tiny_comera()
    _kill(model.fc2.gates, {1: list(range(model.fc2.gates[1].numel()))})
    assert layer_size(model.fc2) == 0
    x = torch.randn(3, 16)
    torch.testing.assert_close(model.fc2(x), model.fc2.bias.expand(3, -1).detach())
    truncate_(model)
    assert model.fc2.ranks[2] == 0
    torch.testing.assert_close(model.fc2(x), model.fc2.bias.expand(3, -1).detach())


def test_size_counts_ttm_cores_with_both_modes():
    model = _tiny_comera()
    emb = model.emb  # row factors x col factors, TTM size = Σ m_k n_k R_{k-1} R_k
    expected = sum(c.numel() for c in emb.cores)
    assert layer_size(emb) == expected
    assert float(model_size(model)) == sum(sum(c.numel() for c in m.cores) for m in (model.emb, model.fc1, model.fc2))
    _kill(model.fc1.gates, {1: [0]})
    r = model.fc1.ranks
    dims = model.fc1.in_factors + model.fc1.out_factors
    shrunk = r[0] * dims[0] * r[1] + r[1] * dims[1] * (r[2] - 1) + (r[2] - 1) * dims[2] * r[3] + r[3] * dims[3]
    assert layer_size(model.fc1) == shrunk


def test_gate_penalty_is_mean_of_active_gates():
    model = _tiny_comera()
    _kill(model.fc1.gates, {0: [0]})
    with torch.no_grad():
        model.fc2.gates[0][0] = 0.5
    gates = torch.cat([g.detach() for _, m in [("", model.emb), ("", model.fc1), ("", model.fc2)] for g in m.gates])
    active = gates[gates > 1e-2]
    torch.testing.assert_close(gate_penalty(model), active.mean())


def test_early_and_late_objective():
    model = _tiny_comera()
    objective = CoMERAObjective(CoMERAConfig(gamma=0.5, target_ratio=0.5))
    task = torch.tensor(2.0, requires_grad=True)
    loss, info = objective.early(task, model)
    torch.testing.assert_close(loss, task + 0.5 * info["penalty"])
    with pytest.raises(ValueError, match="start_late"):
        objective.late(task, model)
    size = float(model_size(model))
    with pytest.raises(ValueError, match="target_loss=None is invalid"):
        objective.start_late(model, target_loss=None)  # L* has no default: the hook chooses it
    assert objective.start_late(model, target_loss=1.0) == pytest.approx(0.5 * size)
    # Loss gap (2-1)/2 = 0.5 ≥ size gap (S - S/2)/S = 0.5 → λ = 0: descend the task loss.
    loss, info = objective.late(task, model)
    assert info["lambda"] == 0
    torch.testing.assert_close(loss, 0.1 * task + 0.01 * info["penalty"] + task)
    # Loss already near its target → λ = 1: descend the rank penalty.
    near = torch.tensor(1.01)
    loss, info = objective.late(near, model)
    assert info["lambda"] == 1
    torch.testing.assert_close(loss, 0.1 * near + 1.01 * info["penalty"])


def test_the_loss_target_has_no_config_default():
    """``L*`` is chosen in one place, the trainer hook; the objective's config must not supply one silently."""
    assert "target_loss" not in {field.name for field in dataclasses.fields(CoMERAConfig)}


@pytest.mark.parametrize("ratio", [0, -0.1, 1.5, float("nan"), "0.5"])
def test_target_ratio_out_of_range_is_a_one_line_error(ratio):
    with pytest.raises(ValueError, match="target_ratio=.*allowed: a number in \\(0, 1\\]") as info:
        CoMERAConfig(target_ratio=ratio)
    assert "\n" not in str(info.value)


def test_prune_to_size_reaches_the_target():
    model = _tiny_comera()
    target = 0.5 * float(model_size(model))
    assert prune_to_size_(model, target) > 0
    assert float(model_size(model)) <= target
    size = float(model_size(model))
    truncate_(model)
    layers = (model.emb, model.fc1, model.fc2)  # a layer with a rank-0 bond is removed: size 0
    assert size == sum(sum(c.numel() for c in m.cores) if min(m.ranks) else 0 for m in layers)


def test_truncation_keeps_optimizer_state_consistent():
    model = _tiny_comera()
    optimizer = build_optimizer(model)
    names = [group["name"] for group in optimizer.param_groups]
    assert names == ["cores", "gates", "other"]
    assert [g["lr"] for g in optimizer.param_groups] == [1e-4, 1e-3, 5e-5]
    ids = torch.tensor([[1, 2, 3]])
    model(ids).sum().backward()
    optimizer.step()
    _kill(model.fc1.gates, {1: [0, 1]})
    truncate_(model, optimizer=optimizer)
    for p in model.parameters():
        for value in optimizer.state[p].values():
            if value.ndim:
                assert value.shape == p.shape
    optimizer.zero_grad()
    model(ids).sum().backward()
    optimizer.step()  # still works after the shapes changed


def test_param_groups_cover_every_parameter_once():
    model = _tiny_comera()
    groups = param_groups(model)
    ids = [id(p) for g in groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in model.parameters())
    assert len(groups[0]["params"]) == 2 + 4 + 4 and len(groups[1]["params"]) == 1 + 3 + 3


def test_rank_report_lists_every_tt_layer():
    model = _tiny_comera()
    _kill(model.fc1.gates, {1: [0]})
    rows = rank_report(model)
    assert [r.name for r in rows] == ["emb", "fc1", "fc2"]
    assert rows[1].ranks[2] == model.fc1.ranks[2] - 1
    assert "fc1" in format_rank_report(rows, title="after early stage")


def test_embedding_with_a_dead_bond_returns_zeros_and_trains():
    emb = TTEmbedding(30, (2, 3, 5), (2, 2, 3), (1, 2, 3, 1))
    emb.enable_gates()
    with torch.no_grad():
        emb.gates[1][:] = 0.0
    truncate_(emb)
    assert emb.ranks == (1, 2, 0, 1)
    out = emb(torch.tensor([[1, 2, 29]]))
    out.sum().backward()
    assert torch.equal(out, torch.zeros(1, 3, 12))
    emb.lookup = "chain"
    assert torch.equal(emb(torch.tensor([[1, 2, 29]])), out)
    assert all(core.grad is not None and core.grad.shape == core.shape for core in emb.cores)
