"""Validation shared by the config dataclasses: one-line errors that name the value and what is allowed."""

from __future__ import annotations

import os
from pathlib import Path


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


def require_output(name: str, path: str | os.PathLike, *, folder: bool) -> None:
    """Raise ``ValueError`` unless ``path`` can be written as a folder (``folder=True``) or a file.

    The commands check their output paths before the work, so a bad one fails at once instead of after a run. A path
    that exists must be of the right kind; one that does not must lie under a writable folder (missing folders
    between them are created when it is written).
    """
    target = Path(path)
    kind = "folder" if folder else "file"
    if target.exists():
        if target.is_dir() != folder:
            raise ValueError(f"{name}={str(path)!r} is not a {kind}; allowed: a {kind} path")
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
