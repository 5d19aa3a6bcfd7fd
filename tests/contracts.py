"""The layer contract matrix: one row per layer family × config, every row passes the same checks.

The checks are in ``tests/unit/test_contracts.py`` (after peft's ``tests/test_custom_models.py``). A row converts a
tiny dense toy model with ``convert_``, so each family is exercised the way a real model uses it: two blocks in an
``nn.ModuleList`` (named ``blocks.0.up`` …, so that LaX's crossings and CoLA-M's block checkpoints take effect), each
``x + down(silu(up(x)))`` with a biased ``up`` (8 → 12) and an unbiased ``down`` (12 → 8); embedding families convert
a 31-row ``nn.Embedding``. A new layer family is one more row.

Every module swap is also a row of :data:`REFUSALS`: a family with a config it must refuse, called the way users call
it; the refused call must leave the model bit-identical (module types, parameter and buffer values, ``requires_grad``
flags, hooks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.convert import convert_
from tensorslim.layers.cola_m import CoLAMConfig, CoLAMLinear
from tensorslim.layers.kron import KronConfig, KronLinear
from tensorslim.layers.lax import LaXCoLAConfig, LaXLinear, LaXSVDConfig
from tensorslim.layers.lax_tt import LaXTTConfig, LaXTTLinear
from tensorslim.layers.lowrank import CoLAConfig, LowRankLinear, SVDConfig
from tensorslim.layers.lowrank_embedding import LowRankEmbedding, LowRankEmbeddingConfig
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
        bad: fields that turn ``config`` into one the toy model's layers cannot take (``convert_`` must refuse it).
    """

    id: str
    config: object
    layer: type[nn.Module]
    dense: bool
    embedding: bool = False
    bad: dict[str, Any] = dataclasses.field(default_factory=lambda: {"rank": 1000})

    def __str__(self) -> str:
        return self.id


ROWS: list[Row] = [
    Row("cola", CoLAConfig(rank=4), LowRankLinear, dense=False),
    Row("cola-rank-gates", CoLAConfig(rank=4, rank_gates=True), LowRankLinear, dense=False),
    Row("svd", SVDConfig(rank=4), LowRankLinear, dense=True),
    Row("cola-m", CoLAMConfig(rank=4), CoLAMLinear, dense=False),
    Row("lax-cola", LaXCoLAConfig(rank=4), LaXLinear, dense=False),
    Row("lax-svd", LaXSVDConfig(rank=3, crossing="dense"), LaXLinear, dense=False),
    Row("tt", TTConfig(rank=3, n_cores=4), TTLinear, dense=True, bad={"in_factors": (3, 3)}),
    Row("tt-rank-gates", TTConfig(rank=3, n_cores=4, rank_gates=True), TTLinear, dense=True, bad={"n_cores": 20}),
    Row("lax-tt", LaXTTConfig(rank=3, n_cores=4), LaXTTLinear, dense=False, bad={"rank": (1, 2)}),
    Row(
        "tt-embedding",
        TTEmbeddingConfig(rank=3, n_cores=3),
        TTEmbedding,
        dense=True,
        embedding=True,
        bad={"n_cores": 20},
    ),
    Row("lowrank-embedding", LowRankEmbeddingConfig(rank=3), LowRankEmbedding, dense=True, embedding=True),
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


def snapshot(model: nn.Module) -> dict[str, Any]:
    """Everything a refused call must leave as it was: module classes, parameter and buffer values (bitwise, with
    dtypes), ``requires_grad`` flags, hooks and plain attributes."""
    state = {key: (value.dtype, value.detach().clone()) for key, value in model.state_dict(keep_vars=True).items()}
    return {
        "modules": [(name, type(module)) for name, module in model.named_modules()],
        "grad": [(name, p.requires_grad) for name, p in model.named_parameters()],
        "hooks": [(name, len(m._forward_hooks), len(m._forward_pre_hooks)) for name, m in model.named_modules()],
        "attributes": [(name, sorted(vars(m))) for name, m in model.named_modules()],
        "state": state,
    }


def assert_unchanged(before: dict[str, Any], after: dict[str, Any]) -> None:
    for key in ("modules", "grad", "hooks", "attributes"):
        assert before[key] == after[key], key
    assert before["state"].keys() == after["state"].keys()
    for key, (dtype, value) in before["state"].items():
        assert after["state"][key][0] == dtype and torch.equal(after["state"][key][1], value), key


@dataclass(frozen=True)
class Refusal:
    """One module-swap family called with what it must refuse.

    Attributes:
        id: the test id.
        model: builds the model the call gets.
        call: the user's call on that model; it must raise ``error``.
        error: the exception type.
        family: the registered config type whose family refuses (every registered family has a row).
    """

    id: str
    model: Callable[[], nn.Module]
    call: Callable[[nn.Module], object]
    error: type[Exception] = ValueError
    family: type | None = None  # the config type of the registered family the row refuses (None: not one)

    def __str__(self) -> str:
        return self.id


def _tt_model() -> nn.Module:
    model = dense_model(ROWS[0])
    convert_(model, TTConfig(rank=3, n_cores=4))
    return model


def _qat_model() -> nn.Module:
    from tensorslim.quant import QATConfig, prepare_qat_

    model = _tt_model()
    prepare_qat_(model, QATConfig())
    return model


def _tiny_llama() -> nn.Module:
    from tensorslim.models.llama import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(d_model=16, n_layers=2, n_heads=2, d_ff=32, vocab_size=31, max_seq_len=16))


