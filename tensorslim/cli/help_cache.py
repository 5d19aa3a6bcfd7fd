"""Render every ``--help`` of the command line in advance: ``python -m tensorslim.cli.help_cache`` writes
:mod:`tensorslim.cli.help_texts`, which ``tensorslim --help`` prints without importing torch.

Run it after changing a flag, a registry entry or a subcommand; a test checks the file equals a fresh rendering.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from tensorslim.cli.main import COMMANDS, build_parser

HEADER = '''"""Every ``--help`` text of the command line, rendered in advance (written by ``python -m
tensorslim.cli.help_cache``; do not edit by hand)."""

# ruff: noqa: E501

TEXTS: dict[str, str] = {
'''


def render(command: str) -> str:
    """The help ``tensorslim [command] --help`` prints (``""``: the top level), from the real parser."""
    argv = [command, "--help"] if command else ["--help"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        build_parser(command or None).parse_args(argv)
    return out.getvalue()


def render_all() -> dict[str, str]:
    return {command: render(command) for command in ("", *COMMANDS)}


def _literal(text: str) -> str:
    """``text`` as a triple-quoted Python string literal that ruff's formatter leaves as it is."""
    return '"""' + text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"') + '"""'


def source(texts: dict[str, str]) -> str:
    """The module :mod:`tensorslim.cli.help_texts` holding ``texts``."""
    body = "".join(f'    "{command}": {_literal(text)},\n' for command, text in texts.items())
    return HEADER + body + "}\n"


def main() -> None:
    path = Path(__file__).with_name("help_texts.py")
    path.write_text(source(render_all()))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
