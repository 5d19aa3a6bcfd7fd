"""``tensorslim finetune``: fine-tune one parameter-efficient method (LoRA, prefix, adapter, prompt, UniPELT, peft's,
or ``dense``) of a pretrained classifier on a classification data set, through the one Trainer.

A low-resource run takes ``--train-size K`` training examples and a development set of ``--dev-size`` from the
training split (UniPELT's protocol, Mao et al., ACL 2022, arXiv 2110.07577, §4.1); the run reports the development
and test accuracy. The side-by-side comparison over methods, sizes, seeds and learning rates is
``experiments/adapters_protocol.py``, which runs this verb's configuration once per cell.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from tensorslim._checks import require_int

if TYPE_CHECKING:  # torch loads only when a command runs (after the OpenMP setting)
    from tensorslim.train.config import TrainConfig

NAME = "finetune"
HELP = "fine-tune one adapter method (LoRA, prefix, adapter, prompt, UniPELT, peft) of a pretrained classifier"


def finetune_config(
    *,
    model: str,
    method: str,
    data: str,
    train_size: int,
    dev_size: int,
    steps: int,
    batch_size: int,
    seq_len: int,
    lr: float | None,
    seed: int,
    out_dir: str | None,
    options: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> TrainConfig:
    """The Trainer configuration of one fine-tuning run: the ``classify`` task on ``K = train_size`` examples (0: the
    whole training split) with a development set, evaluated once at the end, linear warm-up over 10 % of the steps."""
    from tensorslim.train.config import TrainConfig

    return TrainConfig(
        preset=model,
        task="classify",
        method=method,
        options=options,
        data=data,
        task_options={"train_size": train_size, "dev_size": dev_size},
        steps=steps,
        batch_size=batch_size,
        seq_len=seq_len,
        lr=lr,
        warmup_fraction=0.1,
        seed=seed,
        eval_every=steps,
        checkpoint_every=10**9,
        out_dir=out_dir,
        overwrite=overwrite,
        progress=False,
        tensorboard=False,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="minilm", help="registered pretrained classifier model (default: minilm)")
    parser.add_argument(
        "--method", default="lora", help="adapter method, or 'dense' for full fine-tuning (default: lora)"
    )
    parser.add_argument("--data", default="bbcnews-titles", help="classification data set (default: bbcnews-titles)")
    parser.add_argument("--train-size", type=int, default=100, help="training examples K (0: all; default: 100)")
    parser.add_argument("--dev-size", type=int, default=100, help="development examples drawn from the training split")
    parser.add_argument("--steps", type=int, default=32, help="optimizer steps (default: 32, 5 passes over K = 100)")
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the method's)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=16, help="tokens per example ([CLS] included)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the K examples, the init and the data order")
    parser.add_argument("--out-dir", default=None, help="run folder (default: runs/<model>-<method>)")
    parser.add_argument("--overwrite", action="store_true", help="replace the run's own outputs in a used folder")


def run(args: argparse.Namespace) -> int:
    require_int("--train-size", args.train_size, minimum=0)
    for flag in ("dev_size", "steps", "batch_size"):
        require_int(f"--{flag.replace('_', '-')}", getattr(args, flag))
    require_int("--seq-len", args.seq_len, minimum=2)  # [CLS] and at least one token
    run_flags = ("model", "method", "data", "train_size", "dev_size", "steps", "batch_size", "seq_len", "lr", "seed")
    config = finetune_config(
        out_dir=args.out_dir, overwrite=args.overwrite, **{name: getattr(args, name) for name in run_flags}
    )
    from tensorslim.layers.adapters import trainable_parameters
    from tensorslim.train.trainer import Trainer

    trainer = Trainer(config)
    result = trainer.run()
    counts = trainable_parameters(trainer.model)
    print(
        f"tensorslim finetune: {config.method} on {config.data} (K={args.train_size or 'all'}, {config.steps} steps): "
        f"development accuracy {result.val_metrics['val_accuracy']:.3f}, "
        f"test accuracy {result.val_metrics['val_test_accuracy']:.3f}, "
        f"{counts['trainable']:,} trainable parameters; run folder {config.run_dir}"
    )
    return 0
