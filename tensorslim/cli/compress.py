"""``tensorslim compress``: a pretrained model to one budget (params, bytes or FLOPs), calibrated and healed on text,
written as a folder that :func:`tensorslim.load_pretrained` reads (see :func:`tensorslim.compression.compress`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensorslim.options import option

if TYPE_CHECKING:  # torch loads only when a command runs
    from torch import nn

NAME = "compress"
TOKENIZER_FILES = ("tokenizer", "vocab", "merges", "special_tokens")  # what a saved tokenizer's files start with
HELP = "compress a pretrained model to a params/bytes/FLOPs budget, choosing the family and size of every layer"


@dataclass(frozen=True, kw_only=True)
class CompressCommand:
    """What ``tensorslim compress`` compresses, on which text, and where it writes the result."""

    model: str = option(
        "minilm", "a Hugging Face model folder, a run folder (or its model/), or a registered pretrained model"
    )
    out: str | None = option(None, "the folder to write (must be new or empty, unless --overwrite)")
    overwrite: bool = option(False, "write into a non-empty --out folder, replacing the files it writes")
    params: float | None = option(None, "budget: a fraction of the linear layers' parameters (or a count)")
    bytes: float | None = option(None, "budget: a fraction of the linear layers' bytes (or a count)")
    flops: float | None = option(None, "budget: a fraction of the linear layers' FLOPs per token (or a count)")
    families: str = option("lowrank,kron,int8,int4", "comma-separated families to choose from (also: tt)")
    data: str = option(
        "bbcnews", "corpus: calibration and healing from its training split, held-out from its validation split"
    )
    calibration: int = option(
        128, "calibration texts (causal LM: blocks of --seq-len tokens); fewer fit the calibration text, not the model"
    )
    held_out: int = option(16, "held-out texts that each stage is scored on")
    seq_len: int = option(128, "tokens per text")
    heal: bool = option(
        False, "heal by distillation from the original model: layer by layer (then end to end with --heal-steps)"
    )
    heal_texts: int = option(4800, "healing texts, drawn from the training split (a corpus may hold fewer)")
    block_steps: int | None = option(
        None, "healing layer by layer: steps per changed block (default 600; 0: none; given, it turns on --heal)"
    )
    block_lr: float | None = option(None, "peak learning rate of the layer-by-layer healing (default 1e-3)")
    heal_steps: int | None = option(
        None, "healing end to end: distillation steps from the original model (default 0: none)"
    )
    lr: float | None = option(None, "peak learning rate of the end-to-end healing (default 3e-5)")
    batch_size: int | None = option(None, "texts per healing step (default 8)")

    @property
    def healing(self) -> dict[str, Any] | None:
        """The ``HealConfig`` options given (the others keep its defaults), or None without healing: healing runs
        with ``--heal`` or any of its flags."""
        names = {"block_steps": "block_steps", "block_lr": "block_lr", "heal_steps": "steps", "lr": "lr"}
        given = {names.get(k, k): getattr(self, k) for k in (*names, "batch_size") if getattr(self, k) is not None}
        return given if self.heal or given else None

    def __post_init__(self) -> None:
        given = [name for name in ("params", "bytes", "flops") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                f"budget flags {given or 'none'} given; allowed: exactly one of --params, --bytes, --flops"
            )
        if self.out is None:
            raise ValueError("--out is missing; allowed: a new or empty folder to write the compressed model to")
        for name in ("calibration", "held_out", "seq_len", "heal_texts", "batch_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} is invalid; allowed: an integer >= 1")
        if self.healing is not None:  # the healing's own checks, before any work
            from tensorslim.compression.heal import HealConfig

            HealConfig(**self.healing)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tensorslim.cli.flags import add_dataclass_arguments

    add_dataclass_arguments(parser, CompressCommand)


def _check_out(config: CompressCommand) -> None:
    from tensorslim._checks import require_output

    require_output("out", config.out, folder=True)
    out = Path(config.out)
    if out.is_dir() and any(out.iterdir()) and not config.overwrite:
        raise ValueError(f"out={config.out!r} is not empty; allowed: a new or empty folder, or --overwrite")


def run(args: argparse.Namespace) -> int:
    from tensorslim.budget import Budget
    from tensorslim.cli.flags import config_from_args
    from tensorslim.compression.choose import FAMILIES

    config = config_from_args(CompressCommand, args)
    budget = Budget(**{k: getattr(config, k) for k in ("params", "bytes", "flops") if getattr(config, k) is not None})
    families = tuple(f.strip() for f in config.families.split(",") if f.strip())
    if not families or any(f not in FAMILIES for f in families):
        raise ValueError(f"families={config.families!r} is invalid; allowed: a comma-separated subset of {FAMILIES}")
    _check_out(config)
    compress_model(config, budget, families)
    return 0


@dataclass
class Source:
    """A model to compress, what turns text into its inputs, and what its saved folder records."""

    model: nn.Module
    tokenizer: Any  # a transformers tokenizer (encoders) or the folder of a run's tokenizer (causal LMs)
    base: Any = None  # the save_pretrained base: a RegisteredBase, or None (a Hugging Face folder)
    run: dict[str, Any] | None = None  # the run record of a run's model, kept for the predictor
    run_folder: Path | None = None  # the folder holding that run's tokenizer


def _load(name: str) -> Source:
    """A Hugging Face folder, a save_pretrained / run folder (``<run>``, ``<run>/model``) or a registered
    pretrained model."""
    from transformers import AutoTokenizer

    from tensorslim.pretrained import MANIFEST, RUN_MODEL

    folder = Path(name)
    if folder.is_dir() and not (folder / MANIFEST).is_file() and not (folder / RUN_MODEL / MANIFEST).is_file():
        from tensorslim.cli.convert import load_hf_model

        return Source(load_hf_model(name).eval(), AutoTokenizer.from_pretrained(name))
    if folder.is_dir():
        return _load_run(folder)
    from tensorslim.models.registry import build_model, get_model
    from tensorslim.pretrained import RegisteredBase
    from tensorslim.tasks.base import model_tokenizer

    if not get_model(name).pretrained:
        raise ValueError(
            f"model={name!r} has no pretrained weights; allowed: a pretrained preset, a Hugging Face folder or a run"
        )
    model = build_model(name, task="embed").eval()
    return Source(model, AutoTokenizer.from_pretrained(model_tokenizer(name)), base=RegisteredBase(name=name))


def _load_run(folder: Path) -> Source:
    """The model of a run (or of a save_pretrained folder), with the run's tokenizer."""
    from tensorslim.pretrained import RegisteredBase, load_pretrained, locate_model

    manifest, structure, _, _ = locate_model(folder)
    run, record = manifest.get("run") or {}, manifest["base"]
    if not run.get("tokenizer"):
        raise ValueError(
            f"model={str(folder)!r} records no tokenizer; allowed: a run folder (or its model/) whose run saved one"
        )
    if record.get("kind") == "method":
        overrides = {k: v for k, v in record["overrides"].items() if k in ("vocab_size", "max_seq_len", "n_classes")}
        base = RegisteredBase(name=record["name"], task=record["task"], **overrides)
    elif record.get("kind") == "tensorslim":
        base = RegisteredBase(**{k: v for k, v in record.items() if k != "kind"})
    else:
        base = None
    model = load_pretrained(folder).eval()
    return Source(model, structure / run["tokenizer"], base=base, run=run, run_folder=structure)


