"""The one flag builder of every subcommand: one ``--flag`` per field of a config dataclass.

Booleans get ``--flag/--no-flag``. The options of training methods and of tasks (nested dataclasses in their
registries) get flags too, shared where the field and type agree (``--rank``); they default to "not given", so the
method's or task's own defaults apply unless the user sets one.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any

from tensorslim.options import option_flag


def _flag_type(annotation: Any) -> type:
    """The scalar type of ``int``, ``float | None``, ``str | None`` ... (annotations are strings here)."""
    hint = typing.get_type_hints(type("_", (), {"__annotations__": {"x": annotation}}))["x"]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    return hint


def _add(parser: argparse._ActionsContainer, flag: str, annotation: Any, text: str, *, default: Any) -> argparse.Action:
    kind = _flag_type(annotation)
    if default is not argparse.SUPPRESS and "(default" not in text:
        text = f"{text} (default: {default})"
    if kind is bool:
        return parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=text)
    return parser.add_argument(flag, type=kind, default=default, help=text, metavar=kind.__name__.upper())


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls: type, *, skip: tuple[str, ...] = ()) -> None:
    """One ``--flag`` per field of the dataclass ``cls`` (except ``skip``)."""
    for field in dataclasses.fields(cls):
        if field.name not in skip:
            flag = "--" + field.name.replace("_", "-")
            _add(parser, flag, field.type, field.metadata.get("help", ""), default=field.default)


def config_from_args(cls: type, args: argparse.Namespace, **extra: Any) -> Any:
    """An instance of ``cls`` from the parsed flags (``extra`` fills fields that have no flag)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.name not in extra}
    return cls(**values, **extra)


def _option_flags(owners: dict[str, type]) -> dict[str, list[tuple[str, dataclasses.Field]]]:
    """``flag -> [(owner, its field)]`` over the options dataclasses of ``owners`` (name -> type)."""
    flags: dict[str, list[tuple[str, dataclasses.Field]]] = {}
    for name, kind in owners.items():
        for field in dataclasses.fields(kind):
            flag = option_flag(kind, field.name)
            if flag in flags and _flag_type(flags[flag][0][1].type) is not _flag_type(field.type):
                raise TypeError(f"--{flag} has two types in the options ({flags[flag][0][0]} and {name})")
            flags.setdefault(flag, []).append((name, field))
    return flags


def _option_help(owned: list[tuple[str, dataclasses.Field]]) -> str:
    """One flag's help: each meaning with its own default, followed by the owners it applies to."""
    meanings: dict[str, list[str]] = {}
    for name, field in owned:
        text = field.metadata.get("help", "")
        if field.default is not None and "(default" not in text:
            text = f"{text} (default: {field.default})"
        meanings.setdefault(text, []).append(name)
    return "; ".join(f"{text} [{', '.join(names)}]" for text, names in meanings.items())


def method_owners() -> dict[str, type]:
    from tensorslim.methods import METHODS

    return {name: method.options for name, method in METHODS.items()}


def task_owners() -> dict[str, type]:
    from tensorslim.tasks import TASKS

    return {name: task.options for name, task in TASKS.items()}


def add_option_arguments(parser: argparse.ArgumentParser, owners: dict[str, type], *, title: str) -> None:
    """The flags of every owner's options, in one group; none has a default (the owner's own applies)."""
    group = parser.add_argument_group(title)
    for flag, owned in _option_flags(owners).items():
        action = _add(group, "--" + flag, owned[0][1].type, _option_help(owned), default=argparse.SUPPRESS)
        action.usage_summary = title.split(" (")[0]  # the usage names the group once (cli.main.HelpFormatter)


def options_from_args(owner: str, owners: dict[str, type], args: argparse.Namespace, *, what: str) -> dict[str, Any]:
    """The options fields of ``owner`` (a ``what``: method or task) given on the command line; a flag that only
    another owner takes is an error."""
    if owner not in owners:
        raise ValueError(f"{what}={owner!r} is unknown; allowed: {list(owners)}")
    kind = owners[owner]
    own = {option_flag(kind, f.name): f.name for f in dataclasses.fields(kind)}
    given: dict[str, Any] = {}
    for flag, owned in _option_flags(owners).items():
        dest = flag.replace("-", "_")
        if not hasattr(args, dest):
            continue
        if flag not in own:
            names = ", ".join(name for name, _ in owned)
            raise ValueError(f"--{flag} does not apply to {what} {owner!r}; it applies to: {names}")
        given[own[flag]] = getattr(args, dest)
    return given
