"""benchmarks/time_to_quality.py at CI size: two arms of two steps train through ``tensorslim train`` (one at its own
learning rate), the report reads their run folders back (a finished arm is not trained again), and the time to the
dense loss is interpolated between evaluations."""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tensorslim.methods.recipes import recipe_for

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "time_to_quality.py"


@functools.cache
def load():
    spec = importlib.util.spec_from_file_location("time_to_quality", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_reach_interpolates_between_the_evaluations_that_straddle_the_target() -> None:
    points = [
        {"seconds": 1.0, "tokens": 100, "val_loss": 5.0},
        {"seconds": 3.0, "tokens": 200, "val_loss": 4.0},
        {"seconds": 4.0, "tokens": 300, "val_loss": 3.0},
    ]
    assert load().reach(points, 3.5) == {"seconds": 3.5, "tokens": 250}
    assert load().reach(points, 6.0) == {"seconds": 1.0, "tokens": 100}  # already below at the first evaluation
    assert load().reach(points, 2.9) is None


def test_time_to_own_loss_compares_with_the_baseline_at_the_arms_final_loss() -> None:
    baseline = {
        "evaluations": [
            {"seconds": 2.0, "tokens": 100, "val_loss": 5.0},
            {"seconds": 6.0, "tokens": 300, "val_loss": 3.0},
        ]
    }
    # The arm ends at 4.0, first reached at 1.5 s (it was 4.0 before its last evaluation too); the baseline gets
    # there half-way between its evaluations, at 4 s.
    arm = {
        "final_val_loss": 4.0,
        "evaluations": [
            {"seconds": 1.0, "tokens": 100, "val_loss": 4.5},
            {"seconds": 2.0, "tokens": 200, "val_loss": 3.5},
            {"seconds": 3.0, "tokens": 300, "val_loss": 4.0},
        ],
    }
    assert load().time_to_own_loss(arm, baseline) == {
        "seconds": 1.5,
        "baseline_seconds": 4.0,
        "time_vs_baseline": 0.375,
    }
    assert load().time_to_own_loss({**arm, "final_val_loss": 2.0}, baseline) is None  # the baseline never gets there


def test_arm_specs_name_an_arm_and_optionally_its_learning_rate(tmp_path: Path) -> None:
    module = load()
    arm = module.parse_arm("cola@3e-3")
    assert (arm.name, arm.method, arm.lr) == ("cola@3e-3", "cola", 0.003)
    assert arm.step_kind == module.ARMS["cola"].step_kind != module.ARMS["cola+vocab"].step_kind
    assert module.parse_arm("cola+vocab") == module.ARMS["cola+vocab"] and module.ARMS["cola+vocab"].lr is None
    # cola+head factors the LM head only; cola+vocab the token embedding too, at the same rank.
    assert module.ARMS["cola+head"].step_kind != module.ARMS["cola+vocab"].step_kind
    args = module.parse_args(["--vocab-rank", "8"])
    head = module.train_command(module.ARMS["cola+head"], args, tmp_path, resume=False)
    vocab = module.train_command(module.ARMS["cola+vocab"], args, tmp_path, resume=False)
    assert "--factor-embedding" not in head and vocab == [*head, "--factor-embedding"]
    assert head[head.index("--factor-vocab") + 1] == "8"
    ranked = module.parse_arm("cola+head:16@2e-3")
    assert (ranked.vocab_rank, ranked.lr, ranked.base) == (16, 2e-3, "cola+head")
    assert ranked.step_kind != module.ARMS["cola+head"].step_kind
    command = module.train_command(ranked, args, tmp_path, resume=False)
    assert command[command.index("--factor-vocab") + 1] == "16"
    for bad in ("cola:16", "cola+head:0", "cola+head:x", "cola+head:"):
        with pytest.raises(ValueError, match="cola\\+head:256"):
            module.parse_arm(bad)
    for bad in ("nope", "nope@1e-3", "cola@", "cola@x", "cola@0", "cola@-1e-3", "cola@inf", "cola@nan"):
        with pytest.raises(ValueError, match="cola@3e-3"):
            module.parse_arm(bad)
    # The report reads every arm with an evaluation, finished or stopped: recipe runs first, then by falling learning
    # rate; runs stopped before their first evaluation and folders that name no arm are left out.
    for name in ("cola@2e-3", "dense", "cola+vocab@3e-3", "cola@1e-3", "notes", "cola", "cola@3e-3"):
        evaluated = {} if name == "cola@1e-3" else {2: 5.0}
        fake_run(tmp_path / name, seconds_per_step=1.0, lr=1e-3, val_losses=evaluated, finished=name != "cola@3e-3")
    found = [arm.name for arm in module.reported_arms(tmp_path)]
    assert found == ["dense", "cola", "cola@3e-3", "cola@2e-3", "cola+vocab@3e-3"]


def test_two_arms_train_report_and_are_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    module = load()
    argv = ["--steps", "2", "--batch-size", "2", "--seq-len", "16", "--eval-every", "1", "--eval-blocks", "2"]
    argv += ["--arms", "dense,cola+head@2e-3", "--runs", "runs", "--out", "out", "--vocab-rank", "8"]
    assert module.main(argv) == 0
    (result_json,) = Path("out").glob("time_to_quality_tiny_*.json")
    result = json.loads(result_json.read_text())["result"]  # under the shared header's command and machine
    assert set(result["arms"]) == {"dense", "cola+head@2e-3"}
    dense, vocab = result["arms"]["dense"], result["arms"]["cola+head@2e-3"]
    assert result["target"] == json.loads(Path("runs/dense/summary.json").read_text())["val_loss"]
    assert 0 < dense["to_dense_loss"]["time_vs_dense"] <= 1.0  # dense reaches its own final loss by its end
    assert [p["step"] for p in vocab["evaluations"]] == [1, 2]
    assert "--factor-vocab 8" in vocab["command"] and vocab["factor_vocab"] == 8 and not vocab["factor_embedding"]
    # Same schedule, another peak: the learning rates of every step stand in the ratio of the peaks.
    assert "--lr 0.002" in vocab["command"] and "--lr" not in dense["command"]
    assert vocab["peak_lr"] / dense["peak_lr"] == pytest.approx(2e-3 / recipe_for("tiny").lr)
    assert vocab["params"] < dense["params"]
    assert result_json.with_suffix(".png").stat().st_size > 0
    assert "| cola+head@2e-3 |" in result_json.with_suffix(".md").read_text()
    # A finished arm is read back, not trained again: its metrics stay as they were.
    metrics = Path("runs/dense/metrics.jsonl").read_text()
    assert module.main([*argv, "--arms", "dense"]) == 0
    assert Path("runs/dense/metrics.jsonl").read_text() == metrics
    # Timed side by side instead: each evaluation sits at step × the arm's median step, and the recorded sum stays.
    assert module.main([*argv, "--report-only", "--step-repeats", "1", "--tag", "_timed"]) == 0
    (timed_json,) = Path("out").glob("time_to_quality_tiny_*_timed.json")
    timed = json.loads(timed_json.read_text())["result"]["arms"]
    for name, arm in timed.items():
        assert arm["step_seconds"] > 0
        assert [p["seconds"] for p in arm["evaluations"]] == [
            p["step"] * arm["step_seconds"] for p in arm["evaluations"]
        ]
        assert arm["recorded_train_seconds"] == result["arms"][name]["train_seconds"]
    assert "timed side by side" in timed_json.with_suffix(".md").read_text()
    with pytest.raises(SystemExit):
        module.main(["--arms", "nope"])
    with pytest.raises(SystemExit):
        module.main(["--arms", "cola@fast"])
    with pytest.raises(SystemExit):
        module.main(["--step-repeats", "-1"])


def fake_run(
    run_dir: Path,
    *,
    seconds_per_step: float,
    lr: float,
    val_losses: dict[int, float],
    finished: bool = True,
    steps: int = 4,
) -> None:
    """A run folder as ``tensorslim train`` leaves it: one metrics line per step (batch 2 × 4 tokens), and a summary
    when it ``finished``."""
    run_dir.mkdir(parents=True)
    lines = [
        {"step": step, "lr": lr, "tokens": 8 * step, "tokens_per_s": 8 / seconds_per_step}
        | {"val_loss": val_losses.get(step)}
        for step in range(1, steps + 1)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    if finished:
        summary = {"params_total": 10, "flops_per_token": 1.0, "tokens_per_s": 1.0}
        (run_dir / "summary.json").write_text(json.dumps(summary))


def test_a_dense_run_at_another_learning_rate_is_a_second_target(tmp_path: Path) -> None:
    module = load()
    fake_run(tmp_path / "dense", seconds_per_step=2.0, lr=6e-3, val_losses={2: 6.0, 4: 5.0})
    fake_run(tmp_path / "dense@2e-3", seconds_per_step=2.0, lr=2e-3, val_losses={2: 5.5, 4: 4.0})
    fake_run(tmp_path / "cola@2e-3", seconds_per_step=1.0, lr=2e-3, val_losses={2: 5.0, 4: 4.5})
    # Stopped after step 2 of 4: reported up to there, its step time compared per step; its loss there is a target.
    fake_run(tmp_path / "dense@1e-3", seconds_per_step=4.0, lr=1e-3, val_losses={2: 4.5}, finished=False, steps=3)
    args = module.parse_args(["--steps", "4", "--batch-size", "2", "--seq-len", "4", "--eval-every", "2"])
    result = module.summarize(args, tmp_path, {})
    assert (result["target"], result["other_targets"]) == (5.0, {"dense@2e-3": 4.0, "dense@1e-3": 4.5})
    cola = result["arms"]["cola@2e-3"]
    assert cola["peak_lr"] == 2e-3
    # cola is at 5.0 (dense's final loss) at step 2: 2 s of dense's 8 s; it never reaches dense@2e-3's 4.0.
    assert cola["to_dense_loss"] == {"seconds": 2.0, "tokens": 16, "time_vs_dense": 0.25, "tokens_vs_dense": 0.5}
    # It reaches dense@1e-3's 4.5 at step 4 (4 s), where dense@1e-3 needed its 2 steps of 4 s.
    assert cola["to_loss_of"] == {
        "dense@2e-3": None,
        "dense@1e-3": {"seconds": 4.0, "tokens": 32, "time_vs_dense": 0.5, "tokens_vs_dense": 1.0},
    }
    assert cola["step_speedup_vs_dense"] == 2.0 and not cola["stopped"]
    stopped = result["arms"]["dense@1e-3"]
    assert (stopped["stopped"], stopped["steps"], stopped["params"], stopped["step_speedup_vs_dense"]) == (
        True,
        2,
        None,
        0.5,
    )
    assert stopped["to_loss_of"]["dense@2e-3"] is None and stopped["to_dense_loss"]["seconds"] == 8.0
    # dense@2e-3 reaches 5.0 halfway between its evaluations at steps 2 (5.5, 4 s) and 4 (4.0, 8 s): at 16/3 s.
    faster = result["arms"]["dense@2e-3"]["to_dense_loss"]
    assert faster["seconds"] == pytest.approx(16 / 3) and faster["time_vs_dense"] == pytest.approx(2 / 3)
    text = "\n".join(module.markdown(result))
    assert "Target: the dense@2e-3 run's final validation loss, **4.0000**." in text
    assert "| cola@2e-3 | not reached | — | — |" in text
    assert "| dense@1e-3 | — | 1.0e-03 | 4.5000 (stopped at step 2) |" in text
    assert "Target: the dense@1e-3 run's validation loss at step 2, where it was stopped, **4.5000**." in text
