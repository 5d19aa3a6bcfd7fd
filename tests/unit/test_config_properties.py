"""Configs checked as data, and every module-swap family and verb under generated configs (Hypothesis).

A wrong type, a non-finite number or an out-of-range value is refused in one line that names the field; a valid
config converts a tiny model whose forward is finite and of the right shape; an invalid one leaves the model
bit-identical (:func:`tests.contracts.snapshot`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import types
import typing
from collections.abc import Callable
from pathlib import Path

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
from tensorslim.train.config import TrainConfig
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
    TrainConfig,
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


@pytest.mark.parametrize(
    ("cls", "name", "value"),
    [
        (BertConfig, "type_vocab_size", 0),
        (BertConfig, "type_vocab_size", -1),
        (BertConfig, "norm_eps", 0.0),
        (BertConfig, "norm_eps", -1e-5),
        (UNetConfig, "image_size", 0),
        (UNetConfig, "image_size", -16),
        (BenchConfig, "rank", 0),
        (BenchConfig, "rank", -8),
    ],
)
def test_out_of_range_sizes_are_refused_in_one_line(cls: type, name: str, value: object) -> None:
    """Values of the right type that no model can be built with (an embedding of no rows, a LayerNorm eps <= 0,
    images of no pixels, a rank of 0) are refused by the config, not by a layer deep inside the build."""
    with pytest.raises(ValueError) as caught:
        cls(**{name: value})
    message = str(caught.value)
    assert message.startswith(f"{name}={value!r}") and "allowed" in message and "\n" not in message, message


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


# --- the training run: TrainConfig and `tensorslim train` ---------------------------------------------------------

# Each checked field of a run with values it takes (a strategy) and values it refuses: out of range, of another type,
# non-finite. The command line takes the same values as text.
_FINITE = {"allow_nan": False, "allow_infinity": False}
RUN_FIELDS: dict[str, tuple[st.SearchStrategy, list[object]]] = {
    "steps": (st.integers(1, 10**6), [0, -3, 2.5, "5", True, None]),
    "batch_size": (st.integers(1, 512), [0, -1, 1.5, None]),
    "seq_len": (st.integers(1, 4096), [0, -64, 64.0, "64"]),
    "grad_accum": (st.integers(1, 64), [0, 1.0, False]),
    "eval_every": (st.integers(1, 10**4), [0, -1, 0.5, None]),
    "eval_blocks": (st.integers(1, 512), [0, 2.0]),
    "checkpoint_every": (st.integers(1, 10**4), [0, -5, math.inf, None]),
    "seed": (st.integers(0, 2**63 - 1), [-1, 2**63, 2**64, 1.0]),
    "factor_vocab": (st.integers(0, 64), [-1, 0.5]),
    "tp": (st.integers(1, 8), [0, 2.0]),
    "dp_shard": (st.integers(1, 8), [0, -2]),
    "lr": (st.none() | st.floats(1e-8, 10, **_FINITE), [0.0, -1e-3, math.nan, math.inf, "1e-3", True]),
    "weight_decay": (st.floats(0, 1, **_FINITE), [-0.1, math.nan, math.inf, None, "0"]),
    "grad_clip": (st.floats(0, 100, **_FINITE), [-1.0, math.nan, math.inf, -math.inf, None]),
    "warmup_fraction": (st.none() | st.floats(0, 0.99, **_FINITE), [1.0, 1.5, -0.1, math.nan, math.inf]),
    "min_lr_ratio": (st.floats(0, 1, **_FINITE), [1.01, -0.5, math.nan, math.inf]),
    "dtype": (st.sampled_from(["fp32", "bf16", "auto"]), ["fp16", "float32", "", 16, None]),
    "optimizer_state": (st.sampled_from(["fp32", "bf16"]), ["fp16", "int8", None]),
    "device": (st.sampled_from(["cpu", "cuda"]), ["gpu", "cuda:0", "", 0]),
    "tp_style": (st.sampled_from(["btp", "vanilla", "megatron"]), ["boost", 1]),
    "tp_overlap": (st.sampled_from(["none", "backward", "full"]), ["all", None]),
    "preset": (st.sampled_from(["tiny", "60m"]), ["huge", "", 3]),
    "method": (st.sampled_from(["dense", "cola", "svd", "galore"]), ["nope", 1]),
    "compile": (st.booleans(), [1, "yes", None]),
    "resume": (st.booleans(), [0, "no"]),
    "progress": (st.booleans(), [1.0]),
}
RUN_SWITCHES = {"compile", "resume", "progress"}  # --flag / --no-flag on the command line
RUN_CHOICES = {"dtype", "optimizer_state", "device", "tp_style", "tp_overlap", "preset", "method"}
# Fields whose value is a path, a name that the run resolves (a tokenizer, a data source, a column), or the
# options of the method and the task (checked by their own dataclasses, above): types only, covered by
# test_every_config_builds_with_its_defaults_and_refuses_wrong_types_in_one_line.
RUN_FIELDS_ELSEWHERE = {
    "task",
    "options",
    "task_options",
    "data",
    "text_field",
    "tokenizer",
    "vocab_size",
    "init",
    "init_base",
    "out_dir",
    "overwrite",
    "keep_freed_memory",
    "tensorboard",
    "cuda_graphs",
    "factor_embedding",  # valid only beside factor_vocab > 0: tests/unit/test_factor_vocab.py
}


def test_every_run_field_is_generated_or_checked_elsewhere() -> None:
    names = {field.name for field in dataclasses.fields(TrainConfig)}
    assert names == RUN_FIELDS.keys() | RUN_FIELDS_ELSEWHERE


def _valid_run(draw: st.DrawFn) -> dict[str, object]:
    """A subset of the run's fields, each with a value it takes (the rest keep their defaults)."""
    names = draw(st.sets(st.sampled_from(sorted(RUN_FIELDS)), max_size=8))
    run = {name: draw(RUN_FIELDS[name][0]) for name in sorted(names)}
    if run.get("optimizer_state") == "bf16" and run.get("method") == "galore":  # GaLore keeps its own AdamW
        run["optimizer_state"] = "fp32"
    return run


