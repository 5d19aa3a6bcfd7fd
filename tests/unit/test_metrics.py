"""metrics.jsonl is strict JSON (RFC 8259 has no NaN or Infinity), yet keeps which values were not finite."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tensorslim.train.metrics import MetricsLog, plot_loss_curve


def _strict_loads(line: str) -> dict:
    """json.loads that refuses the NaN/Infinity/-Infinity extensions, as strict readers (jq, JavaScript) do."""

    def refuse(name: str) -> None:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(line, parse_constant=refuse)


def _log(run_dir: Path, records: list[dict], **kwargs: object) -> MetricsLog:
    log = MetricsLog(run_dir, tensorboard=False, **kwargs)
    for record in records:
        log.log(record)
    log.close()
    return log


def test_non_finite_values_are_written_as_null_and_named(tmp_path: Path) -> None:
    records = [
        {"step": 1, "loss": 2.5, "grad_norm": 1.0},
        {"step": 2, "loss": math.nan, "grad_norm": math.inf, "lr": 1e-3},
        {"step": 3, "loss": -math.inf, "grad_norm": 0.5, "val_loss": math.nan, "tokens": 96},
    ]
    log = _log(tmp_path, records)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    strict = [_strict_loads(line) for line in lines]
    assert strict[0] == records[0]  # finite records are unchanged, with no extra field
    assert strict[1] == {
        "step": 2,
        "loss": None,
        "grad_norm": None,
        "lr": 1e-3,
        "nonfinite": {"loss": "nan", "grad_norm": "inf"},
    }
    assert strict[2]["loss"] is None and strict[2]["val_loss"] is None and strict[2]["tokens"] == 96
    assert strict[2]["nonfinite"] == {"loss": "-inf", "val_loss": "nan"}
    # Read back in Python, the values are the floats that were logged.
    back = log.records()
    assert math.isnan(back[1]["loss"]) and back[1]["grad_norm"] == math.inf and back[2]["loss"] == -math.inf
    assert back[0] == records[0] and "nonfinite" not in back[1]


def test_resume_keeps_the_log_strict(tmp_path: Path) -> None:
    _log(tmp_path, [{"step": s, "loss": math.nan if s == 2 else 1.0 / s} for s in range(1, 5)])
    _log(tmp_path, [{"step": 3, "loss": math.inf}], resume_step=2)
    strict = [_strict_loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in strict] == [1, 2, 3]
    assert strict[1]["nonfinite"] == {"loss": "nan"} and strict[2]["nonfinite"] == {"loss": "inf"}


def test_nested_values_are_strict_too(tmp_path: Path) -> None:
    log = _log(tmp_path, [{"step": 1, "ranks": [4, math.nan], "gates": {"a": math.inf, "b": 0.5}}])
    (line,) = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert _strict_loads(line) == {"step": 1, "ranks": [4, None], "gates": {"a": None, "b": 0.5}}
    assert log.records() == [{"step": 1, "ranks": [4, None], "gates": {"a": None, "b": 0.5}}]


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_loss_curve_plots_around_non_finite_losses(tmp_path: Path, bad: float) -> None:
    records = [{"step": 1, "loss": 3.0}, {"step": 2, "loss": bad}, {"step": 3, "loss": 2.0, "val_loss": 2.1}]
    log = _log(tmp_path, records)
    plot_loss_curve(log.records(), tmp_path / "loss.png", title="t")
    assert (tmp_path / "loss.png").stat().st_size > 1000
