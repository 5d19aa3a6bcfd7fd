"""``tensorslim generate``: continue a prompt with the latest checkpoint of a causal-LM training run."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from tensorslim.options import option

NAME = "generate"
HELP = "continue a prompt with a training run's latest checkpoint (causal LM runs)"


@dataclass(frozen=True, kw_only=True)
class GenerateConfig:
    """Which run continues which prompt, and how tokens are chosen (see :func:`tensorslim.generation.generate`)."""

    run_dir: str = option("", "training run folder (holds checkpoints/), flag --run")
    prompt: str = option("", "text to continue")
    max_new_tokens: int = option(64, "tokens to generate at most")
    temperature: float = option(1.0, "divides the logits before sampling")
    top_k: int | None = option(None, "sample among the k most likely tokens")
    top_p: float | None = option(None, "sample within the top-p probability nucleus")
    greedy: bool = option(False, "take the most likely token at each step")
    seed: int = option(0, "sampling seed")
    device: str = option("cpu", "cpu or cuda")

    def __post_init__(self) -> None:
        from tensorslim.generation import check_sampling

        if not self.run_dir:
            raise ValueError("run_dir='' is invalid; allowed: a training run folder (--run DIR)")
        check_sampling(self.max_new_tokens, self.temperature, self.top_k, self.top_p)  # before the model loads
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device={self.device!r} is invalid; allowed: 'cpu' or 'cuda'")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tensorslim.cli.flags import add_dataclass_arguments

    # --run names the folder; its dest is run_dir because ``run`` is the subcommand's entry point in the namespace.
    parser.add_argument("--run", dest="run_dir", required=True, metavar="DIR", help="training run folder")
    add_dataclass_arguments(parser, GenerateConfig, skip=("run_dir",))


def run(args: argparse.Namespace) -> int:
    from tensorslim.cli.flags import config_from_args
    from tensorslim.generation import generate

    config = config_from_args(GenerateConfig, args)
    model, tokenizer = load_run(config.run_dir, device=config.device)
    text = generate(
        model,
        tokenizer,
        config.prompt,
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        top_k=config.top_k,
        top_p=config.top_p,
        greedy=config.greedy,
        seed=config.seed,
    )
    print(config.prompt + text)
    return 0


def load_run(run_dir: str | Path, *, device: str = "cpu") -> tuple[Any, Any]:
    """The model of ``run_dir``'s latest checkpoint and the run's tokenizer.

    The run's :class:`~tensorslim.train.config.TrainConfig` (``state.json``) names the model, method, options and
    data; the tokenizer is the run's own (a local path, or the BPE cached for its corpus, trained again on a cache
    miss); the model is rebuilt on ``meta`` by :func:`tensorslim.methods.build_for_method` with the tokenizer's
    vocabulary and the run's sequence length, then the checkpoint's weights are loaded (safetensors, strict).

    Raises:
        ValueError: no checkpoint, or a run whose task is not causal language modelling.
    """
    from tensorslim.checkpoint import latest_checkpoint, read_state
    from tensorslim.data import load_corpus, load_tokenizer
    from tensorslim.methods import build_for_method
    from tensorslim.models.registry import get_model
    from tensorslim.pretrained import load_weights_
    from tensorslim.tasks.base import model_tokenizer
    from tensorslim.train.config import TrainConfig

    checkpoint = latest_checkpoint(Path(run_dir) / "checkpoints")
    if checkpoint is None:
        raise ValueError(f"run={str(run_dir)!r} holds no checkpoint (expected {Path(run_dir) / 'checkpoints'})")
    state = read_state(checkpoint)
    known = {f.name for f in fields(TrainConfig)}
    config = TrainConfig(**{k: v for k, v in state["config"].items() if k in known})
    if config.model_task != "lm":
        raise ValueError(f"run {str(run_dir)!r} trained task={config.task!r}; allowed: a causal LM ('lm') run")
    tokenizer = load_tokenizer(
        config.tokenizer or model_tokenizer(config.preset),
        load_corpus(config.data, text_field=config.text_field),
        vocab_size=config.vocab_size or get_model(config.preset).config.vocab_size,
    )
    model, _, _ = build_for_method(
        **config.model_spec(), device="meta", vocab_size=tokenizer.vocab_size, max_seq_len=config.seq_len
    )
    load_weights_(model, checkpoint / "model.safetensors", state.get("aliases", {}), device=device)
    return model.eval(), tokenizer
