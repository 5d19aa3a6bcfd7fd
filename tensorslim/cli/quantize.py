"""``tensorslim quantize``: post-training quantization of a Hugging Face model folder, with a report and a file."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tensorslim.options import option

if TYPE_CHECKING:  # torch loads only when a command runs (after the OpenMP setting)
    from torch import nn

    from tensorslim.quant.quantizer import QuantConfig

QUANT_METHODS = ("comq", "gptq", "rtn")


@dataclass(frozen=True, kw_only=True)
class QuantizeRunConfig:
    """What ``tensorslim quantize`` does; one flag per field."""

    model: str = option("minilm", "'minilm' (the bundled MiniLM BERT) or a HF model folder")
    method: str = option("comq", f"one of {QUANT_METHODS}")
    bits: int = option(4, "code width, 2..8")
    granularity: str = option("channel", "'channel' or 'layer'")
    init: str = option("gptq", "COMQ start: 'gptq', 'rtn' or 'float' (the release)")
    order: str = option("cyclic", "COMQ coordinate order: 'cyclic' or 'greedy' (paper)")
    sweeps: int = option(1, "COMQ sweeps")
    update_scale: bool = option(True, "COMQ least-squares scale update")
    act_order: bool = option(False, "GPTQ: columns by decreasing diag(H)")
    embeddings: bool = option(
        False, "also quantize the token embeddings (RTN, one grid per token) and the output head, as llama.cpp does"
    )
    data: str = option("bbcnews", "calibration corpus: 'bbcnews', 'stdlib' or a path")
    calib_docs: int = option(128, "calibration documents (first seq-len tokens of each)")
    seq_len: int = option(128, "tokens per calibration document")
    out: str | None = option(None, "write the quantized model to this .safetensors file")
    overwrite: bool = option(False, "replace the --out file when it exists")

    def __post_init__(self) -> None:
        if self.method not in QUANT_METHODS:
            raise ValueError(f"method={self.method!r} is not supported; use one of {QUANT_METHODS}")
        for name in ("calib_docs", "seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 1")
        self.quant_config()  # validate bits, granularity, order, sweeps now

    def quant_config(self) -> QuantConfig:
        from tensorslim.quant.comq import COMQConfig
        from tensorslim.quant.gptq import GPTQConfig
        from tensorslim.quant.rtn import RTNConfig

        common = {"bits": self.bits, "granularity": self.granularity, "embeddings": self.embeddings}
        if self.method == "comq":
            return COMQConfig(
                **common, init=self.init, order=self.order, sweeps=self.sweeps, update_scale=self.update_scale
            )
        if self.method == "gptq":
            return GPTQConfig(**common, act_order=self.act_order)
        return RTNConfig(**common)


def run_quantize(config: QuantizeRunConfig) -> None:
    from transformers import AutoTokenizer

    from tensorslim.cli.convert import load_hf_model
    from tensorslim.data import load_corpus
    from tensorslim.quant.api import quantize_, save_quantized
    from tensorslim.quant.hf_inputs import calibration_batches, model_folder

    folder = model_folder(config.model)
    texts = load_corpus(config.data).train[: config.calib_docs]  # a bad --data fails before the model loads
    model: nn.Module = load_hf_model(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batches = calibration_batches(tokenizer, texts, seq_len=config.seq_len)
    report = quantize_(model, config.quant_config(), batches)
    print(report.table())
    float_file = folder / "model.safetensors"
    if float_file.is_file():
        print(f"float checkpoint on disk: {float_file.stat().st_size:,} bytes")
    if config.out is not None:
        size = save_quantized(model, config.out)
        print(f"wrote {config.out}: {size:,} bytes")


NAME = "quantize"
HELP = "post-training quantization (COMQ, GPTQ, RTN) of a Hugging Face model folder"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tensorslim.cli.flags import add_dataclass_arguments

    add_dataclass_arguments(parser, QuantizeRunConfig)


def run(args: argparse.Namespace) -> int:
    from tensorslim._checks import require_output
    from tensorslim.cli.flags import config_from_args

    config = config_from_args(QuantizeRunConfig, args)
    if config.out is not None:
        require_output("out", config.out, folder=False, overwrite=config.overwrite)
    run_quantize(config)
    return 0
