"""Sharded checkpoints without a process group: the rectangle index against plain slicing, and the atomic commit."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import CheckpointException

from tensorslim.checkpoint import is_sharded_checkpoint, latest_checkpoint, save_sharded_checkpoint
from tensorslim.distributed.chunks import Holding, rectangles, sharded_state
from tensorslim.distributed.layout import SingleProcess
from tensorslim.distributed.sharding import ShardSpec, group
from tensorslim.tasks.lm import causal_lm_loss
from tests.distributed import workers

SOURCES = {f"{x}.weight": torch.randn(6, 8, generator=torch.Generator().manual_seed(i)) for i, x in enumerate("qkv")}
SPECS = [
    ShardSpec(sources=("q.weight",)),  # replicated
    ShardSpec(sources=("q.weight",), dim=0),
    ShardSpec(sources=("q.weight",), dim=1),
    ShardSpec(sources=tuple(SOURCES), grouping="cat", dim=1),  # BTP's grouped A
    ShardSpec(sources=tuple(SOURCES), grouping="stack", dim=1),  # BTP's batched B
]


@pytest.mark.parametrize(("spec", "tp", "dp", "dim"), list(itertools.product(SPECS, (1, 2), (1, 2, 4), (0, 1))))
def test_rectangles_are_the_slices_each_rank_holds(spec: ShardSpec, tp: int, dp: int, dim: int) -> None:
    shapes = {name: t.shape for name, t in SOURCES.items()}
    covered = {name: torch.zeros_like(t) for name, t in SOURCES.items()}
    for tp_rank in range(tp):
        slab = group(SOURCES, spec) if spec.dim is None else group(SOURCES, spec).chunk(tp, dim=spec.dim)[tp_rank]
        step = -(-slab.shape[dim] // dp)  # FSDP2 splits its shard dim like torch.chunk
        for dp_rank in range(dp):
            start = min(dp_rank * step, slab.shape[dim])
            split = (dim, start, min(start + step, slab.shape[dim]))
            held = slab.narrow(dim, start, split[2] - start)
            for rect in rectangles(held, spec, shapes, split=split, tp_rank=tp_rank, tp_size=tp):
                where = tuple(slice(o, o + n) for o, n in zip(rect.offsets, rect.data.shape, strict=True))
                assert torch.equal(SOURCES[rect.source][where], rect.data)
                covered[rect.source][where] += 1
    expected = {name: (tp if spec.dim is None else 1) if name in spec.sources else 0 for name in SOURCES}
    for name, count in covered.items():
        assert torch.all(count == expected[name]), name  # every element held once (by each TP replica)


def _trained() -> tuple[torch.nn.Module, torch.optim.AdamW]:
    model = workers.tiny_model("btp")
    optimizer = torch.optim.AdamW(model.parameters(), lr=workers.LR)
    batch = workers.batches(1)[0]
    causal_lm_loss(model(batch), batch).backward()
    optimizer.step()
    return model, optimizer


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    holdings = [Holding(p, ShardSpec(sources=(n,)), (0, 0, len(p))) for n, p in model.named_parameters()]
    return sharded_state(holdings, optimizer, {n: p.shape for n, p in model.named_parameters()})


class _Crash:
    """Stands for a process dying in the middle of writing its shards."""

    def __reduce__(self) -> tuple:
        raise RuntimeError("killed mid-save")


def test_a_crash_mid_save_leaves_the_previous_checkpoint_loadable(tmp_path: Path) -> None:
    model, optimizer = _trained()
    root = tmp_path / "checkpoints"
    done = save_sharded_checkpoint(
        root, step=1, tensors=_state(model, optimizer), state={}, is_main=True, barrier=lambda: None
    )
    assert is_sharded_checkpoint(done)
    saved = {name: p.detach().clone() for name, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    tensors = {**_state(model, optimizer), "zz.crash": _Crash()}
    with pytest.raises(CheckpointException) as crash:
        save_sharded_checkpoint(root, step=2, tensors=tensors, state={}, is_main=True, barrier=lambda: None)
    assert "killed mid-save" in str(next(iter(crash.value.failures.values()))[0])
    assert (root / ".tmp-step_0000002").is_dir()  # the half-written folder is left aside ...
    assert latest_checkpoint(root) == done  # ... and never named
    fresh = workers.tiny_model("btp", seed=3)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=workers.LR)
    SingleProcess(torch.device("cpu")).load_checkpoint(
        done, model=fresh, optimizer=fresh_optimizer, prepare=lambda _: None
    )
    for name, param in fresh.named_parameters():
        assert torch.equal(param, saved[name]), name
    moments = {id(p): s for p, s in optimizer.state.items()}
    for (_, p), (_, q) in zip(fresh.named_parameters(), model.named_parameters(), strict=True):
        assert torch.equal(fresh_optimizer.state[p]["exp_avg"], moments[id(q)]["exp_avg"])
        assert fresh_optimizer.state[p]["step"].item() == 1


def _flip_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _cut_in_half(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("damage", [_flip_middle, _cut_in_half])
def test_a_damaged_shard_is_refused_naming_the_file_and_nothing_is_loaded(damage, tmp_path: Path) -> None:
    model, optimizer = _trained()
    done = save_sharded_checkpoint(
        tmp_path, step=1, tensors=_state(model, optimizer), state={}, is_main=True, barrier=lambda: None
    )
    recorded = json.loads((done / "state.json").read_text())["sha256"]
    shard = max((f for f in done.iterdir() if f.suffix == ".distcp"), key=lambda f: f.stat().st_size)
    assert set(recorded) == {f.name for f in done.iterdir()} - {"state.json"}  # every shard and DCP's index
    damage(shard)
    fresh = workers.tiny_model("btp", seed=3)
    before = {name: p.detach().clone() for name, p in fresh.named_parameters()}
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=workers.LR)
    with pytest.raises(ValueError) as error:
        SingleProcess(torch.device("cpu")).load_checkpoint(
            done, model=fresh, optimizer=fresh_optimizer, prepare=lambda _: None
        )
    message = str(error.value)
    assert str(shard) in message and f"written with {recorded[shard.name][:16]}…" in message and "\n" not in message
    assert all(torch.equal(p, before[name]) for name, p in fresh.named_parameters())
    assert fresh_optimizer.state == {}


def test_a_sharded_checkpoint_without_recorded_digests_still_loads(tmp_path: Path) -> None:
    """Checkpoints written before the digests were recorded are read unchecked."""
    model, optimizer = _trained()
    done = save_sharded_checkpoint(
        tmp_path, step=1, tensors=_state(model, optimizer), state={}, is_main=True, barrier=lambda: None
    )
    state = json.loads((done / "state.json").read_text())
    del state["sha256"]
    (done / "state.json").write_text(json.dumps(state))
    fresh = workers.tiny_model("btp", seed=3)
    SingleProcess(torch.device("cpu")).load_checkpoint(
        done, model=fresh, optimizer=torch.optim.AdamW(fresh.parameters(), lr=workers.LR), prepare=lambda _: None
    )
    assert all(torch.equal(p, q) for p, q in zip(fresh.parameters(), model.parameters(), strict=True))
