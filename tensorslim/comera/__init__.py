"""CoMERA (Yang et al., NeurIPS 2024, arXiv 2405.14377): rank-adaptive tensor-compressed training."""

from tensorslim.comera.gates import (
    enable_gates,
    format_rank_report,
    gate_penalty,
    model_size,
    prune_to_size_,
    rank_report,
    truncate_,
)
from tensorslim.comera.objective import CoMERAConfig, CoMERAObjective
from tensorslim.comera.optim import build_optimizer, param_groups

__all__ = [
    "CoMERAConfig",
    "CoMERAObjective",
    "build_optimizer",
    "enable_gates",
    "format_rank_report",
    "gate_penalty",
    "model_size",
    "param_groups",
    "prune_to_size_",
    "rank_report",
    "truncate_",
]
