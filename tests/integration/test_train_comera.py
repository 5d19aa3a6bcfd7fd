"""``tensorslim train --method comera``: the two CoMERA stages in the shared trainer, and resume across truncation.

The settings (lr 0.03, γ = 10) make gates die within a few steps on the tiny preset, so the stage-end truncation
really shrinks cores inside a 9-step run (early stage: steps 1-6, late stage: steps 7-9).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tensorslim.checkpoint import latest_checkpoint
from tensorslim.cli.main import main
from tensorslim.layers.tt import TTLinear
from tensorslim.methods.comera.gates import tt_layers
from tensorslim.train.config import TrainConfig
from tensorslim.train.trainer import Trainer, train
from tests.helpers import train_until_interrupted

FULL_RANKS = (1, 8, 30, 30, 30, 8, 1)  # tiny preset 256x256 projections, r = 30


def _config(corpus: Path, out: Path, **overrides: object) -> TrainConfig:
    base = TrainConfig(
        preset="tiny",
        method="comera",
        steps=9,
        batch_size=8,
        seq_len=64,
        vocab_size=512,
        data=str(corpus),
        lr=0.03,
        options={"gamma": 10.0, "late_fraction": 1 / 3, "target_ratio": 0.5},
        eval_every=3,
        eval_blocks=8,
        checkpoint_every=3,
        out_dir=str(out),
        progress=False,
        tensorboard=False,
    )
    return replace(base, **overrides)


def _size(ranks: list[int], dims: tuple[int, ...]) -> int:
    """CoMERA's size ``Σ n_k R_{k-1} R_k`` (0 when a bond is dead), written out independently of the library."""
    if min(ranks) == 0:
        return 0
    return sum(r0 * n * r1 for r0, n, r1 in zip(ranks[:-1], dims, ranks[1:], strict=True))


def _report_size(stage: dict, model: torch.nn.Module) -> int:
    layers = dict(tt_layers(model))
    return sum(_size(row["ranks"], layers[row["name"]].in_factors + layers[row["name"]].out_factors) for row in stage)


@pytest.fixture(scope="module")
def full_run(small_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[TrainConfig, object, Trainer]:
    config = _config(small_corpus, tmp_path_factory.mktemp("comera") / "full")
    trainer = Trainer(config)
    return config, trainer.run(), trainer


def test_stages_prune_truncate_and_report(full_run) -> None:
    config, result, trainer = full_run
    report = json.loads((Path(config.run_dir) / "comera_ranks.json").read_text())
    early, late = report["after_early"], report["after_late"]
    assert (early["step"], late["step"]) == (6, 9)
    # The reported sizes are CoMERA's Σ n_k R_{k-1} R_k over the reported ranks.
    assert early["size"] == _report_size(early["layers"], trainer.model)
    assert late["size"] == _report_size(late["layers"], trainer.model)
    assert early["size"] < 0.5 * report["start_size"]  # gates died in the early stage
    assert report["target_size"] == pytest.approx(0.5 * early["size"])
    assert late["size"] <= early["size"]
    # L* defaults to the mean task loss of the last tenth of the early stage (one step here: step 6).
    records = [json.loads(line) for line in (Path(config.run_dir) / "metrics.jsonl").read_text().splitlines()]
    assert report["target_loss"] == pytest.approx(records[5]["loss"])
    assert all(("comera_lambda" in r) == (r["step"] > 6) for r in records)
    # Dead ranks were sliced out of the cores: the model's core ranks are the reported active ranks.
    layers = dict(tt_layers(trainer.model))
    assert {row["name"]: tuple(row["ranks"]) for row in late["layers"]} == {n: m.ranks for n, m in layers.items()}
    assert any(m.ranks != FULL_RANKS for m in layers.values() if isinstance(m, TTLinear) and m.in_features == 256)
    assert all(torch.isfinite(torch.tensor(result.losses)))
    # The summary counts the trained, truncated model (gates included), not the books at the start.
    assert result.params_total == sum(p.numel() for p in trainer.model.parameters())
    assert result.flops_per_token < trainer.books["flops_per_token"]


def test_optimizer_groups_keep_comera_lr_ratios(full_run) -> None:
    _, _, trainer = full_run
    groups = {g["name"]: g for g in trainer.optimizer.param_groups}
    assert set(groups) == {"cores", "gates", "other"}
    lr = groups["cores"]["lr"]  # the scheduled lr of the last step
    assert groups["gates"]["lr"] == pytest.approx(10 * lr) and groups["other"]["lr"] == pytest.approx(0.5 * lr)
    assert groups["gates"]["weight_decay"] == 0.0 and groups["cores"]["weight_decay"] == 0.01
    cores = {id(p) for _, m in tt_layers(trainer.model) for p in m.cores}
    assert {id(p) for p in groups["cores"]["params"]} == cores  # truncation kept the groups on the live params


@pytest.mark.parametrize("stop_after", [5, 8])  # resume from step 3 (before the stage switch) / 6 (truncated)
def test_interrupted_and_resumed_equals_uninterrupted(full_run, tmp_path: Path, stop_after: int) -> None:
    config, full, _ = full_run
    interrupted = replace(config, out_dir=str(tmp_path / "cut"))

    train_until_interrupted(interrupted, after_step=stop_after)
    checkpoint = latest_checkpoint(tmp_path / "cut" / "checkpoints")
    state = json.loads((checkpoint / "state.json").read_text())
    attention = [tuple(r) for name, r in state["method"]["ranks"].items() if "self_attn" in name]  # 256x256
    truncated = any(r != FULL_RANKS for r in attention)
    assert truncated == (stop_after == 8)
    resumed = train(replace(interrupted, resume=True))
    assert resumed.losses == pytest.approx(full.losses, rel=1e-6, abs=0)
    assert resumed.val_loss == pytest.approx(full.val_loss, rel=1e-6)
    full_report = json.loads((Path(config.run_dir) / "comera_ranks.json").read_text())
    assert json.loads((tmp_path / "cut" / "comera_ranks.json").read_text()) == full_report


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--comera-target-ratio", "0", "comera_target_ratio=0.0 is invalid"),
        ("--comera-target-ratio", "1.5", "comera_target_ratio=1.5 is invalid"),
        ("--comera-late-fraction", "1", "comera_late_fraction=1.0 is invalid"),
        ("--comera-gamma", "-1", "comera_gamma=-1.0 is invalid"),
    ],
)
def test_bad_comera_flags_are_one_line_errors(
    flag: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "--method", "comera", flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
