"""Training methods by name: how each one restructures a preset model before training.

``dense`` and ``galore`` train the full-rank model (GaLore changes only the optimizer); ``cola`` and ``svd`` convert
every projection inside the blocks with :func:`tensorslim.convert_`. A new method adds one entry to
:data:`CONVERSIONS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from tensorslim.convert import ConversionReport, convert_
from tensorslim.layers.cola_m import CoLAMConfig
from tensorslim.layers.lax import LaXCoLAConfig, LaXSVDConfig
from tensorslim.layers.lax_tt import LaXTTConfig
from tensorslim.layers.lowrank import CoLAConfig, SVDConfig
from tensorslim.layers.tt import TTConfig
from tensorslim.models.llama import LlamaForCausalLM, Preset, get_preset

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")  # LaX-TT's IntraRes_Pos (q, k, v, out)

# method -> (preset, rank override) -> conversion config, or None for a full-rank model.
CONVERSIONS: dict[str, Callable[[Preset, int | None], object | None]] = {
    "dense": lambda preset, rank: None,
    "galore": lambda preset, rank: None,
    # CoLA trains from scratch with its own init (§2.1) and the preset's only_lr_act (§2.2).
    "cola": lambda preset, rank: CoLAConfig(
        rank=rank or preset.cola_rank, init="random", only_lr_act=preset.only_lr_act
    ),
    "svd": lambda preset, rank: SVDConfig(rank=rank or preset.cola_rank, init="random"),
    # CoLA-M (CoLA §4): CoLA plus latent checkpointing of every block; same weights as "cola".
    "cola-m": lambda preset, rank: CoLAMConfig(
        rank=rank or preset.cola_rank, init="random", only_lr_act=preset.only_lr_act
    ),
    # LaX (arXiv 2505.21732): latent crossing between consecutive blocks, Kronecker gates (the paper's LaX configs).
    "lax-cola": lambda preset, rank: LaXCoLAConfig(
        rank=rank or preset.cola_rank, init="random", only_lr_act=preset.only_lr_act
    ),
    "lax-svd": lambda preset, rank: LaXSVDConfig(rank=rank or preset.cola_rank, init="random"),
    # CoMERA (arXiv 2405.14377): 6-core TT projections, max rank 30, CoMERA's random init (rank gates: comera/).
    "comera": lambda preset, rank: TTConfig(rank=rank or 30, init="random"),
    # LaX-TT (arXiv 2505.21732): CoMERA's TT layers + crossing at the middle bond; intra residuals on attention.
    "lax-tt": lambda preset, rank: LaXTTConfig(rank=rank or 30, init="random", intra_res=ATTENTION),
}


def check_method(method: str) -> None:
    if method not in CONVERSIONS:
        raise ValueError(f"method={method!r} is unknown; allowed: {list(CONVERSIONS)}")


def build_model(
    preset_name: str,
    method: str,
    *,
    vocab_size: int | None = None,
    max_seq_len: int | None = None,
    rank: int | None = None,
    device: torch.device | str | None = None,
) -> tuple[LlamaForCausalLM, ConversionReport | None]:
    """Build preset ``preset_name`` and apply ``method``'s conversion.

    Args:
        preset_name: a key of :data:`tensorslim.models.llama.PRESETS`.
        method: a key of :data:`CONVERSIONS`.
        vocab_size: overrides the preset's vocabulary (to match the tokenizer).
        max_seq_len: raised to at least this sequence length.
        rank: overrides the preset's CoLA rank.
        device: ``"meta"`` builds the model without allocating it (for its books).
    """
    check_method(method)
    preset = get_preset(preset_name)
    config = preset.model
    if vocab_size is not None:
        config = replace(config, vocab_size=vocab_size)
    if max_seq_len is not None and max_seq_len > config.max_seq_len:
        config = replace(config, max_seq_len=max_seq_len)
    with torch.device(device or "cpu"):
        model = LlamaForCausalLM(config)
    conversion = CONVERSIONS[method](preset, rank)
    report = convert_(model, conversion) if conversion is not None else None
    return model, report
