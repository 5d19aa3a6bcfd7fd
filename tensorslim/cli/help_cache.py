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
tensorslim.cli.help_cache``; do not edit by hand).

A help text is its sections (the blocks between blank lines); a section that several commands print (the method
options of ``train`` and ``convert``) is written once, as a constant, and named in each of them.
"""

# ruff: noqa: E501

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


def _sections(text: str) -> list[str]:
    """``text`` cut at its blank lines: ``"\\n\\n".join(sections) + "\\n" == text``."""
    if not text.endswith("\n") or text.endswith("\n\n"):
        raise ValueError(f"a help text ends with one newline, got {text[-20:]!r}")
    return text[:-1].split("\n\n")


def _shared_names(texts: dict[str, str]) -> dict[str, str]:
    """Each section that more than one text prints, and the constant that holds it: its title (the words before
    the first colon or parenthesis) in capitals."""
    users: dict[str, set[str]] = {}
    for command, text in texts.items():
        for section in _sections(text):
            users.setdefault(section, set()).add(command)
    names: dict[str, str] = {}
    for section, commands in users.items():
        if len(commands) > 1 and "\n" in section:
            title = section.split("\n", 1)[0].split(":", 1)[0].split("(", 1)[0]
            name = "_".join(title.upper().split())
            name = name if name.isidentifier() and name.isascii() else "SECTION"
            names[section] = name if name not in names.values() else f"{name}_{len(names)}"
    return names


def source(texts: dict[str, str]) -> str:
    """The module :mod:`tensorslim.cli.help_texts` holding ``texts``."""
    shared = _shared_names(texts)
    constants = "".join(f"{name} = {_literal(section)}\n\n" for section, name in shared.items())
    entries = []
    for command, text in texts.items():
        parts: list[str] = []  # literals of consecutive unshared sections, and the names of shared ones
        own: list[str] = []
        for section in _sections(text):
            if section in shared:
                if own:
                    parts.append(_literal("\n\n".join(own)))
                    own = []
                parts.append(shared[section])
            else:
                own.append(section)
        if own:
            parts.append(_literal("\n\n".join(own)))
        entries.append(f'    "{command}": (\n' + "".join(f"        {part},\n" for part in parts) + "    ),\n")
    table = "_SECTIONS: dict[str, tuple[str, ...]] = {\n" + "".join(entries) + "}\n"
    join = '\nTEXTS: dict[str, str] = {command: "\\n\\n".join(parts) + "\\n" for command, parts in _SECTIONS.items()}\n'
    return HEADER + constants + "\n" + table + join


def main() -> None:
    path = Path(__file__).with_name("help_texts.py")
    path.write_text(source(render_all()))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
