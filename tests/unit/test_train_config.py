"""TrainConfig resolves the run's optimizer settings from the method, its options and the model's recipe."""

from __future__ import annotations

from tensorslim.methods.recipes import recipe_for
from tensorslim.train.config import TrainConfig


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
