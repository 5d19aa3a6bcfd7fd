"""Validation shared by the config dataclasses: one-line errors that name the value and what is allowed."""

from __future__ import annotations


def require_int(name: str, value: object, *, minimum: int = 1) -> None:
    """Raise ``ValueError`` unless ``value`` is an integer (not a bool) ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} is invalid; allowed: an integer >= {minimum}")
