"""``compile=True`` trains like eager, and ``dtype="auto"`` reports what it chose, on the tiny preset.

Compilation uses the ``aot_eager`` backend here (the same Dynamo/AOTAutograd tracing as TorchInductor, without
building C++, which takes minutes on a loaded CI machine; see tests/unit/test_compile.py).
"""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from tensorslim.train import trainer as trainer_module
from tensorslim.train.config import TrainConfig
from tensorslim.train.execution import PrecisionProbe, compile_model, resolve_dtype
from tensorslim.train.trainer import train
from tests.helpers import train_until_interrupted


def _config(corpus: Path, out: Path, **overrides: object) -> TrainConfig:
    base = TrainConfig(
        preset="tiny",
        method="cola",
        steps=3,
        batch_size=4,
        seq_len=32,
        vocab_size=300,
        data=str(corpus),
        eval_every=3,
        eval_blocks=4,
        checkpoint_every=3,
        out_dir=str(out),
        progress=False,
        tensorboard=False,
    )
    return replace(base, **overrides)


def test_compiled_training_has_the_losses_of_eager_training(
    small_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trainer_module, "compile_model", functools.partial(compile_model, backend="aot_eager"))
    eager = train(_config(small_corpus, tmp_path / "eager"))
    compiled = train(_config(small_corpus, tmp_path / "compiled", compile=True))
    assert compiled.losses == pytest.approx(eager.losses, rel=1e-4)
    assert compiled.val_loss == pytest.approx(eager.val_loss, rel=1e-4)
    assert eager.compile_s is None and compiled.compile_s is not None and compiled.compile_s >= 0
    # Parameter names are those of the eager model, so checkpoints load into either.
    saved = json.loads((tmp_path / "compiled" / "summary.json").read_text())
    assert saved["compile_s"] == compiled.compile_s


@pytest.mark.parametrize(("native", "used"), [(True, "bf16"), (False, "fp32")])
def test_auto_dtype_trains_in_the_probed_precision_and_reports_it(
    small_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool, used: str
) -> None:
    def probe(device) -> PrecisionProbe:
        return PrecisionProbe(
            device=device.type,
            capability="injected",
            native_flags=(),
            bf16_native=native,
        )

    monkeypatch.setattr(trainer_module, "resolve_dtype", functools.partial(resolve_dtype, probe=probe))
    result = train(_config(small_corpus, tmp_path / "run", dtype="auto", steps=2, eval_every=2, checkpoint_every=2))
    assert result.precision["requested"] == "auto" and result.precision["used"] == used
    assert result.precision["probe"]["capability"] == "injected"
    reference = train(_config(small_corpus, tmp_path / "ref", dtype=used, steps=2, eval_every=2, checkpoint_every=2))
    assert result.losses == reference.losses  # the same precision, hence the very same arithmetic


def test_thirty_bf16_steps_follow_the_fp32_loss_curve(small_corpus: Path, tmp_path: Path) -> None:
    fp32 = train(_config(small_corpus, tmp_path / "fp32", steps=30, eval_every=30, checkpoint_every=30))
    bf16 = train(_config(small_corpus, tmp_path / "bf16", dtype="bf16", steps=30, eval_every=30, checkpoint_every=30))
    gaps = [abs(a - b) / b for a, b in zip(bf16.losses, fp32.losses, strict=True)]
    assert max(gaps) < 0.01  # measured: 0.13 %, while the loss falls by 1.5
    assert fp32.losses[-1] < fp32.losses[0] - 0.5 and bf16.losses[-1] < bf16.losses[0] - 0.5


def test_a_resumed_bf16_run_equals_an_uninterrupted_one(small_corpus: Path, tmp_path: Path) -> None:
    # The checkpoint holds the fp32 master weights and AdamW state; autocast recasts them in every forward.
    config = _config(small_corpus, tmp_path / "full", dtype="bf16", steps=5, checkpoint_every=2, eval_every=5)
    full = train(config)
    cut = replace(config, out_dir=str(tmp_path / "cut"))
    train_until_interrupted(cut, after_step=3)
    resumed = train(replace(cut, resume=True))
    assert resumed.losses == full.losses and resumed.val_loss == full.val_loss
