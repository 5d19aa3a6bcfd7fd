"""The registries of methods, models and tasks share one lookup and one registration rule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tensorslim.methods import registry as methods
from tensorslim.models import registry as models
from tensorslim.tasks import base as tasks

TABLES = [
    (methods, "METHODS", methods.register_method, methods.get_method, "method", "cola"),
    (models, "MODELS", models.register_model, models.get_model, "model", "tiny"),
    (tasks, "TASKS", tasks.register_task, tasks.get_task, "task", "lm"),
]


@pytest.mark.parametrize(("module", "table", "register", "get", "what", "known"), TABLES)
def test_a_registry_finds_its_entries_refuses_unknown_names_and_second_registrations(
    monkeypatch: pytest.MonkeyPatch,
    module: Any,
    table: str,
    register: Callable[[Any], Any],
    get: Callable[[str], Any],
    what: str,
    known: str,
) -> None:
    entries = dict(getattr(module, table))
    monkeypatch.setattr(module, table, entries)
    entry = get(known)
    assert entry is entries[known] and entry.name == known
    with pytest.raises(ValueError, match=rf"^{what}='nope' is unknown; allowed: \[.*'{known}'"):
        get("nope")
    with pytest.raises(ValueError, match=rf"^{what} '{known}' is registered twice$"):
        register(entry)
    assert entries == dict(getattr(module, table)) and list(entries).count(known) == 1
    del entries[known]
    assert register(entry) is entry and get(known) is entry


def test_a_task_lists_its_docstring_summary_unless_it_sets_a_help_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tasks, "TASKS", {})

    class Wrapped(tasks.Task):
        """A summary that wraps
        onto a second line.

        Details that the listing leaves out.
        """

        name = "wrapped"

    class Explicit(tasks.Task):
        """The API reference's words."""

        name = "explicit"
        help = "the listing's own words"

    class Bare(tasks.Task):
        name = "bare"

    assert tasks.register_task(Wrapped).help == "A summary that wraps onto a second line"
    assert tasks.register_task(Explicit).help == "the listing's own words"
    with pytest.raises(TypeError, match=r"^task class Bare has neither a docstring nor a help line"):
        tasks.register_task(Bare)
    assert list(tasks.TASKS) == ["wrapped", "explicit"] and "help" not in vars(Bare)
