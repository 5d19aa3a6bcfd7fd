"""The layer contract matrix: one row per layer family × config, every row passes the same checks.

The checks are in ``tests/unit/test_contracts.py`` (after peft's ``tests/test_custom_models.py``). A row converts a
tiny dense toy model with ``convert_``, so each family is exercised the way a real model uses it: two blocks in an
``nn.ModuleList`` (named ``blocks.0.up`` …, so that LaX's crossings and CoLA-M's block checkpoints take effect), each
``x + down(silu(up(x)))`` with a biased ``up`` (8 → 12) and an unbiased ``down`` (12 → 8); embedding families convert
a 31-row ``nn.Embedding``. A new layer family is one more row.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.convert import convert_
from tensorslim.layers.cola_m import CoLAMConfig, CoLAMLinear
from tensorslim.layers.kron import KronConfig, KronLinear
from tensorslim.layers.lax import LaXCoLAConfig, LaXLinear, LaXSVDConfig
from tensorslim.layers.lax_tt import LaXTTConfig, LaXTTLinear
from tensorslim.layers.lowrank import CoLAConfig, LowRankLinear, SVDConfig
from tensorslim.layers.tt import TTConfig, TTLinear
from tensorslim.layers.tt_embedding import TTEmbedding, TTEmbeddingConfig
from tensorslim.registry import ConversionReport

D_MODEL, D_HIDDEN, VOCAB = 8, 12, 31  # 31 rows: the TTM modes pad them to 32
BATCH, SEQ = 2, 3


class ToyBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(D_MODEL, D_HIDDEN)
        self.down = nn.Linear(D_HIDDEN, D_MODEL, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.silu(self.up(x)))


class ToyStack(nn.Module):
    """Two residual MLP blocks; ``blocks.1.up`` crosses ``blocks.0.up`` under LaX."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([ToyBlock(), ToyBlock()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class ToyEmbedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids)


@dataclass(frozen=True)
class Row:
    """One layer family × config.

    Attributes:
        id: the test id.
        config: what ``convert_`` is called with.
        layer: the class ``convert_`` puts in.
        dense: whether every converted layer has a dense equivalent (``to_dense()``); when False, at least one
            converted layer must refuse ``to_dense()`` with a ``ValueError`` (no silent densification).
        embedding: the row converts an ``nn.Embedding`` (integer inputs) instead of linear layers.
    """

    id: str
    config: object
    layer: type[nn.Module]
    dense: bool
    embedding: bool = False

    def __str__(self) -> str:
        return self.id


ROWS: list[Row] = [
    Row("cola", CoLAConfig(rank=4), LowRankLinear, dense=False),
    Row("cola-rank-gates", CoLAConfig(rank=4, rank_gates=True), LowRankLinear, dense=False),
    Row("svd", SVDConfig(rank=4), LowRankLinear, dense=True),
    Row("cola-m", CoLAMConfig(rank=4), CoLAMLinear, dense=False),
    Row("lax-cola", LaXCoLAConfig(rank=4), LaXLinear, dense=False),
    Row("lax-svd", LaXSVDConfig(rank=4, crossing="dense"), LaXLinear, dense=False),
    Row("tt", TTConfig(rank=3, n_cores=4), TTLinear, dense=True),
    Row("tt-rank-gates", TTConfig(rank=3, n_cores=4, rank_gates=True), TTLinear, dense=True),
    Row("lax-tt", LaXTTConfig(rank=3, n_cores=4), LaXTTLinear, dense=False),
    Row("tt-embedding", TTEmbeddingConfig(rank=3, n_cores=3), TTEmbedding, dense=True, embedding=True),
    Row("kron", KronConfig(), KronLinear, dense=True),
    Row("kron-rank-2", KronConfig(rank=2), KronLinear, dense=True),
]


def dense_model(row: Row, *, seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Module:
    """The row's dense toy model (``ToyStack`` or ``ToyEmbedding``), seeded."""
    torch.manual_seed(seed)
    model = ToyEmbedding() if row.embedding else ToyStack()
    return model.to(dtype)


def converted(
    row: Row, *, seed: int = 0, dtype: torch.dtype = torch.float64, random_init: bool = False
) -> tuple[nn.Module, ConversionReport]:
    """The row's toy model converted with its config (``init="random"`` with ``random_init``)."""
    model = dense_model(row, seed=seed, dtype=dtype)
    config = dataclasses.replace(row.config, init="random") if random_init else row.config
    return model, convert_(model, config)


def sample_inputs(row: Row, *, seed: int = 0, dtype: torch.dtype = torch.float64, device: str = "cpu") -> torch.Tensor:
    """``(BATCH, SEQ, D_MODEL)`` activations, or ``(BATCH, SEQ)`` distinct token ids for an embedding row."""
    generator = torch.Generator().manual_seed(seed)
    if row.embedding:
        return torch.randperm(VOCAB, generator=generator)[: BATCH * SEQ].view(BATCH, SEQ).to(device)
    return torch.randn(BATCH, SEQ, D_MODEL, generator=generator, dtype=dtype).to(device)


def converted_layers(model: nn.Module, row: Row) -> dict[str, nn.Module]:
    """``{qualified name: layer}`` of the row's layer class in ``model``."""
    return {name: module for name, module in model.named_modules() if isinstance(module, row.layer)}
