"""``tensorslim <command>``: one module per subcommand, imported only when that subcommand runs.

Each subcommand module (named in :data:`COMMANDS`) defines ``HELP``, ``add_arguments(parser)`` and
``run(args) -> exit code`` (and optionally ``description()``). User errors (``ValueError``/``TypeError`` raised while
validating or running, and ``OSError`` for a path that cannot be read or written) are printed as one line and exit
with code 2; argparse's own usage errors also exit with 2.

Building a subcommand's flags imports the registries (and so torch, seconds of CPU), so ``--help`` prints a text
rendered in advance from the real parsers (:mod:`tensorslim.cli.help_texts`, written by
``python -m tensorslim.cli.help_cache``; a test checks it equals a fresh rendering), and ``--version`` reads the
installed package's metadata: both answer without importing torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any, NoReturn

from tensorslim.cli.openmp import apply_wait_policy

# name -> module; a new subcommand is one line here (then refresh the help texts, see the module docstring).
COMMANDS: dict[str, str] = {
    "train": "tensorslim.cli.train",
    "bench": "tensorslim.cli.bench",
    "convert": "tensorslim.cli.convert",
    "quantize": "tensorslim.cli.quantize",
    "distill": "tensorslim.cli.distill",
    "generate": "tensorslim.cli.generate",
    "finetune": "tensorslim.cli.finetune",
    "longeval": "tensorslim.cli.longeval",
    "segment": "tensorslim.cli.segment",
    "predict": "tensorslim.cli.predict",
    "export": "tensorslim.cli.export",
    "compress": "tensorslim.cli.compress",
}
DESCRIPTION = "Low-rank and tensor-network training and compression for transformers."
HELP_WIDTH = 100  # help is rendered once, in advance, at this width


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Argparse's formatter at a fixed width, so that the help rendered in advance is the help printed."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=HELP_WIDTH, max_help_position=32)

    def add_usage(self, usage: str | None, actions: Any, groups: Any, prefix: str | None = None) -> None:
        """The usage line, with each group of owners' options (``--rank``, ``--lora-alpha`` ...: every method's
        and task's options, listed in full below it) named once, as ``[method options]``."""
        summaries = [name for name in dict.fromkeys(getattr(a, "usage_summary", None) for a in actions) if name]
        kept = [action for action in actions if not getattr(action, "usage_summary", None)]
        kept += [argparse.Action([], f"<{name}>", nargs="?", metavar=name) for name in summaries]
        super().add_usage(usage, kept, groups, prefix)


class ArgumentParser(argparse.ArgumentParser):
    """Argparse's parser whose usage errors are one line, as every other user error is (a command's usage runs to
    dozens of lines; ``--help`` prints it). Subcommand parsers are of the same class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def command_module(name: str) -> ModuleType:
    return importlib.import_module(COMMANDS[name])


def version() -> str:
    """The installed package's version, from its metadata (imports nothing of the package)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed_version

    try:
        return installed_version("tensorslim")
    except PackageNotFoundError:  # a source tree on PYTHONPATH that was never installed
        return "unknown (not installed)"


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand; with ``only``, the flags of that subcommand alone (the others are bare names,
    which cost nothing; ``""``: none)."""
    parser = ArgumentParser(prog="tensorslim", description=DESCRIPTION, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"tensorslim {version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    for name in COMMANDS:
        if only is not None and name != only:
            commands.add_parser(name)
            continue
        module = command_module(name)
        describe = getattr(module, "description", None)
        sub = commands.add_parser(
            name,
            help=module.HELP,
            description=describe() if describe else module.HELP,
            formatter_class=HelpFormatter,
        )
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def _asks_for_help(argv: Sequence[str]) -> str | None:
    """``""`` for ``tensorslim --help``, the command for ``tensorslim CMD ... --help``, else None."""
    if not argv or argv[0] in ("-h", "--help"):
        return "" if argv else None
    if argv[0] in COMMANDS:
        flags = argv[1 : list(argv).index("--")] if "--" in argv else argv[1:]
        if any(flag in ("-h", "--help") for flag in flags):
            return argv[0]
    return None


def _print_rendered_help(argv: Sequence[str]) -> bool:
    """Print the help rendered in advance, if ``argv`` asks for help and it is there."""
    wanted = _asks_for_help(argv)
    if wanted is None:
        return False
    from tensorslim.cli.help_texts import TEXTS

    if wanted not in TEXTS:  # a subcommand registered since the texts were rendered: the real parser prints it
        return False
    sys.stdout.write(TEXTS[wanted])
    return True


def _choose_openmp_wait_policy() -> None:
    """Spin idle OpenMP threads briefly on a quiet machine, let them sleep on a busy one (``tensorslim.cli.openmp``).

    It must happen before torch loads OpenMP, which reads the setting once.
    """
    if "torch" not in sys.modules:
        apply_wait_policy()


def quiet_third_parties() -> None:
    """Silence what transformers prints on every model load (its multi-line load report, with raw colour codes, and
    a "Loading weights" bar): our progress bars and summary say what happened. Either variable, set by the user,
    wins."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if _print_rendered_help(argv):
        raise SystemExit(0)  # as argparse's own --help does
    if argv[:1] == ["--version"]:
        print(f"tensorslim {version()}")
        raise SystemExit(0)
    _choose_openmp_wait_policy()
    quiet_third_parties()
    only = argv[0] if argv and argv[0] in COMMANDS else ""  # "": no subcommand's flags are needed
    args = build_parser(only).parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, TypeError, OSError) as error:  # OSError: a file the user named cannot be read or written
        print(f"tensorslim {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tensorslim {args.command}: interrupted", file=sys.stderr)
        return 130
