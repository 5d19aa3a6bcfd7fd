"""Full-rank training: ``dense`` (AdamW) and ``galore`` (GaLore-AdamW, Zhao et al., 2024, arXiv 2403.03507).

GaLore changes only the optimizer: the gradients of the blocks' 2-D weights are projected to rank r, refreshed by an
SVD every ``update_proj_gap`` steps and scaled by α (§4; the official ``torchrun_main.py`` settings: r = the CoLA
rank of the size, gap 200, α 0.25, lr 0.01).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tensorslim._checks import check_fields, require_int
from tensorslim.methods.registry import Method, register_method
from tensorslim.options import option


@dataclass(frozen=True, kw_only=True)
class GaLoreOptions:
    """GaLore's projection settings."""

    rank: int | None = option(None, "projection rank (default: the model's CoLA rank, else 128)")
    update_proj_gap: int = option(200, "GaLore: steps between projector SVDs", flag="galore-update-proj-gap")
    scale: float = option(0.25, "GaLore: update scale alpha", flag="galore-scale")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.rank is not None:
            require_int("rank", self.rank)
        require_int("galore_update_proj_gap", self.update_proj_gap)
        if not 0 < self.scale < math.inf:
            raise ValueError(f"galore_scale={self.scale!r} is invalid; allowed: a finite number > 0")


register_method(
    Method(name="dense", help="the full-rank model with AdamW (the baseline)", tensor_parallel=("megatron",))
)
register_method(
    Method(
        name="galore",
        help="full-rank model, GaLore-AdamW low-rank gradient projection (arXiv 2403.03507)",
        optimizer="galore",
        options=GaLoreOptions,
        lr=0.01,
        data_parallel=("ddp",),
        parallel_note="GaLore's projector is an SVD of each whole gradient matrix; FSDP2 and TP hold only blocks of it",
    )
)
