"""experiments/adapters_protocol.py: a real (one-step) sweep through the Trainer, the summary it writes, and its
errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))  # the scripts import each other by name

from adapters_protocol import chosen_lr, main, summarize, write_summary  # noqa: E402


def test_finetune_runs_methods_through_the_trainer_and_writes_table_and_figure(tmp_path, capsys) -> None:
    out = tmp_path / "adapters"
    argv = ["--adapter", "unipelt+prompt", "--train-size", "16", "--seeds", "1", "--dev-size", "16"]
    argv += ["--epochs", "1", "--prompt-init", "labels", "--out", str(out), "--run-dir", str(tmp_path / "runs")]
    assert main(argv) == 0
    runs = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    assert [(r["method"], r["lr"], r.get("prompt_init")) for r in runs] == [
        ("tfidf-logreg", 0.0, None),
        ("unipelt-prompt", 1e-3, "labels"),
        ("unipelt-prompt", 5e-3, "labels"),
        ("unipelt-prompt", 2e-2, "labels"),
    ]
    trained = runs[1]
    assert trained["steps"] == 1 and 0 <= trained["test_accuracy"] <= 1 and trained["inference_ratio"] > 0
    assert trained["trainable"] == 2_766_637  # UniPELT + prompt on MiniLM, plus its 5-class head (1,925)
    table = out.with_suffix(".md").read_text()
    assert "| unipelt-prompt (init labels) | " in table and "--prompt-init labels" in table
    assert out.with_suffix(".png").stat().st_size > 0


def test_summary_picks_the_learning_rate_by_development_accuracy(tmp_path) -> None:
    runs = [
        {
            "method": "lora",
            "k": 100,
            "seed": s,
            "lr": lr,
            "dev_accuracy": dev,
            "test_accuracy": test,
            "trainable": 10,
            "step_s": 1.0,
            "inference_ratio": 1.1,
            "grid": [1e-3, 5e-3],
        }
        for s, lr, dev, test in [(0, 1e-3, 0.5, 0.9), (0, 5e-3, 0.6, 0.4), (1, 1e-3, 0.7, 0.8), (1, 5e-3, 0.2, 0.1)]
    ]
    summary = summarize([*runs, {**runs[0], "seed": 2}])  # seed 2 lacks one learning rate: left out
    (row,) = summary["table"]
    assert row["seeds"] == 2 and abs(row["mean"] - 60.0) < 1e-9  # seed 0 → 40 % (dev 0.6), seed 1 → 80 %
    write_summary(summary, tmp_path / "s")
    assert "60.0 ± 28.3 (2)" in (tmp_path / "s.md").read_text()


def test_unknown_adapter_is_a_one_line_error(tmp_path, capsys) -> None:
    assert main(["--adapter", "ia3", "--out", str(tmp_path / "x")]) == 2
    error = capsys.readouterr().err.strip()
    assert "adapter='ia3' is unknown" in error and "\n" not in error


def test_lr_from_reuses_the_rate_chosen_most_often_on_the_development_set() -> None:
    def run(seed: int, lr: float, dev: float) -> dict:
        return {"method": "lora", "k": 100, "seed": seed, "lr": lr, "dev_accuracy": dev, "grid": [1e-3, 5e-3]}

    # 5e-3 wins seeds 0 and 1, 1e-3 wins seed 2 (by far): the majority, not the mean, decides.
    runs = [run(0, 1e-3, 0.5), run(0, 5e-3, 0.6), run(1, 1e-3, 0.5), run(1, 5e-3, 0.55)]
    runs += [run(2, 1e-3, 0.9), run(2, 5e-3, 0.1)]
    assert chosen_lr(runs, "lora", 100) == 5e-3
    # One seed each: the tie goes to the higher mean development accuracy (1e-3: 0.7 vs 0.35).
    assert chosen_lr(runs[:2] + runs[4:], "lora", 100) == 1e-3
    with pytest.raises(ValueError, match="no complete lora grid at K=500"):
        chosen_lr(runs, "lora", 500)


def test_a_run_with_its_own_grid_is_complete_with_that_grid() -> None:
    run = {"method": "lora", "k": 1000, "seed": 0, "dev_accuracy": 0.5, "test_accuracy": 0.7, "trainable": 1}
    # One rate reused from another K (--lr-from): complete; without a grid field it needs LR_GRIDS["lora"].
    (row,) = summarize([{**run, "lr": 5e-3, "grid": [5e-3]}])["table"]
    assert (row["k"], row["seeds"], row["mean"]) == (1000, 1, 70.0)
    assert summarize([{**run, "lr": 5e-3}])["table"] == []


def test_costs_from_the_side_by_side_benchmark_replace_the_sweeps(tmp_path) -> None:
    from adapters_protocol import use_costs

    run = {"method": "lora", "k": 100, "seed": 0, "lr": 5e-3, "dev_accuracy": 0.5, "test_accuracy": 0.7}
    records = [{**run, "grid": [5e-3], "trainable": 1, "step_s": 1.0, "inference_ratio": 1.4}]
    records.append({**records[0], "method": "prompt", "step_s": 9.0, "prompt_combine": "prefix_after_bos"})
    variant = {"method": "unipelt-prompt", "prompt_lr_scale": 1.0, "prompt_combine": "prefix_after_bos"}
    records.append({**records[1], **variant})  # a variant: its method's costs
    summary = summarize(records)
    measured = {"table": {"lora": 1.02, "prompt": 1.9, "unipelt-prompt": 2.0}, "step_seconds": {"lora": 0.2}}
    measured["step_seconds"].update({"prompt": 0.3, "unipelt-prompt": 0.4})
    use_costs(summary, {**measured, "command": "python benchmarks/x.py"})
    rows = {row["method"]: row for row in summary["table"]}
    assert (rows["lora"]["inference_ratio"], rows["prompt"]["step_s"]) == (1.02, 0.3)
    assert (
        rows["unipelt-prompt (prompt lr ×1)"]["inference_ratio"],
        rows["unipelt-prompt (prompt lr ×1)"]["step_s"],
    ) == (2.0, 0.4)
    assert summary["commands"][-1] == "python benchmarks/x.py"
    write_summary(summary, tmp_path / "s")
    assert "| prompt | 70.0 ± 0.0 (1) | 1 | 1.50× | 1.90× |" in (tmp_path / "s.md").read_text()


def test_costs_never_measured_show_a_dash_not_nan(tmp_path) -> None:
    """Without a LoRA row there is no step ratio, and a run without inference timing has no inference ratio."""
    run = {"method": "adapter", "k": 100, "seed": 0, "lr": 5e-3, "dev_accuracy": 0.5, "test_accuracy": 0.7}
    write_summary(summarize([{**run, "grid": [5e-3], "trainable": 3, "step_s": 1.0}]), tmp_path / "s")
    text = (tmp_path / "s.md").read_text()
    assert "| adapter | 70.0 ± 0.0 (1) | 3 | — | — |" in text and "nan" not in text


def test_adapter_methods_default_to_a_rate_of_their_finetune_grid() -> None:
    from adapters_protocol import LR_GRIDS

    from tensorslim.train.config import TrainConfig

    for method in ("lora", "prefix", "adapter", "prompt", "unipelt", "unipelt-prompt", "peft-lora", "peft-prompt"):
        config = TrainConfig(preset="minilm", task="classify", method=method, data="bbcnews-titles")
        assert config.peak_lr() in LR_GRIDS[method], method  # the sweep's choice, not the model recipe's
    assert TrainConfig(preset="minilm", method="prompt", lr=1e-3).peak_lr() == 1e-3  # a given rate wins


def test_the_table_puts_all_of_the_training_split_after_the_sizes(tmp_path) -> None:
    run = {"method": "lora", "seed": 0, "lr": 5e-3, "dev_accuracy": 0.5, "test_accuracy": 0.7, "grid": [5e-3]}
    write_summary(summarize([{**run, "k": 0}, {**run, "k": 100}, {**run, "k": 1000}]), tmp_path / "s")
    assert "| method | K=100 | K=1000 | K=all |" in (tmp_path / "s.md").read_text()


def test_prompt_init_labels_is_the_class_names_vocab_the_frequent_tokens_random_nothing_else_the_text() -> None:
    from adapters_protocol import prompt_init_options

    names = ["business", "sports"]
    assert prompt_init_options("labels", names) == {"prompt_init_text": "business sports"}
    assert prompt_init_options("vocab", names) == {"prompt_init_vocab": 5000}
    assert prompt_init_options("random", names) == {}
    assert prompt_init_options("a news topic", names) == {"prompt_init_text": "a news topic"}


def test_runs_with_another_prompt_init_get_a_row_of_their_own() -> None:
    from adapters_protocol import variant

    vocab = {"method": "unipelt-prompt", "prompt_lr_scale": 10.0, "prompt_init": "vocab"}
    assert variant({**vocab, "prompt_combine": "prefix_after_bos"}) == "unipelt-prompt (init vocab)"
    assert variant(vocab) == "unipelt-prompt (init vocab) (before [CLS])"  # from before --prompt-combine
    assert variant({"method": "prompt", "prompt_init": "random"}) == "prompt (before [CLS])"  # before the option
    assert variant({"method": "unipelt-prompt"}) == "unipelt-prompt (prompt lr ×1) (before [CLS])"  # before all three
    assert variant({"method": "lora", "prompt_init": None}) == "lora"
    after = {"method": "prompt", "prompt_init": "random", "prompt_combine": "prefix_after_bos"}
    assert variant(after) == "prompt"
    assert variant({**after, "prompt_combine": "prefix"}) == "prompt (before [CLS])"
    assert variant({"method": "peft-prompt", "prompt_combine": "prefix"}) == "peft-prompt"  # peft's only placement


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (["--prompt-init", "vocab"], "SAMPLE_VOCAB draws from the whole vocabulary"),
        (["--prompt-combine", "prefix_after_bos"], "peft puts its prompt before the input"),
    ],
)
def test_vocab_init_or_prompt_after_cls_with_peft_prompt_is_a_one_line_error(tmp_path, capsys, flag, message) -> None:
    argv = ["--adapter", "prompt,peft-prompt", *flag, "--out", str(tmp_path / "x")]
    assert main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and "\n" not in error


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (["--batch-size", "0"], "--batch-size=0 is invalid"),
        (["--seeds", "0"], "--seeds=0 is invalid"),
        (["--first-seed", "-1"], "--first-seed=-1 is invalid"),
        (["--train-size", "100", "-5"], "--train-size=-5 is invalid"),
        (["--seq-len", "1"], "--seq-len=1 is invalid"),
        (["--epochs", "0"], "--epochs=0.0 is invalid"),
        (["--epochs", "nan"], "--epochs=nan is invalid"),
    ],
)
def test_sizes_that_make_no_sweep_are_a_one_line_error(tmp_path, capsys, flag, message) -> None:
    assert main(["--adapter", "lora", *flag, "--out", str(tmp_path / "x")]) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and "\n" not in error
    assert not (tmp_path / "x.jsonl").exists()  # refused before any run


def test_blank_prompt_init_is_a_one_line_error(tmp_path, capsys) -> None:
    assert main(["--adapter", "prompt", "--prompt-init", " ", "--out", str(tmp_path / "x")]) == 2
    error = capsys.readouterr().err.strip()
    assert "prompt_init=' ' is invalid" in error and "\n" not in error
    assert not (tmp_path / "x.jsonl").exists()  # refused before any run


def test_runs_with_another_prompt_init_are_not_taken_for_done(tmp_path) -> None:
    from adapters_protocol import _key

    run = {"method": "prompt", "k": 100, "seed": 0, "lr": 5e-2}
    assert _key({**run, "prompt_init": "labels"}) != _key(run)  # runs from before the option started at random


def test_the_trainer_schedules_the_prompt_group_at_its_multiple_of_the_run_rate(tmp_path) -> None:
    from tensorslim.train.config import TrainConfig
    from tensorslim.train.trainer import Trainer

    config = TrainConfig(
        preset="minilm",
        task="classify",
        method="unipelt-prompt",
        options={"prompt_lr_scale": 4.0},
        data="bbcnews-titles",
        task_options={"train_size": 16, "dev_size": 16},
        steps=2,
        batch_size=4,
        seq_len=8,
        lr=1e-3,
        warmup_fraction=0.0,
        min_lr_ratio=0.5,
        eval_every=2,
        checkpoint_every=10**9,
        out_dir=str(tmp_path / "run"),
        progress=False,
        tensorboard=False,
    )
    trainer = Trainer(config)
    other, prompt = trainer.optimizer.param_groups
    assert [id(p) for p in prompt["params"]] == [id(trainer.model.pelt_prompt.weight)]
    trainer.run()
    assert 1e-3 * 0.5 <= other["lr"] < 1e-3  # the schedule has decayed the run's rate after a step
    assert prompt["lr"] == 4.0 * other["lr"]


def test_runs_at_another_prompt_rate_are_another_row_and_not_taken_for_done() -> None:
    from adapters_protocol import _key, variant

    old = {"method": "unipelt-prompt", "k": 100, "seed": 0, "lr": 5e-3, "prompt_combine": "prefix_after_bos"}
    new = {**old, "prompt_lr_scale": 10.0}  # old is from before --prompt-lr-scale: ×1
    assert _key(old) != _key(new) and _key({**old, "prompt_lr_scale": 1.0}) == _key(old)
    assert (variant(new), variant(old)) == ("unipelt-prompt", "unipelt-prompt (prompt lr ×1)")
    after = {"method": "prompt", "prompt_combine": "prefix_after_bos"}
    assert variant({**after, "prompt_lr_scale": 1.0}) == "prompt" == variant(after)
    assert variant({"method": "lora"}) == "lora"
    runs = [
        {**run, "lr": lr, "dev_accuracy": dev, "test_accuracy": test, "grid": [1e-3, 5e-3]}
        for run in (old, new)
        for lr, dev, test in [(1e-3, 0.5, 0.9), (5e-3, 0.6, 0.4 if run is old else 0.8)]
    ]
    rows = {row["method"]: row["mean"] for row in summarize(runs)["table"]}
    assert rows == {"unipelt-prompt": 80.0, "unipelt-prompt (prompt lr ×1)": 40.0}
    assert chosen_lr(runs, "unipelt-prompt", 100) == 5e-3


def test_middle_rates_run_one_rate_per_method_and_runs_of_other_lengths_are_not_done() -> None:
    import argparse

    from adapters_protocol import LR_GRIDS, _grid, _key, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--rates", "middle", "--epochs", "15"])
    assert _grid(args, "dense", 100, []) == (2e-4,) and _grid(args, "unipelt-prompt", 100, []) == (5e-3,)
    assert _grid(parser.parse_args([]), "lora", 100, []) == LR_GRIDS["lora"]
    below = parser.parse_args(["--rates", "below"])  # one step of the grid's lowest ratio under its lowest rate
    assert _grid(below, "lora", 100, []) == (2e-4,) and _grid(below, "prompt", 100, []) == (2e-3,)
    run = {"method": "lora", "k": 100, "seed": 0, "lr": 5e-3, "steps": 32}
    assert _key(run) != _key({**run, "steps": 96})


def test_runs_that_trained_the_pooler_get_a_row_of_their_own_and_are_not_taken_for_done() -> None:
    from adapters_protocol import _key, variant

    run = {"method": "lora", "k": 100, "seed": 0, "lr": 5e-3}
    assert variant({**run, "train_pooler": True}) == "lora (pooler trained)"
    assert variant(run) == variant({**run, "train_pooler": False}) == "lora"  # runs from before the option: frozen
    assert _key({**run, "train_pooler": True}) != _key(run) == _key({**run, "train_pooler": False})
    assert variant({"method": "dense", "train_pooler": True}) == "dense"  # dense trains it, no choice
