"""The one flag builder of every subcommand: one ``--flag`` per field of a config dataclass.

Booleans get ``--flag/--no-flag``. A training method's own options (a nested dataclass in the method registry) get
flags too, shared between methods where the field and type agree (``--rank``); they default to "not given", so a
method's own defaults apply unless the user sets one.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any


def _flag_type(annotation: Any) -> type:
    """The scalar type of ``int``, ``float | None``, ``str | None`` ... (annotations are strings here)."""
    hint = typing.get_type_hints(type("_", (), {"__annotations__": {"x": annotation}}))["x"]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    return hint


def _add(parser: argparse._ActionsContainer, flag: str, annotation: Any, text: str, *, default: Any) -> None:
    kind = _flag_type(annotation)
    if default is not argparse.SUPPRESS and "(default" not in text:
        text = f"{text} (default: {default})"
    if kind is bool:
        parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=text)
    else:
        parser.add_argument(flag, type=kind, default=default, help=text, metavar=kind.__name__.upper())


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


def _option_flags() -> dict[str, tuple[dataclasses.Field, list[str]]]:
    """``flag -> (field, [methods that take it])`` over every registered method's options."""
    from tensorslim.methods import METHODS
    from tensorslim.methods.registry import option_flag

    flags: dict[str, tuple[dataclasses.Field, list[str]]] = {}
    for name, method in METHODS.items():
        for field in dataclasses.fields(method.options):
            flag = option_flag(method.options, field.name)
            if flag in flags and _flag_type(flags[flag][0].type) is not _flag_type(field.type):
                raise TypeError(f"--{flag} has two types in the method options ({flags[flag][1][0]} and {name})")
            flags.setdefault(flag, (field, []))[1].append(name)
    return flags


def add_method_option_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of every method's options, in one group; none has a default (the method's own applies)."""
    group = parser.add_argument_group("method options (each applies to the methods named)")
    for flag, (field, methods) in _option_flags().items():
        text = f"{field.metadata.get('help', '')} [{', '.join(methods)}]"
        _add(group, "--" + flag, field.type, text, default=argparse.SUPPRESS)


def method_options_from_args(method: str, args: argparse.Namespace) -> dict[str, Any]:
    """The options fields of ``method`` that were given on the command line; a flag of another method is an error."""
    from tensorslim.methods import get_method
    from tensorslim.methods.registry import option_flag

    kind = get_method(method).options
    own = {option_flag(kind, f.name): f.name for f in dataclasses.fields(kind)}
    given: dict[str, Any] = {}
    for flag, (_, methods) in _option_flags().items():
        dest = flag.replace("-", "_")
        if not hasattr(args, dest):
            continue
        if flag not in own:
            raise ValueError(f"--{flag} does not apply to method {method!r}; it applies to: {', '.join(methods)}")
        given[own[flag]] = getattr(args, dest)
    return given
