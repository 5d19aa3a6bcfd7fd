"""MkDocs hook: the API reference page lists every public name of ``tensorslim``, read from the package itself.

``docs/reference.md`` holds the marker ``<!-- public api -->``; at build time it becomes one mkdocstrings entry
(``::: module.name``) per name in ``tensorslim._EXPORTS``, grouped by the module that defines it. The names are read
from ``tensorslim/__init__.py``'s source, so the build imports nothing and the page cannot fall behind the package.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path
from typing import Any

MARKER = "<!-- public api -->"
PACKAGE_INIT = Path(__file__).resolve().parent / "tensorslim" / "__init__.py"


def public_api(init: Path = PACKAGE_INIT) -> dict[str, str]:
    """``{name: defining module}`` from the ``_EXPORTS`` literal of the package's ``__init__.py``."""
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_EXPORTS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError(f"{init} defines no _EXPORTS")


def reference_markdown(exports: dict[str, str]) -> str:
    """One section per defining module, one ``::: module.name`` entry per public name, in the package's order."""
    by_module: dict[str, list[str]] = defaultdict(list)
    for name, module in exports.items():
        by_module[module].append(name)
    lines = []
    for module, names in by_module.items():
        lines += [f"## `{module}`", ""]
        for name in names:
            lines += [f"::: {module}.{name}", "    options:", "      heading_level: 3", ""]
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if page.file.src_uri != "reference.md":
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"docs/reference.md lost its {MARKER!r} marker")
    return markdown.replace(MARKER, reference_markdown(public_api()))
