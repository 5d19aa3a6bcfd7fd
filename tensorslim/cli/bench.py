"""``tensorslim bench``: params, FLOPs, step time and memory of methods against dense, side by side."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "bench"
HELP = "measure params, FLOPs, step time and memory of methods vs dense"
OUT_SUFFIXES = (".md", ".json", ".png")  # what --out names the stem of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tensorslim.bench.harness import BenchConfig
    from tensorslim.cli.flags import add_dataclass_arguments

    add_dataclass_arguments(parser, BenchConfig)


def run(args: argparse.Namespace) -> int:
    from tensorslim._checks import require_output
    from tensorslim.bench.harness import BenchConfig, run_bench
    from tensorslim.cli.flags import config_from_args

    config = config_from_args(BenchConfig, args)
    if config.out:
        require_output("out", config.out, folder=False)  # the stem of .md/.json/.png
        for suffix in OUT_SUFFIXES:
            require_output("out", Path(config.out).with_suffix(suffix), folder=False, overwrite=config.overwrite)
    run_bench(config)
    return 0
