"""Checkpoints are atomic and pickle-free; the schedule matches the GaLore/CoLA recipe."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

import tensorslim.checkpoint as checkpoint
import tensorslim.tensor_files as tensor_files
from tensorslim.train.metrics import format_bytes
from tensorslim.train.schedule import warmup_cosine


def _model_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_round_trip_restores_model_optimizer_and_rng(tmp_path: Path) -> None:
    model, optimizer = _model_and_optimizer()
    torch.manual_seed(123)
    checkpoint.save_checkpoint(tmp_path, step=1, model=model, optimizer=optimizer, state={"extra": [1, 2]})
    expected_draw = torch.rand(3)
    fresh_model = nn.Linear(4, 3)
    fresh_optimizer = torch.optim.AdamW(fresh_model.parameters(), lr=0.1)
    state = checkpoint.load_checkpoint(tmp_path / "step_0000001", model=fresh_model, optimizer=fresh_optimizer)
    assert state["extra"] == [1, 2] and state["step"] == 1
    torch.testing.assert_close(fresh_model.weight, model.weight)
    restored = fresh_optimizer.state_dict()["state"][0]["exp_avg"]
    torch.testing.assert_close(restored, optimizer.state_dict()["state"][0]["exp_avg"])
    torch.testing.assert_close(torch.rand(3), expected_draw)


def test_failed_save_leaves_previous_checkpoint_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, optimizer = _model_and_optimizer()
    checkpoint.save_checkpoint(tmp_path, step=1, model=model, optimizer=optimizer, state={})
    real_save = tensor_files.save_file

    def crash_on_state(tensors: dict, path: Path, **options: object) -> None:
        if Path(path).name == "state.safetensors":
            raise OSError("disk full")
        real_save(tensors, path, **options)

    monkeypatch.setattr(tensor_files, "save_file", crash_on_state)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save_checkpoint(tmp_path, step=2, model=model, optimizer=optimizer, state={})
    assert checkpoint.latest_checkpoint(tmp_path).name == "step_0000001"
    assert not (tmp_path / "step_0000002").exists()
    # the killed write's temporary folder goes at the next commit, not to the disk for ever
    assert [p.name for p in tmp_path.glob(".tmp-*")] != []
    monkeypatch.undo()
    checkpoint.save_checkpoint(tmp_path, step=3, model=model, optimizer=optimizer, state={})
    assert list(tmp_path.glob(".tmp-*")) == []


def test_keeps_only_the_newest(tmp_path: Path) -> None:
    model, optimizer = _model_and_optimizer()
    for step in range(1, 5):
        checkpoint.save_checkpoint(tmp_path, step=step, model=model, optimizer=optimizer, state={}, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_0000003", "step_0000004"]


def test_schedule_warmup_then_cosine_to_ten_percent() -> None:
    total, warmup = 100, 10
    values = [warmup_cosine(s, total_steps=total, warmup_steps=warmup) for s in range(total + 1)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    assert values[10] == pytest.approx(1.0) and values[100] == pytest.approx(0.1)
    midpoint = warmup + (total - warmup) // 2
    assert values[midpoint] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert all(a >= b for a, b in zip(values[10:], values[11:], strict=False))


def test_format_bytes_units() -> None:
    assert [format_bytes(n) for n in (10, 1536, 283.4 * 2**20, 5 * 2**30)] == [
        "10 B",
        "1.5 KiB",
        "283.4 MiB",
        "5.0 GiB",
    ]


def test_optimizer_tensors_come_back_with_their_strides() -> None:
    base = torch.arange(60.0).reshape(6, 10)
    for saved in (base.t(), base[1:, ::3], base.t()[:, :2], torch.ones(3).expand(4, 3)):
        tensors: dict[str, torch.Tensor] = {}
        tree = json.loads(json.dumps(checkpoint._flatten({"t": saved}, "s", tensors)))
        restored = checkpoint._unflatten(tree, tensors)["t"]
        assert torch.equal(restored, saved)
        assert (restored.stride(), restored.storage_offset()) == (saved.stride(), saved.storage_offset())


def test_resumed_galore_step_equals_the_uninterrupted_one_bit_for_bit(tmp_path: Path) -> None:
    """GaLore's projector is a strided view of the SVD's column-major output. Restored as a contiguous copy, the
    projection ``grad @ P.T`` runs MKL's sgemm with a transposed operand instead of a plain one, which sums in another
    order: the next step's weights then differ in the low bits, and later SVDs can blow that up."""
    pytest.importorskip("galore_torch")
    from tensorslim.train.optim import build_optimizer

    def build() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        # (256, 128) and (128, 256) weights: GaLore keeps Vh[:rank] of the first and U[:, :rank] of the second.
        model = nn.ModuleDict({"attn": nn.Linear(128, 256, bias=False), "mlp": nn.Linear(256, 128, bias=False)})
        optimizer = build_optimizer(model, lr=1e-2, weight_decay=0.0, galore_rank=8, galore_update_proj_gap=100)
        return model, optimizer

    def step(model: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=generator)
        optimizer.step()

    model, optimizer = build()
    step(model, optimizer, seed=1)  # computes the projectors by SVD
    checkpoint.save_checkpoint(tmp_path, step=1, model=model, optimizer=optimizer, state={})
    resumed_model, resumed_optimizer = build()
    checkpoint.load_checkpoint(tmp_path / "step_0000001", model=resumed_model, optimizer=resumed_optimizer)
    for p, resumed in zip(model.parameters(), resumed_model.parameters(), strict=True):
        projector = optimizer.state[p]["projector"].ortho_matrix
        restored = resumed_optimizer.state[resumed]["projector"].ortho_matrix
        assert not projector.is_contiguous()
        assert torch.equal(restored, projector) and restored.stride() == projector.stride()
    step(model, optimizer, seed=2)  # reuses the projectors
    step(resumed_model, resumed_optimizer, seed=2)
    for name, p in model.named_parameters():
        assert torch.equal(resumed_model.get_parameter(name), p), name


def test_tied_weights_are_saved_once_and_restored_tied(tmp_path: Path) -> None:
    from tensorslim.models.registry import build_model

    torch.manual_seed(0)
    model = build_model("gpt2-tiny")
    optimizer = torch.optim.AdamW(model.parameters())
    path = checkpoint.save_checkpoint(tmp_path, step=1, model=model, optimizer=optimizer, state={})
    fresh = build_model("gpt2-tiny")
    checkpoint.load_checkpoint(path, model=fresh, optimizer=torch.optim.AdamW(fresh.parameters()))
    assert fresh.lm_head.weight is fresh.transformer.wte.weight  # still one tensor
    ids = torch.randint(4096, (2, 8))
    assert torch.equal(fresh(ids), model(ids))
