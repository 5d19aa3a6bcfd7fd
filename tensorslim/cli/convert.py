"""``tensorslim convert``: what a training method does to a model's layers (a dry run on ``meta``), or, with
``--save``, the converted model as a folder that :func:`tensorslim.load_pretrained` reads."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from tensorslim.options import option

NAME = "convert"
HELP = "show (or apply and save) a method's conversion of a registered model or a Hugging Face folder"


@dataclass(frozen=True, kw_only=True)
class ConvertConfig:
    """What ``tensorslim convert`` converts and where it saves the result."""

    preset: str = option("60m", "registered model to convert (ignored with --model)")
    model: str | None = option(None, "local Hugging Face model folder instead of a preset")
    method: str = option("cola", "a method that converts layers (see `tensorslim train -h`)")
    save: str | None = option(None, "write the converted model to this folder (see docs/save_load.md)")
    overwrite: bool = option(False, "write into a --save folder that holds files, replacing the files it writes")


def description() -> str:
    from tensorslim.methods import METHODS

    converting = [name for name, method in METHODS.items() if method.convert is not None]
    return f"{HELP}\n\nmethods that convert: {', '.join(converting)}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tensorslim.cli.flags import add_dataclass_arguments, add_option_arguments, method_owners

    add_dataclass_arguments(parser, ConvertConfig)
    add_option_arguments(parser, method_owners(), title="method options (each applies to the methods named)")


def run(args: argparse.Namespace) -> int:
    from tensorslim._checks import require_output
    from tensorslim.cli.flags import config_from_args, method_owners, options_from_args

    config = config_from_args(ConvertConfig, args)
    if config.save is not None:
        require_output("save", config.save, folder=True, overwrite=config.overwrite)
    convert(config, options=options_from_args(args.method, method_owners(), args, what="method"))
    return 0


def convert(config: ConvertConfig, *, options: dict) -> None:
    """Print the conversion; with ``save`` apply it to real weights and write the model with
    :func:`tensorslim.pretrained.save_pretrained`."""
    from tensorslim.methods import METHODS, MethodContext, apply_method, build_for_method, get_method, method_options

    if get_method(config.method).convert is None:
        allowed = [name for name, method in METHODS.items() if method.convert is not None]
        raise ValueError(f"method={config.method!r} is not a conversion; allowed: {allowed}")
    if config.model is not None:
        model = load_hf_model(config.model)
        context = MethodContext(
            model_name=config.model,
            family="hf",
            model_config=model.config,
            task="embed",
            options=method_options(config.method, options),
            pretrained=True,
        )
        reports = apply_method(model, config.method, context)
    else:
        device = "cpu" if config.save else "meta"
        model, reports, _ = build_for_method(config.preset, config.method, options=options, device=device)
    for report in reports:
        print(report.table())
    if config.save is None:
        if config.model is None:
            print("(a dry run on the meta device: nothing was allocated; --save writes converted weights)")
        return
    from tensorslim.pretrained import RegisteredBase, save_pretrained

    base = None if config.model is not None else RegisteredBase(name=config.preset)
    print(f"saved {save_pretrained(model, config.save, base=base)}")


def load_hf_model(path: str | Path):  # noqa: ANN201 - a transformers PreTrainedModel
    """A local Hugging Face model folder, loaded offline.

    Raises:
        ValueError: not a folder, or its weights are missing or corrupt.
    """
    if not Path(path).is_dir():
        raise ValueError(f"model={str(path)!r} is not a folder; allowed: a local Hugging Face model folder")
    from safetensors import SafetensorError
    from transformers import AutoModel

    try:
        return AutoModel.from_pretrained(path, local_files_only=True)
    except (OSError, SafetensorError) as error:
        raise ValueError(
            f"model={str(path)!r} cannot be loaded ({error}); allowed: a Hugging Face model folder"
        ) from None
