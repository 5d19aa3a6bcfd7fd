"""``tensorslim compress``: a pretrained model to one budget (params, bytes or FLOPs), calibrated and healed on text,
written as a folder that :func:`tensorslim.load_pretrained` reads (see :func:`tensorslim.compression.compress`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from tensorslim.options import option

NAME = "compress"
HELP = "compress a pretrained model to a params/bytes/FLOPs budget, choosing the family and size of every layer"


@dataclass(frozen=True, kw_only=True)
class CompressCommand:
    """What ``tensorslim compress`` compresses, on which text, and where it writes the result."""

    model: str = option("minilm", "a local Hugging Face model folder or a registered pretrained model")
    out: str | None = option(None, "the folder to write (must be new or empty, unless --overwrite)")
    overwrite: bool = option(False, "write into a non-empty --out folder, replacing the files it writes")
    params: float | None = option(None, "budget: a fraction of the linear layers' parameters (or a count)")
    bytes: float | None = option(None, "budget: a fraction of the linear layers' bytes (or a count)")
    flops: float | None = option(None, "budget: a fraction of the linear layers' FLOPs per token (or a count)")
    families: str = option("lowrank,kron,int8,int4", "comma-separated families to choose from (also: tt)")
    data: str = option("bbcnews", "corpus: calibration from its training split, held-out from its validation split")
    calibration: int = option(32, "calibration texts")
    held_out: int = option(16, "held-out texts that each stage is scored on")
    seq_len: int = option(128, "tokens per text")
    heal_steps: int = option(0, "distillation steps from the original model (layer by layer, then end to end)")
    lr: float = option(1e-4, "learning rate of the healing")

    def __post_init__(self) -> None:
        given = [name for name in ("params", "bytes", "flops") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                f"budget flags {given or 'none'} given; allowed: exactly one of --params, --bytes, --flops"
            )
        if self.out is None:
            raise ValueError("--out is missing; allowed: a new or empty folder to write the compressed model to")
        for name in ("calibration", "held_out", "seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} is invalid; allowed: an integer >= 1")


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


def _load(name: str):  # noqa: ANN202 - a transformers model and its tokenizer
    """A Hugging Face folder (with its tokenizer) or a registered pretrained model (with its own tokenizer)."""
    from transformers import AutoTokenizer

    if Path(name).is_dir():
        from tensorslim.cli.convert import load_hf_model

        return load_hf_model(name).eval(), AutoTokenizer.from_pretrained(name), None
    from tensorslim.models.registry import build_model, get_model
    from tensorslim.tasks.base import model_tokenizer

    if not get_model(name).pretrained:
        raise ValueError(f"model={name!r} has no pretrained weights; allowed: a pretrained preset or a HF folder")
    return build_model(name, task="embed").eval(), AutoTokenizer.from_pretrained(model_tokenizer(name)), name


def compress_model(config: CompressCommand, budget: object, families: tuple[str, ...]) -> None:
    """Load, compress and write the model; print the per-layer choices and each stage's size and quality."""
    from tensorslim.compression import compress
    from tensorslim.data import load_corpus
    from tensorslim.pretrained import RegisteredBase, save_pretrained

    model, tokenizer, preset = _load(config.model)
    corpus = load_corpus(config.data)

    def batches(texts: list[str]) -> list[dict]:
        return [
            dict(
                tokenizer(
                    texts[i : i + 8], truncation=True, max_length=config.seq_len, padding=True, return_tensors="pt"
                )
            )
            for i in range(0, len(texts), 8)
        ]

    calibration = batches(list(corpus.train[: config.calibration]))
    held_out = batches(list(corpus.validation[: config.held_out]))
    student, report = compress(
        model, budget, calibration, families=families, held_out=held_out, heal_steps=config.heal_steps, lr=config.lr
    )
    print(report.table())
    base = RegisteredBase(name=preset) if preset is not None else None
    print(f"saved {save_pretrained(student, config.out, base=base)}")
