"""benchmarks/adapters_costs.py: the long inputs are articles cut to ``--long-tokens``; bad sizes fail early."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "adapters_costs.py"


def load():
    spec = importlib.util.spec_from_file_location("adapters_costs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_long_inputs_are_articles_cut_to_the_token_budget_and_titles_stay_short() -> None:
    costs = load()
    (titles,) = costs.batches(4, 1)
    (articles,) = costs.batches(4, 1, max_tokens=48)
    assert titles["input_ids"].shape[1] < 48 == articles["input_ids"].shape[1]
    assert int(articles["attention_mask"].sum()) == 4 * 48  # every article is longer than 48 tokens
    ids, mask, labels = costs.train_batch(3, 40, articles=True)
    assert ids.shape == mask.shape == (3, 40) and labels.shape == (3,)


@pytest.mark.parametrize("argv", [["--long-tokens", "-1"], ["--long-batch", "0"]])
def test_bad_long_input_sizes_are_a_one_line_error(argv, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        load().main(argv)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "is invalid; allowed: >= 0, >= 1" in error
