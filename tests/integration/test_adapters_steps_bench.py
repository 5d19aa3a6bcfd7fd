"""experiments/adapters_steps.py: the development accuracy picks among three rates × short and the middle rate × long,
a tie keeps the short run, and a sweep missing part of a grid is a one-line error."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "adapters_steps.py"
sys.path.insert(0, str(SCRIPT.parent))  # it imports adapters_protocol by name, as when run from experiments/


def load():
    spec = importlib.util.spec_from_file_location("adapters_steps", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(seed: int, lr: float, steps: int, dev: float, test: float) -> dict:
    return {"method": "lora", "k": 100, "seed": seed, "lr": lr, "steps": steps, "dev_accuracy": dev,
            "test_accuracy": test}  # fmt: skip


def test_the_long_run_wins_a_seed_only_with_a_strictly_better_development_accuracy() -> None:
    sweep = [run(s, lr, 32, dev, test) for s in (0, 1) for lr, dev, test in [(1e-3, 0.5, 0.5), (5e-3, 0.7, 0.6)]]
    sweep += [run(s, 2e-2, 32, 0.2, 0.2) for s in (0, 1)]
    sweep.append({**sweep[0], "prompt_lr_scale": 3.0, "method": "unipelt-prompt"})  # another method: ignored
    long = [run(0, 5e-3, 94, 0.8, 0.9), run(1, 5e-3, 94, 0.7, 0.1)]  # seed 1 ties the short middle run
    (row,) = load().compare(sweep, long).values()
    assert (row["dev_short"], row["dev_long"], row["long_chosen"], row["steps"]) == (0.7, 0.75, 1, [32, 94])
    assert row["test_three"] == [60.0, 0.0]
    assert row["test_four"][0] == pytest.approx(75.0)  # seed 0: the long run's 90 %, seed 1: the short run's 60 %


def test_a_sweep_without_the_whole_grid_is_a_one_line_error() -> None:
    sweep = [run(0, lr, 32, 0.5, 0.5) for lr in (1e-3, 5e-3)]
    with pytest.raises(ValueError, match=r"lora seed 0: the sweep lacks one length × the grid") as error:
        load().compare(sweep, [run(0, 5e-3, 94, 0.8, 0.9)])
    assert "\n" not in str(error.value)
