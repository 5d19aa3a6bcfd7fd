"""Options of methods and tasks: frozen dataclasses whose fields become command-line flags.

A training method (:mod:`tensorslim.methods`) or a task (:mod:`tensorslim.tasks`) names its options dataclass; a run
carries one instance of each, so the run's own config has no method- or task-specific fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


def option(default: Any, help: str, *, flag: str | None = None) -> Any:
    """A field of an options dataclass; ``flag`` is its command-line name when it is not ``<field>``."""
    metadata = {"help": help} if flag is None else {"help": help, "flag": flag}
    return dataclasses.field(default=default, metadata=metadata)


def option_flag(options: type, name: str) -> str:
    """The ``--flag`` (without dashes) of field ``name`` of the options dataclass ``options``."""
    meta = next(f.metadata for f in dataclasses.fields(options) if f.name == name)
    return meta.get("flag", name.replace("_", "-"))


def resolve_options(kind: type, options: Any, *, owner: str) -> Any:
    """An instance of ``kind`` from ``options``: itself, a mapping of some fields, another options dataclass (its
    fields that differ from their defaults carry over), or None for the defaults.

    Args:
        kind: the options dataclass.
        options: what the user gave.
        owner: e.g. ``"method 'cola'"``, for error messages.
    """
    if options is None:
        return kind()
    if dataclasses.is_dataclass(options) and not isinstance(options, kind):
        # e.g. ``dataclasses.replace(config, method=...)`` keeps the old method's options: carry over what was set.
        options = {
            f.name: getattr(options, f.name)
            for f in dataclasses.fields(options)
            if getattr(options, f.name) != f.default
        }
    if isinstance(options, Mapping):
        allowed = [f.name for f in dataclasses.fields(kind)]
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise ValueError(f"options {unknown} do not apply to {owner}; allowed: {allowed}")
        return kind(**options)
    if not isinstance(options, kind):
        raise TypeError(f"options of type {type(options).__name__} do not fit {owner}; allowed: {kind.__name__}")
    return options
