"""Validation shared by the config dataclasses: one-line errors that name the value and what is allowed."""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import math
import os
import sys
import types
import typing
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def check_fields(config: object) -> None:
    """Raise ``ValueError`` naming the first field of the dataclass ``config`` whose value does not have the type its
    annotation allows.

    Every config dataclass calls it first in ``__post_init__``, so a config is checked as data before its own range
    checks: an ``int`` field refuses bools, floats and strings; a ``float`` field takes ints and floats but neither
    bools nor non-finite values (``nan``, ``inf``); ``bool``, ``str``, ``Literal[...]``, ``X | None``, ``tuple[X, ...]``
    and class-typed fields (a ``Budget``) are checked as written; what an annotation cannot say (``Any``, a
    callable) is left to the config's own checks.
    """
    flags = {field.name: field.metadata.get("flag") for field in dataclasses.fields(config)}
    for name, hint in _field_hints(type(config)).items():
        value = getattr(config, name)
        if not _matches(value, hint):
            # an option with a command-line flag of its own (``--galore-scale`` for GaLore's ``scale``) is named by it
            shown = (flags[name] or name).replace("-", "_")
            raise ValueError(f"{shown}={value!r} is invalid; allowed: {_describe(hint)}")


@functools.cache
def _field_hints(cls: type) -> dict[str, object]:
    """The resolved annotation of each field; a name only a type checker imports leaves its field unchecked here."""
    hints = {}
    for field in dataclasses.fields(cls):
        owner = next(klass for klass in cls.__mro__ if field.name in vars(klass).get("__annotations__", {}))
        try:
            hint = eval(field.type, vars(sys.modules[owner.__module__])) if isinstance(field.type, str) else field.type
        except NameError:
            continue
        hints[field.name] = hint
    return hints


def _matches(value: object, hint: object) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any or isinstance(hint, typing.TypeVar):
        return True
    if hint is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in args)
    if origin is typing.Literal:
        return any(type(value) is type(arg) and value == arg for arg in args)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_matches(item, args[0]) for item in value)
        return len(value) == len(args) and all(_matches(item, arg) for item, arg in zip(value, args, strict=True))
    if origin is collections.abc.Callable or hint is collections.abc.Callable:
        return callable(value)
    if origin is not None:
        return isinstance(value, origin)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, hint) if isinstance(hint, type) else True


def _describe(hint: object) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(arg) for arg in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a tuple, each item {_describe(args[0])}"
        return f"a tuple of {len(args)} ({', '.join(_describe(arg) for arg in args)})"
    names = {type(None): "None", bool: "True or False", int: "an integer", float: "a finite number", str: "a text"}
    if hint in names:
        return names[hint]
    return getattr(hint, "__name__", str(hint))


def register_once(table: dict[str, T], entry: T, *, what: str) -> T:
    """Add ``entry`` to the registry ``table`` under its ``name`` and return it; a name may be registered once."""
    name = entry.name  # type: ignore[attr-defined]
    if name in table:
        raise ValueError(f"{what} {name!r} is registered twice")
    table[name] = entry
    return entry


def look_up(table: dict[str, T], name: str, *, what: str) -> T:
    """The entry of the registry ``table`` called ``name``, or a one-line ``ValueError`` listing the registered
    ones (``what`` names the argument: ``method``, ``model``, ``task``)."""
    if name not in table:
        raise ValueError(f"{what}={name!r} is unknown; allowed: {list(table)}")
    return table[name]


def require_int(name: str, value: object, *, minimum: int = 1) -> None:
    """Raise ``ValueError`` unless ``value`` is an integer (not a bool) ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} is invalid; allowed: an integer >= {minimum}")


def require_number(name: str, value: object) -> None:
    """Raise ``ValueError`` unless ``value`` is an int or a float (not a bool, not a string such as ``"1e-3"``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}={value!r} is invalid; allowed: a number")


def require_module(model: object, name: str = "model") -> None:
    """Raise ``TypeError`` unless ``model`` is a ``torch.nn.Module``."""
    from torch import nn  # here, not at the top: the command line imports this module before torch

    if not isinstance(model, nn.Module):
        raise TypeError(f"{name} of type {type(model).__name__} is invalid; allowed: a torch.nn.Module")


def require_output(name: str, path: str | os.PathLike, *, folder: bool, overwrite: bool | None = None) -> None:
    """Raise ``ValueError`` unless ``path`` can be written as a folder (``folder=True``) or a file.

    The commands check their output paths before the work, so a bad one fails at once instead of after a run. A path
    that exists must be of the right kind; one that does not must lie under a writable folder (missing folders
    between them are created when it is written). With ``overwrite=False`` an existing file, or a folder that holds
    files, is refused too (the command's ``--overwrite`` allows it); None leaves that to the caller (a run folder's
    own claim).
    """
    target = Path(path)
    kind = "folder" if folder else "file"
    if target.exists():
        if target.is_dir() != folder:
            raise ValueError(f"{name}={str(path)!r} is not a {kind}; allowed: a {kind} path")
        if overwrite is False and (not folder or any(target.iterdir())):
            what = "holds files" if folder else "exists"
            raise ValueError(f"{name}={str(path)!r} {what}; allowed: a new {kind}, or --overwrite to replace it")
        if not os.access(target, os.W_OK):
            raise ValueError(f"{name}={str(path)!r} is not writable; allowed: a writable {kind}")
        return
    ancestor = target.parent
    while not ancestor.exists():  # stops at '/' or '.' at the latest
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(
            f"{name}={str(path)!r} cannot be created ({str(ancestor)!r} is not a writable folder); allowed: a path "
            "under a writable folder"
        )
