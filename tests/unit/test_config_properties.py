"""Configs checked as data, and every module-swap family and verb under generated configs (Hypothesis).

A wrong type, a non-finite number or an out-of-range value is refused in one line that names the field; a valid
config converts a tiny model whose forward is finite and of the right shape; an invalid one leaves the model
bit-identical (:func:`tests.contracts.snapshot`).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorslim.bench.harness import BenchConfig
from tensorslim.budget import Budget
from tensorslim.convert import convert_
from tensorslim.data.longctx.reader_config import ReaderConfig
from tensorslim.layers.adapters import BottleneckConfig, GatedLoRAConfig, PELTConfig, PrefixConfig, PromptConfig
from tensorslim.layers.cola_m import CoLAMConfig
from tensorslim.layers.kron import KronConfig
from tensorslim.layers.lax import LaXCoLAConfig, LaXSVDConfig
from tensorslim.layers.lax_tt import LaXTTConfig
from tensorslim.layers.lora import LoRAConfig, apply_lora_
from tensorslim.layers.lowrank import CoLAConfig, SVDConfig
from tensorslim.layers.memory import MemoryConfig
from tensorslim.layers.tt import TTConfig
from tensorslim.layers.tt_embedding import TTEmbeddingConfig
from tensorslim.methods.comera.objective import CoMERAConfig
from tensorslim.methods.dense import GaLoreOptions
from tensorslim.methods.kron import KronOptions
from tensorslim.methods.lowrank import RankOptions
from tensorslim.methods.qat import TTQATOptions
from tensorslim.models.bert import BertConfig
from tensorslim.models.unet import UNetConfig
from tensorslim.quant import COMQConfig, GPTQConfig, QATConfig, RTNConfig, prepare_qat_, quantize_
from tensorslim.tasks.classify import ClassifyOptions
from tensorslim.tasks.distill import DistillOptions
from tensorslim.tasks.longctx.lm import LongContextOptions
from tensorslim.tasks.longctx.lookahead import LookaheadOptions
from tensorslim.tasks.segment.task import SegmentOptions
from tests.contracts import D_MODEL, ROWS, assert_unchanged, dense_model, sample_inputs, snapshot

CHEAP = settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

CONFIGS = [
    CoLAConfig,
    SVDConfig,
    CoLAMConfig,
    LaXCoLAConfig,
    LaXSVDConfig,
    TTConfig,
    LaXTTConfig,
    TTEmbeddingConfig,
    KronConfig,
    LoRAConfig,
    GatedLoRAConfig,
    PrefixConfig,
    BottleneckConfig,
    PromptConfig,
    MemoryConfig,
    RTNConfig,
    GPTQConfig,
    COMQConfig,
    QATConfig,
    CoMERAConfig,
    BertConfig,
    UNetConfig,
    ReaderConfig,
    BenchConfig,
    RankOptions,
    KronOptions,
    TTQATOptions,
    GaLoreOptions,
    ClassifyOptions,
    DistillOptions,
    SegmentOptions,
    LookaheadOptions,
    LongContextOptions,
]


def _wrong_values(hint: object) -> list[object]:
    """Values no field annotated ``hint`` may take: other types, bools for numbers, non-finite floats."""
    allowed = set(typing.get_args(hint)) if typing.get_origin(hint) in (typing.Union, types.UnionType) else {hint}
    wrong: list[object] = [object()]
    if int in allowed or float in allowed:
        wrong += ["4", True, [4]]
    if float in allowed:
        wrong += [math.nan, math.inf, -math.inf]
    elif int in allowed:
        wrong += [2.5, 4.0]
    if str in allowed:
        wrong += [4, b"text"]
    if bool in allowed:
        wrong += [1, "yes"]
    return wrong


def _typed_fields(cls: type) -> list[tuple[str, object]]:
    simple = {int, float, str, bool}
    found = []
    for field in dataclasses.fields(cls):
        if field.name == "calibration":  # a Calibration object, not a plain value
            continue
        hint = typing.get_type_hints(cls, localns={"Calibration": object})[field.name]
        parts = set(typing.get_args(hint)) if typing.get_origin(hint) in (typing.Union, types.UnionType) else {hint}
        if parts - {type(None)} and parts - {type(None)} <= simple:
            found.append((field.name, hint))
    return found


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda cls: cls.__name__)
def test_every_config_builds_with_its_defaults_and_refuses_wrong_types_in_one_line(cls: type) -> None:
    cls()
    fields = _typed_fields(cls)
    assert fields
    for name, hint in fields:
        for value in _wrong_values(hint):
            with pytest.raises(ValueError) as caught:
                cls(**{name: value})
            message = str(caught.value)
            shown = (cls.__dataclass_fields__[name].metadata.get("flag") or name).replace("-", "_")  # as on the CLI
            assert message.startswith(f"{shown}=") and "allowed" in message and "\n" not in message, message


@CHEAP
@given(
    cls=st.sampled_from([GatedLoRAConfig, LoRAConfig, GPTQConfig, LaXCoLAConfig, PromptConfig, Budget]),
    value=st.sampled_from([math.nan, math.inf, -math.inf]),
)
def test_non_finite_numbers_are_refused(cls: type, value: float) -> None:
    field = {
        GatedLoRAConfig: "alpha",
        LoRAConfig: "alpha",
        GPTQConfig: "percdamp",
        LaXCoLAConfig: "norm_eps",
        PromptConfig: "init_scale",
        Budget: "params",
    }[cls]
    with pytest.raises(ValueError, match=f"^{field}="):
        cls(**{field: value})


# --- the layer families through convert_ --------------------------------------------------------------------------

LOW_RANK = [CoLAConfig, SVDConfig, CoLAMConfig, LaXCoLAConfig, LaXSVDConfig]


def _check_forward(model: torch.nn.Module, row_index: int = 0) -> None:
    out = model(sample_inputs(ROWS[row_index]))
    assert out.shape == (2, 3, D_MODEL) and torch.isfinite(out).all()


def _converts_or_refuses(config: object, *, fits: bool, match: str | None = None) -> None:
    """A config that fits the toy converts it to a finite forward; one that does not leaves it bit-identical."""
    model = dense_model(ROWS[0])
    if fits:
        convert_(model, config, allow_larger=True)
        _check_forward(model)
        return
    before = snapshot(model)
    with pytest.raises(ValueError, match=match):
        convert_(model, config, allow_larger=True)
    assert_unchanged(before, snapshot(model))


@CHEAP
@given(cls=st.sampled_from(LOW_RANK), rank=st.integers(1, 40), random_init=st.booleans())
def test_low_rank_families_convert_every_fitting_rank_and_refuse_the_rest(
    cls: type, rank: int, random_init: bool
) -> None:
    config = cls(rank=rank, init="random" if random_init else "svd")
    _converts_or_refuses(config, fits=rank <= D_MODEL, match="rank=")  # the toy's layers are 8 -> 12 and 12 -> 8


@CHEAP
@given(
    cls=st.sampled_from([TTConfig, LaXTTConfig]),
    rank=st.integers(1, 6),
    n_cores=st.integers(2, 12),
)
def test_tt_families_convert_every_splittable_core_count_and_refuse_the_rest(
    cls: type, rank: int, n_cores: int
) -> None:
    # 8 = 2·2·2 carries at most 3 input modes > 1; half the cores carry input modes
    fits = n_cores // 2 <= 3 and n_cores - n_cores // 2 <= 3
    _converts_or_refuses(cls(rank=rank, n_cores=n_cores), fits=fits)


@CHEAP
@given(rank=st.integers(1, 9))
def test_kron_converts_every_fitting_rank_and_refuse_the_rest(rank: int) -> None:
    # 8 -> 12 splits as (2, 4) x (3, 4): at most min(2·3, 4·4) = 6 terms
    _converts_or_refuses(KronConfig(rank=rank), fits=rank <= 6, match="rank=")


# --- the verbs ----------------------------------------------------------------------------------------------------


@CHEAP
@given(rank=st.integers(1, 12), alpha=st.floats(-64, 64, allow_nan=False), lax_gate=st.sampled_from([None, "dense"]))
def test_lora_starts_at_the_dense_model_for_every_fitting_rank_and_refuses_the_rest(
    rank: int, alpha: float, lax_gate: str | None
) -> None:
    model = dense_model(ROWS[0])
    reference = dense_model(ROWS[0])(sample_inputs(ROWS[0]))
    config = LoRAConfig(rank=rank, alpha=alpha, targets=("up", "down"), lax_gate=lax_gate)
    if rank <= D_MODEL:
        apply_lora_(model, config)
        torch.testing.assert_close(model(sample_inputs(ROWS[0])), reference)  # B = 0 at init (LoRA §4.1)
        return
    before = snapshot(model)
    with pytest.raises(ValueError, match=f"rank={rank} does not fit"):
        apply_lora_(model, config)
    assert_unchanged(before, snapshot(model))


@CHEAP
@given(bits=st.integers(0, 10), granularity=st.sampled_from(["channel", "layer", "row"]))
def test_rtn_quantizes_every_supported_width_and_refuses_the_rest(bits: int, granularity: str) -> None:
    valid = 2 <= bits <= 8 and granularity != "row"
    if not valid:
        with pytest.raises(ValueError):
            RTNConfig(bits=bits, granularity=granularity)
        return
    model = dense_model(ROWS[0]).float()
    reference = dense_model(ROWS[0]).float()(sample_inputs(ROWS[0]).float())
    quantize_(model, RTNConfig(bits=bits, granularity=granularity), None)
    out = model(sample_inputs(ROWS[0]).float())
    assert out.shape == reference.shape and torch.isfinite(out).all()
    assert (out - reference).norm() <= (reference.norm() if bits <= 3 else 0.1 * reference.norm())


@CHEAP
@given(bits=st.integers(1, 9), mode=st.sampled_from(["weight", "weight+activation", "activation"]))
def test_qat_prepares_every_supported_width_and_refuses_the_rest(bits: int, mode: str) -> None:
    if not (2 <= bits <= 8 and mode != "activation"):
        with pytest.raises(ValueError):
            QATConfig(bits=bits, mode=mode)
        return
    model = dense_model(ROWS[0])
    convert_(model, TTConfig(rank=3, n_cores=4), allow_larger=True)
    prepare_qat_(model, QATConfig(bits=bits, mode=mode))
    _check_forward(model)


@settings(max_examples=6, deadline=None, derandomize=True)
@given(capacity=st.integers(0, 12), chunk=st.integers(0, 8))
def test_memory_equips_every_valid_size_and_refuses_the_rest(capacity: int, chunk: int) -> None:
    from tensorslim.layers.memory import equip_memory_
    from tensorslim.models.llama import LlamaConfig, LlamaForCausalLM

    if not capacity >= chunk >= 1:  # a chunk must fit the memory
        with pytest.raises(ValueError):
            MemoryConfig(capacity=capacity, chunk=chunk)
        return
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32, vocab_size=31, max_seq_len=32))
    equip_memory_(model, MemoryConfig(capacity=capacity, chunk=chunk))
    logits = model(torch.arange(6)[None])
    logits = logits if isinstance(logits, torch.Tensor) else logits.logits
    assert logits.shape[:2] == (1, 6) and torch.isfinite(logits).all()


@CHEAP
@given(
    rank=st.integers(1, 10),
    alpha=st.floats(-32, 32, allow_nan=False),
    with_prefix=st.booleans(),
)
def test_adapters_equip_what_fits_and_refuse_the_rest_unchanged(rank: int, alpha: float, with_prefix: bool) -> None:
    from tensorslim.layers.adapters import equip_

    model = dense_model(ROWS[0])
    config = PELTConfig(
        lora=GatedLoRAConfig(rank=rank, alpha=alpha, targets=("up",)),
        prefix=PrefixConfig(length=2) if with_prefix else None,
        train_head=False,
    )
    if rank <= D_MODEL and not with_prefix:  # a toy MLP has no attention to put prefixes into
        equip_(model, config)
        _check_forward(model)
        return
    before = snapshot(model)
    with pytest.raises(ValueError):
        equip_(model, config)
    assert_unchanged(before, snapshot(model))