def _text_batches(source: Source, config: CompressCommand) -> tuple[list, list, list]:
    """Calibration, healing and held-out inputs from ``config.data``: dicts of a tokenized text each for an encoder,
    ``(B, seq_len)`` blocks of packed text for a causal LM (training split, then validation split)."""
    from tensorslim.compression.heal import is_encoder

    size = 8
    if is_encoder(source.model):
        import torch

        from tensorslim.data import load_corpus

        corpus = load_corpus(config.data)

        def batches(texts: list[str]) -> list[dict]:
            tokenize = source.tokenizer
            return [
                dict(tokenize(texts[i : i + size], truncation=True, max_length=config.seq_len, padding=True,
                              return_tensors="pt"))
                for i in range(0, len(texts), size)
            ]  # fmt: skip

        train = list(corpus.train)  # drawn in a fixed random order: a training split may be sorted by topic
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(0)).tolist()
        train = [train[i] for i in order]
        healing = batches(train[: config.heal_texts]) if config.healing is not None else []
        return batches(train[: config.calibration]), healing, batches(list(corpus.validation[: config.held_out]))
    from tensorslim.data import build_lm_data

    vocab = source.model.get_input_embeddings().num_embeddings
    data = build_lm_data(
        config.data, tokenizer=str(source.tokenizer), vocab_size=vocab, seq_len=config.seq_len,
        max_val_blocks=config.held_out,
    )  # fmt: skip

    def blocks(rows: Any, count: int) -> list:
        return list(rows[:count].split(size))

    return (
        blocks(data.train, config.calibration),
        blocks(data.train, config.heal_texts),
        blocks(data.validation, config.held_out),
    )


def compress_model(config: CompressCommand, budget: object, families: tuple[str, ...]) -> None:
    """Load, compress (and heal) and write the model; print the per-layer choices and each stage's size and
    quality."""
    import shutil

    from tensorslim.compression import compress
    from tensorslim.compression.heal import HealConfig
    from tensorslim.pretrained import save_pretrained

    source = _load(config.model)
    calibration, heal_data, held_out = _text_batches(source, config)
    healing = None if config.healing is None else HealConfig(**config.healing)
    student, report = compress(
        source.model, budget, calibration, families=families, held_out=held_out, healing=healing, heal_data=heal_data
    )
    print(report.table())
    out = save_pretrained(student, config.out, base=source.base, run=source.run)
    if source.run is not None:  # the run's tokenizer beside the model, so that the folder predicts as the run did
        for file in source.run_folder.iterdir():
            if file.is_file() and file.name.startswith(TOKENIZER_FILES):
                shutil.copy(file, out / file.name)
    print(f"saved {out}")
