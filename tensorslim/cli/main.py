"""``tensorslim <command>``: one module per subcommand (train, bench, convert, quantize, distill, generate,
finetune, longeval, segment).

Each subcommand module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> exit code`` (and
optionally ``description()``). User errors (``ValueError``/``TypeError`` raised while validating or running, and
``OSError`` for a path that cannot be read or written) are printed as one line and exit with code 2; argparse's own
usage errors also exit with 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tensorslim.cli import bench, convert, distill, finetune, generate, longeval, quantize, segment, train
from tensorslim.cli.openmp import apply_wait_policy

SUBCOMMANDS = (train, bench, convert, quantize, distill, generate, finetune, longeval, segment)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tensorslim",
        description="Low-rank and tensor-network training and compression for transformers.",
    )
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="{" + ",".join(c.NAME for c in SUBCOMMANDS) + "}"
    )
    for command in SUBCOMMANDS:
        describe = getattr(command, "description", None)
        sub = commands.add_parser(
            command.NAME,
            help=command.HELP,
            description=describe() if describe else command.HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(sub)
        sub.set_defaults(run=command.run)
    return parser


def _choose_openmp_wait_policy() -> None:
    """Spin idle OpenMP threads briefly on a quiet machine, let them sleep on a busy one (``tensorslim.cli.openmp``).

    It must happen before torch loads OpenMP, which reads the setting once.
    """
    if "torch" not in sys.modules:
        apply_wait_policy()


def main(argv: Sequence[str] | None = None) -> int:
    _choose_openmp_wait_policy()
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, TypeError, OSError) as error:  # OSError: a file the user named cannot be read or written
        print(f"tensorslim {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tensorslim {args.command}: interrupted", file=sys.stderr)
        return 130
