"""``tensorslim longeval``: baselines side by side in one run, and one-line errors with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tensorslim.cli.main import main


def test_compare_runs_every_baseline_with_bounded_peaks(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    argv = ["longeval", "--preset", "tiny", "--data", "bbc-tech", "--length", "96", "--docs", "1"]
    assert main([*argv, "--memory", "lra", "--capacity", "32", "--chunk", "16", "--compare", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    names = [row["memory"] for row in rows]
    assert names == [
        "full attention",
        "fifo @ 32",
        "fifo+4 sinks @ 32",
        "h2o+4 sinks @ 32",
        "lra+4 sinks @ 32",
        "lfa+4 sinks @ 32",
    ]
    assert rows[0]["peak_entries"] == 96 and all(row["peak_entries"] == 32 + 16 for row in rows[1:])
    assert all(row["tokens"] == 96 and row["perplexity"] > 1 for row in rows)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--capacity", "8", "--chunk", "16"], "capacity=8 is smaller than chunk=16; allowed: >= chunk"),
        (["--memory", "lru"], "policy='lru' is unknown; allowed: ['fifo', 'lra', 'lfa', 'h2o']"),
        (["--wait", "-1"], "wait=-1 is invalid; allowed: an integer >= 0"),
        (["--wait", "8"], "wait=8 needs a bidirectional model"),
        (["--preset", "bert-tiny"], "has no attention layer we can equip; allowed: tensorslim LLaMA"),
        (["--data", "wiki"], "data='wiki' is unknown; allowed:"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(flags: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    argv = ["longeval", "--length", "32", "--docs", "1", "--capacity", "16", "--chunk", "16", *flags]
    if "--preset" not in flags:
        argv += ["--preset", "tiny"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err


def test_lookahead_task_trains_minilm_with_a_waiting_memory_through_the_trainer(tmp_path: Path) -> None:
    """The wiring of experiments/memory_lookahead.py: the Trainer builds MiniLM for ``lookahead``, the memory is
    equipped in place (same parameters, so the optimizer still updates them) and one step trains through it."""
    import torch

    from tensorslim.layers.memory import MemoryConfig, equip_memory_, memory_stores
    from tensorslim.train.config import TrainConfig
    from tensorslim.train.trainer import Trainer

    config = TrainConfig(
        preset="minilm",
        task="lookahead",
        method="dense",
        steps=1,
        batch_size=2,
        seq_len=24,
        lr=1e-4,
        eval_every=1,
        eval_blocks=4,
        checkpoint_every=1,
        progress=False,
        tensorboard=False,
        out_dir=str(tmp_path / "run"),
        task_options={"max_distance": 8, "examples": 8},
    )
    trainer = Trainer(config)
    equip_memory_(trainer.model, MemoryConfig(capacity=16, chunk=4, wait=8))
    store = memory_stores(trainer.model)[0]
    before = trainer.model.bert.encoder.layer[0].attention.self.q_proj.weight.detach().clone()
    result = trainer.run()
    after = trainer.model.bert.encoder.layer[0].attention.self.q_proj.weight
    assert not torch.equal(before, after) and store.peak <= 16 + 4
    assert 0.0 <= result.val_metrics["val_accuracy"] <= 1.0
