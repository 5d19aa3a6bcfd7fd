"""Training recipes per model: the learning rate, warm-up and CoLA rank that the papers pair with each size.

The LLaMA sizes follow CoLA (Liu et al., 2025, arXiv 2502.10940, §4 and Appendix: rank, ``only_lr_act`` and peak
learning rate per size) and GaLore's 60M-7B setup (Zhao et al., 2024, arXiv 2403.03507, §5). ``tiny`` is ours (a
CPU-sized model with the 60M ratios). Models without a paper recipe get :data:`DEFAULT_RECIPE`, whose rank is left to
the layer config's ``rank_ratio`` (a quarter of ``min(d_in, d_out)``, CoLA's r = d/4).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """Method settings that go with one model size.

    Attributes:
        lr: peak learning rate of every method except GaLore (which brings its own).
        warmup_fraction: linear warm-up share of the steps.
        cola_rank: latent rank of CoLA/SVD/LaX layers and GaLore's projection rank; None: ``rank_ratio``.
        only_lr_act: CoLA's configs drop the SwiGLU activation from 350M on (§2.2), keeping σ on the latents only.
    """

    lr: float
    warmup_fraction: float = 0.1
    cola_rank: int | None = None
    only_lr_act: bool = False


DEFAULT_RECIPE = Recipe(lr=5e-4)

RECIPES: dict[str, Recipe] = {
    "tiny": Recipe(lr=6e-3, warmup_fraction=0.1, cola_rank=64),
    "60m": Recipe(lr=6e-3, warmup_fraction=0.2, cola_rank=128),
    "130m": Recipe(lr=3e-3, cola_rank=256),
    "350m": Recipe(lr=3e-3, cola_rank=256, only_lr_act=True),
    "1b": Recipe(lr=2e-3, cola_rank=512, only_lr_act=True),
    "7b": Recipe(lr=1e-3, cola_rank=1024, only_lr_act=True),
}


def recipe_for(model_name: str) -> Recipe:
    """The recipe of ``model_name``, or :data:`DEFAULT_RECIPE` for models the papers do not size."""
    return RECIPES.get(model_name, DEFAULT_RECIPE)