valid_runs = st.composite(_valid_run)
invalid_fields = st.sampled_from([(name, bad) for name, (_, refused) in RUN_FIELDS.items() for bad in refused])


@settings(max_examples=60, deadline=None, derandomize=True)
@given(run=valid_runs(), bad=invalid_fields)
def test_a_run_config_takes_every_valid_value_and_refuses_any_invalid_one_in_one_line(
    run: dict[str, object], bad: tuple[str, object]
) -> None:
    config = TrainConfig(**run)
    assert all(getattr(config, name) == value for name, value in run.items())
    name, value = bad
    with pytest.raises((ValueError, TypeError)) as caught:
        TrainConfig(**{**run, name: value})
    message = str(caught.value)
    assert message.startswith(f"{name}=") and "\n" not in message, message
    assert "allowed" in message or "unknown" in message, message


def _flags(run: dict[str, object]) -> list[str]:
    """The command line of ``run``: ``--flag value``, booleans as ``--flag`` / ``--no-flag``."""
    argv = []
    for name, value in run.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else f"--no-{flag[2:]}")
        elif value is not None:
            argv += [flag, str(value)]  # str(float) round-trips exactly
    return argv


def _said_on_a_command_line(name: str, value: object) -> bool:
    """Whether the bad ``value`` of field ``name`` can be typed as a flag's text and stays bad there: no text says
    None or a switch's value, and a number written as text ("5") is the number."""
    return value is not None and name not in RUN_SWITCHES and (name in RUN_CHOICES or not isinstance(value, str))


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Callable, list]:
    """``tensorslim train ARGS`` in this process, the Trainer replaced by a recorder of the config it would run:
    ``(exit code, stderr, out dir)``; nothing trains."""
    from tensorslim.cli.main import main
    from tensorslim.train import trainer

    started: list = []
    root, number = tmp_path_factory.mktemp("cli"), itertools.count()

    def record(config: object) -> None:
        started.append(config)
        raise trainer.RunFinished("recorded")

    def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, Path]:
        out = root / f"run{next(number)}"
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(trainer, "train", record)
            try:
                code = main(["train", *argv, "--out-dir", str(out)])
            except SystemExit as exit:  # argparse's own usage errors
                code = exit.code
        return code, capsys.readouterr().err, out

    return cli, started


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(run=valid_runs(), bad=invalid_fields)
def test_the_train_command_maps_its_flags_onto_the_run_config_and_refuses_bad_ones_in_one_line(
    run: dict[str, object], bad: tuple[str, object], cli_runs: tuple[Callable, list], capsys: pytest.CaptureFixture
) -> None:
    cli, started = cli_runs
    started.clear()
    code, err, out = cli(_flags(run), capsys)
    assert code == 0 and len(started) == 1, err
    assert started[0] == TrainConfig(**run, out_dir=str(out))  # one flag per field, as the API takes it
    name, value = bad
    if not _said_on_a_command_line(name, value):
        return
    started.clear()
    code, err, out = cli([*_flags(run), "--" + name.replace("_", "-"), str(value)], capsys)
    assert code == 2 and started == [] and not out.exists(), err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tensorslim train: error: "), err
    assert "Traceback" not in err and (f"{name}=" in err or f"--{name.replace('_', '-')}" in err), err
