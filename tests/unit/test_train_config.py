"""TrainConfig resolves the run's optimizer settings from the method, its options and the model's recipe."""

from __future__ import annotations

import dataclasses

import pytest

from tensorslim.methods.recipes import DEFAULT_RECIPE, RECIPES, recipe_for
from tensorslim.train.config import TrainConfig
from tensorslim.train.optim import galore_projection_rank


def test_galore_settings_come_from_the_method_options_and_the_recipe() -> None:
    default = TrainConfig(method="galore").optimizer_settings()
    # GaLore, arXiv 2403.03507, official settings: rank = the CoLA rank of the size, gap 200, scale 0.25, lr 0.01
    assert default == {
        "lr": 0.01,
        "weight_decay": 0.01,
        "state_dtype": "fp32",
        "galore_rank": recipe_for("tiny").cola_rank or 128,
        "galore_update_proj_gap": 200,
        "galore_scale": 0.25,
    }
    chosen = TrainConfig(method="galore", lr=0.02, options={"rank": 4, "update_proj_gap": 50, "scale": 0.5})
    settings = chosen.optimizer_settings()
    assert (settings["lr"], settings["galore_rank"], settings["galore_update_proj_gap"], settings["galore_scale"]) == (
        0.02,
        4,
        50,
        0.5,
    )


def test_adamw_settings_carry_no_galore_projection() -> None:
    settings = TrainConfig(method="cola", weight_decay=0.1, optimizer_state="bf16").optimizer_settings()
    # CoLA trains at the model recipe's lr (CoLA, arXiv 2502.10940, §4)
    assert settings == {"lr": recipe_for("tiny").lr, "weight_decay": 0.1, "state_dtype": "bf16"}


def test_lr_schedule_warms_up_over_the_recipe_share_then_decays_to_the_floor() -> None:
    recipe = recipe_for("tiny")
    schedule = TrainConfig(steps=200, min_lr_ratio=0.2).lr_schedule()
    warmup = round(200 * recipe.warmup_fraction)
    assert (schedule.peak_lr, schedule.total_steps, schedule.warmup_steps) == (recipe.lr, 200, warmup)
    # linear warm-up to the peak, then a half cosine to the floor (GaLore §5, CoLA §4)
    assert schedule.factor(0) == 1 / warmup and schedule.factor(warmup - 1) == 1.0
    assert schedule.factor(200) == pytest.approx(0.2)
    assert TrainConfig(steps=200, warmup_fraction=0.0).lr_schedule().factor(0) == 1.0


def test_galore_rank_is_the_given_one_else_the_size_s_cola_rank_else_128() -> None:
    # GaLore (arXiv 2403.03507, §5) and CoLA (arXiv 2502.10940, §4) use the same rank at each LLaMA size
    assert galore_projection_rank(RECIPES["1b"].cola_rank) == 512
    assert galore_projection_rank(RECIPES["1b"].cola_rank, rank=8) == 8
    assert DEFAULT_RECIPE.cola_rank is None and galore_projection_rank(DEFAULT_RECIPE.cola_rank) == 128


def test_a_replaced_preset_brings_its_own_recipe() -> None:
    tiny = TrainConfig(method="galore", options={"update_proj_gap": 50})
    bigger = dataclasses.replace(tiny, preset="1b", method="cola", options=None)
    tokens = bigger.batch_size * bigger.seq_len
    assert (bigger.peak_lr(), bigger.warmup()) == (RECIPES["1b"].lr_at(tokens), RECIPES["1b"].warmup_fraction)
    assert dataclasses.replace(tiny, preset="1b").optimizer_settings()["galore_rank"] == RECIPES["1b"].cola_rank == 512


def test_the_recipe_lr_holds_at_the_papers_batch_and_shrinks_with_the_fourth_root_below_it() -> None:
    sixty = RECIPES["60m"]
    assert sixty.batch_tokens == 512 * 256  # GaLore §5 / CoLA: 512 sequences of 256 tokens per update
    assert sixty.lr_at(512 * 256) == sixty.lr_at(10**7) == 6e-3
    assert sixty.lr_at(1024) == pytest.approx(6e-3 * (1024 / (512 * 256)) ** 0.25)  # 1.78e-3
    assert RECIPES["tiny"].lr_at(1024) == 6e-3 and DEFAULT_RECIPE.lr_at(1024) == DEFAULT_RECIPE.lr
    run = TrainConfig(preset="60m", batch_size=4, seq_len=256, grad_accum=2)
    assert run.peak_lr() == pytest.approx(sixty.lr_at(2048))
    assert dataclasses.replace(run, lr=5e-3).peak_lr() == 5e-3  # a given rate wins
