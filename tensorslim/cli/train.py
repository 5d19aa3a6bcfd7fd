"""``tensorslim train``: one run of any registered model, task and method through the one Trainer (one process, or
one per rank under ``torchrun`` for tensor/data parallelism)."""

from __future__ import annotations

import argparse
import os

NAME = "train"
HELP = "train a registered model with a method on a task (default: tiny CoLA on the stdlib corpus)"


def description() -> str:
    from tensorslim.methods import METHODS
    from tensorslim.models.registry import MODELS
    from tensorslim.tasks import TASKS

    lines = [HELP, "", "methods:"]
    lines += [f"  {name:<10} {method.help}" for name, method in METHODS.items()]
    lines += ["", "models:"] + [
        f"  {name:<12} {preset.help} [{', '.join(preset.tasks)}]" for name, preset in MODELS.items()
    ]
    lines += ["", "tasks:"] + [f"  {name:<10} {task.help}" for name, task in TASKS.items()]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tensorslim.cli.flags import add_dataclass_arguments, add_option_arguments, method_owners, task_owners
    from tensorslim.train.config import TrainConfig

    add_dataclass_arguments(parser, TrainConfig, skip=("options", "task_options"))
    add_option_arguments(parser, method_owners(), title="method options (each applies to the methods named)")
    add_option_arguments(parser, task_owners(), title="task options (each applies to the tasks named)")


def run(args: argparse.Namespace) -> int:
    from tensorslim._checks import require_output
    from tensorslim.cli.flags import config_from_args, method_owners, options_from_args, task_owners
    from tensorslim.models.registry import resolve_task
    from tensorslim.train.config import TrainConfig, check_preset

    check_preset(args.preset)
    task = args.task or resolve_task(args.preset)
    config = config_from_args(
        TrainConfig,
        args,
        options=options_from_args(args.method, method_owners(), args, what="method"),
        task_options=options_from_args(task, task_owners(), args, what="task"),
    )
    require_output("out_dir", config.run_dir, folder=True)
    from tensorslim.report import print_train_summary
    from tensorslim.train.trainer import Interrupted, RunFinished, train

    try:
        result = train(config)
    except RunFinished as done:  # --resume on a finished run: say so, change nothing
        print(f"tensorslim train: {done}", flush=True)
        return 0
    except Interrupted as stop:
        print(f"tensorslim train: {stop}", flush=True)
        return 128 + stop.signal_number
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun every rank trains; rank 0 reports
        print_train_summary(config, result)
    return 0
