"""Training recipes per model: the learning rate, warm-up and CoLA rank that the papers pair with each size.

The LLaMA sizes follow CoLA (Liu et al., 2025, arXiv 2502.10940, §4 and Appendix: rank, ``only_lr_act`` and peak
learning rate per size) and GaLore's 60M-7B setup (Zhao et al., 2024, arXiv 2403.03507, §5). ``tiny`` is ours (a
CPU-sized model with the 60M ratios). Models without a paper recipe get :data:`DEFAULT_RECIPE`, whose rank is left to
the layer config's ``rank_ratio`` (a quarter of ``min(d_in, d_out)``, CoLA's r = d/4).

The papers train every size at one batch, 512 sequences of 256 tokens per update. At the far smaller batches of a
CPU or a single GPU their peak learning rates are too high: CoLA's 6e-3 for 60M spikes and stalls at 1,024 tokens a
step, and so does dense. :meth:`Recipe.lr_at` therefore scales the rate down below the papers' batch (ours, not the
papers'); at their batch and above it is theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

PAPER_BATCH_TOKENS = 512 * 256  # CoLA and GaLore: 512 sequences of 256 tokens per update (GaLore §5)


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """Method settings that go with one model size.

    Attributes:
        lr: peak learning rate of every method except GaLore (which brings its own), at ``batch_tokens``.
        batch_tokens: tokens per update that ``lr`` was set for; None: ``lr`` holds at any batch.
        warmup_fraction: linear warm-up share of the steps.
        cola_rank: latent rank of CoLA/SVD/LaX layers and GaLore's projection rank; None: ``rank_ratio``.
        only_lr_act: CoLA's configs drop the SwiGLU activation from 350M on (§2.2), keeping σ on the latents only.
    """

    lr: float
    batch_tokens: int | None = PAPER_BATCH_TOKENS
    warmup_fraction: float = 0.1
    cola_rank: int | None = None
    only_lr_act: bool = False

    def lr_at(self, tokens_per_step: int) -> float:
        """The peak learning rate for ``tokens_per_step`` tokens per update: ``lr`` at ``batch_tokens`` and above,
        ``lr · (tokens_per_step / batch_tokens)^¼`` below.

        The fourth root is ours: it sits between no scaling (unstable at small batches) and Adam's square-root rule
        (Malladi et al., 2022, arXiv 2205.10287), and at 1,024 tokens it gives 60M 1.8e-3, next to the best rate
        measured there (2e-3 of 6e-3, 3e-3 and 2e-3; ``benchmarks/time_to_quality.py``).
        """
        if self.batch_tokens is None or tokens_per_step >= self.batch_tokens:
            return self.lr
        return self.lr * (tokens_per_step / self.batch_tokens) ** 0.25


DEFAULT_RECIPE = Recipe(lr=5e-4, batch_tokens=None)

RECIPES: dict[str, Recipe] = {
    "tiny": Recipe(lr=6e-3, batch_tokens=None, warmup_fraction=0.1, cola_rank=64),
    "60m": Recipe(lr=6e-3, warmup_fraction=0.2, cola_rank=128),
    "130m": Recipe(lr=3e-3, cola_rank=256),
    "350m": Recipe(lr=3e-3, cola_rank=256, only_lr_act=True),
    "1b": Recipe(lr=2e-3, cola_rank=512, only_lr_act=True),
    "7b": Recipe(lr=1e-3, cola_rank=1024, only_lr_act=True),
}


def recipe_for(model_name: str) -> Recipe:
    """The recipe of ``model_name``, or :data:`DEFAULT_RECIPE` for models the papers do not size."""
    return RECIPES.get(model_name, DEFAULT_RECIPE)
