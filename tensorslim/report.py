"""Human-readable reports: the training summary and ``tensorslim convert``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from tensorslim.train.config import TrainConfig
from tensorslim.train.metrics import format_bytes
from tensorslim.train.trainer import TrainResult


def print_train_summary(config: TrainConfig, result: TrainResult) -> None:
    """The end-of-run table: books against the dense baseline, speed, memory, validation."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"tensorslim train: {config.preset} / {config.method} ({result.steps} steps)")
    table.add_column("metric")
    table.add_column(config.method, justify="right")
    table.add_column("dense", justify="right")
    table.add_column("ratio", justify="right")
    for label, ours, dense in (
        ("params (total)", result.params_total, result.dense_params_total),
        ("params (non-embedding)", result.params_non_embedding, result.dense_params_non_embedding),
        ("fwd FLOPs / token", result.flops_per_token, result.dense_flops_per_token),
    ):
        table.add_row(label, f"{ours:,.0f}", f"{dense:,.0f}", f"{ours / dense:.3f}")
    table.add_row("tokens / s (median step)", f"{result.tokens_per_s:,.0f}", "", "")
    table.add_row("peak train memory (params+grads+optim+activations)", format_bytes(result.memory["total"]), "", "")
    table.add_row("validation loss", f"{result.val_loss:.4f}", "", "")
    table.add_row("validation perplexity", f"{result.val_perplexity:.2f}", "", "")
    console = Console()
    console.print(table)
    console.print(f"metrics: {result.run_dir}/metrics.jsonl, loss curve: {result.run_dir}/loss.png")
    console.print("dense speed and memory side by side: tensorslim bench --preset " + config.preset)


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True, kw_only=True)
class ConvertConfig:
    """What ``tensorslim convert`` converts and where it saves the result."""

    preset: str = field(default="60m", metadata=_help("our LLaMA preset to convert (ignored with --model)"))
    model: str | None = field(default=None, metadata=_help("local Hugging Face model folder instead of a preset"))
    method: str = field(default="cola", metadata=_help("a conversion method: cola or svd"))
    rank: int | None = field(default=None, metadata=_help("latent rank (default: rank_ratio of min(d_in, d_out))"))
    rank_ratio: float = field(default=0.25, metadata=_help("rank as a fraction of min(d_in, d_out)"))
    save: str | None = field(default=None, metadata=_help("write the converted weights to this .safetensors file"))


def run_convert(config: ConvertConfig) -> None:
    """Print the conversion plan; with ``save`` apply it (SVD init from the weights) and save the result."""
    from safetensors.torch import save_file

    from tensorslim.convert import METHODS, convert_, plan
    from tensorslim.models.llama import LlamaForCausalLM, get_preset

    if config.method not in METHODS:
        raise ValueError(f"method={config.method!r} is not a conversion; allowed: {list(METHODS)}")
    method_config = METHODS[config.method](rank=config.rank, rank_ratio=config.rank_ratio)
    if config.model is not None:
        model = _load_hf_model(config.model)
    else:
        with torch.device("cpu" if config.save else "meta"):
            model = LlamaForCausalLM(get_preset(config.preset).model)
    if config.save is None:
        print(plan(model, method_config).table())
        return
    print(convert_(model, method_config).table())
    target = Path(config.save)
    tmp = target.with_name(target.name + ".tmp")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp)
    tmp.replace(target)
    print(f"saved {target}")


def _load_hf_model(path: str) -> torch.nn.Module:
    """A local Hugging Face model folder, loaded offline."""
    if not Path(path).is_dir():
        raise ValueError(f"model={path!r} is not a folder; allowed: a local Hugging Face model folder")
    from transformers import AutoModel

    return AutoModel.from_pretrained(path, local_files_only=True)