def _memory_model() -> nn.Module:
    from tensorslim.layers.memory import MemoryConfig, equip_memory_

    model = _tiny_llama()
    equip_memory_(model, MemoryConfig(capacity=8, chunk=4))
    return model


def _refusals() -> list[Refusal]:
    from tensorslim.layers.adapters import GatedLoRAConfig, PELTConfig, PrefixConfig, equip_, unipelt
    from tensorslim.layers.lora import LoRAConfig, apply_lora_
    from tensorslim.layers.memory import MemoryConfig, equip_memory_
    from tensorslim.quant import COMQConfig, GPTQConfig, QATConfig, RTNConfig, prepare_qat_, quantize_

    rows = [
        Refusal(
            f"convert-{row.id}",
            lambda row=row: dense_model(row),
            lambda model, row=row: convert_(model, dataclasses.replace(row.config, **row.bad)),
            family=type(row.config),
        )
        for row in ROWS
    ]
    return rows + [
        Refusal(
            "convert-larger-than-dense",
            lambda: dense_model(ROWS[0]),
            lambda m: convert_(m, LaXSVDConfig(rank=4, crossing="dense")),
        ),
        Refusal(
            "convert-gptq-needs-calibration",
            lambda: dense_model(ROWS[0]),
            lambda m: convert_(m, GPTQConfig()),
            family=GPTQConfig,
        ),
        Refusal(
            "convert-rtn-embeddings",
            lambda: dense_model(ROWS[0]),
            lambda m: convert_(m, RTNConfig(bits=4, embeddings=True)),
            family=RTNConfig,
        ),
        # the second layer refuses the rank after the first fits: nothing may be adapted or frozen
        Refusal(
            "convert-lora-rank",
            lambda: dense_model(ROWS[0]),
            lambda m: convert_(m, LoRAConfig(rank=9, targets=("up", "down"))),
            family=LoRAConfig,
        ),
        Refusal(
            "convert-lora-no-target",
            lambda: dense_model(ROWS[0]),
            lambda m: convert_(m, LoRAConfig(targets=("query",))),
            family=LoRAConfig,
        ),
        Refusal(
            "convert-memory-wait-on-causal",
            _tiny_llama,
            lambda m: convert_(m, MemoryConfig(capacity=8, chunk=4, wait=2)),
            family=MemoryConfig,
        ),
        Refusal(
            "convert-memory-twice",
            _memory_model,
            lambda m: convert_(m, MemoryConfig(capacity=8, chunk=4)),
            family=MemoryConfig,
        ),
        Refusal(
            "convert-qat-no-tt-layer",
            lambda: dense_model(ROWS[0]),
            lambda m: convert_(m, QATConfig()),
            family=QATConfig,
        ),
        Refusal(
            "convert-qat-twice",
            _qat_model,
            lambda m: convert_(m, QATConfig(mode="weight+activation")),
            family=QATConfig,
        ),
        Refusal("quant-gptq-no-calibration", lambda: dense_model(ROWS[0]), lambda m: quantize_(m, GPTQConfig(), None)),
        Refusal("quant-comq-no-calibration", lambda: dense_model(ROWS[0]), lambda m: quantize_(m, COMQConfig(), None)),
        Refusal(
            "quant-rtn-nothing-chosen",
            lambda: dense_model(ROWS[0]),
            lambda m: quantize_(m, RTNConfig(bits=4), None, filter_fn=lambda module, name: name == "blocks.0"),
        ),
        # rank 9 fits no 8 -> 12 layer: refused after the targets are found, before the model is frozen
        Refusal(
            "lora-rank", lambda: dense_model(ROWS[0]), lambda m: apply_lora_(m, LoRAConfig(rank=9, targets=("up",)))
        ),
        # LoRA finds its layers, the prefix finds no attention: nothing may be added or frozen
        Refusal(
            "adapters-lora-then-prefix",
            lambda: dense_model(ROWS[0]),
            lambda m: equip_(m, PELTConfig(lora=GatedLoRAConfig(rank=2, targets=("up",)), prefix=PrefixConfig())),
        ),
        Refusal(
            "adapters-unipelt-on-an-mlp",
            lambda: dense_model(ROWS[0]),
            lambda m: equip_(m, unipelt()),
            family=PELTConfig,
        ),
        # rank 9 fits no layer of the toy: refused by the plan, before anything is frozen
        Refusal(
            "convert-adapters-lora-rank",
            lambda: dense_model(ROWS[0]),
            lambda m: convert_(m, PELTConfig(lora=GatedLoRAConfig(rank=9, targets=("up", "down")))),
            family=PELTConfig,
        ),
        Refusal("adapters-config-type", lambda: dense_model(ROWS[0]), lambda m: equip_(m, "lora"), TypeError),
        Refusal("qat-no-tt-layer", lambda: dense_model(ROWS[0]), lambda m: prepare_qat_(m, QATConfig())),
        Refusal("qat-twice", _qat_model, lambda m: prepare_qat_(m, QATConfig())),
        Refusal(
            "memory-wait-on-causal", _tiny_llama, lambda m: equip_memory_(m, MemoryConfig(capacity=8, chunk=4, wait=2))
        ),
        Refusal(
            "memory-no-attention",
            lambda: dense_model(ROWS[0]),
            lambda m: equip_memory_(m, MemoryConfig(capacity=8, chunk=4)),
        ),
    ]


REFUSALS: list[Refusal] = _refusals()
