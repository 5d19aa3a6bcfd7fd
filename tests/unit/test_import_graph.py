"""The tensorslim package has no import cycles, deferred (function-level) imports included.

Dependencies point down the architecture (DESIGN "Rules of the house"): a layer never imports the module that collects
layers, and a registry imports nothing it registers. :data:`LAYERS` is the picture as code: every top-level module or
package of tensorslim sits in one layer, and an import between two of them points to a strictly lower layer.

Every module is parsed with ``ast``; an edge ``a -> b`` is any
``import b``, ``from b import name``, ``from a_package import b`` (``b`` a module), relative import or
``importlib.import_module("b")`` anywhere in ``a``, at module level or inside a function. ``import a.b.c`` counts as
importing ``a.b.c`` only, and a name imported from a package counts as importing the package's ``__init__``. Imports
under ``if TYPE_CHECKING:`` never run and are not edges.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tensorslim

PACKAGE_ROOT = Path(tensorslim.__file__).parent
PACKAGE = "tensorslim"

# The layered picture, lowest first: ``tensorslim.<part>`` may import parts of lower layers only (parts within one
# layer do not import each other). A new top-level module or package takes its place here.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("_version", "_checks", "options", "books", "tensor_files"),  # plain helpers; self-checking weights files
    ("registry", "functional", "decomp", "data"),  # transform records; stateless kernels; pure factorizations; data
    ("budget", "convert"),  # rank budgets; the one conversion verb
    ("models",),  # model families and presets: shapes, no method recipes
    ("layers",),  # layer families (low rank, TT, Kronecker, adapters, memory ...), each registering itself
    ("quant",),  # quantized layers and post-training quantization
    ("checkpoint",),  # training-state files
    ("pretrained",),  # saved models
    ("export",),  # export formats
    ("methods",),  # training methods: conversion + optimizer + optional hook
    ("tasks",),  # what is learned: data stream + loss + metrics
    ("generation", "distributed"),  # decoding; parallel layouts applied outside the model
    ("train",),  # the one Trainer
    # measurements, summaries, predictions and compression (healed on the Trainer) built on trained runs
    ("bench", "report", "predict", "compression"),
    ("cli",),
    ("__main__",),
)


def _module_names(root: Path) -> dict[str, Path]:
    """``{dotted module name: file}`` for every ``.py`` file of the package."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """All nodes of ``tree`` except the bodies of ``if TYPE_CHECKING:`` blocks."""
    nodes, stack = [], [tree]
    while stack:
        node = stack.pop()
        nodes.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return nodes


def _resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, target] if target else base)


def _import_module_target(node: ast.Call) -> str | None:
    """The literal module name of ``importlib.import_module("x")`` / ``import_module("x")``, else None."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name != "import_module" or not node.args:
        return None
    first = node.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The tensorslim modules that ``module`` imports anywhere in its code."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def add(name: str) -> None:
        if name in known and name != module:
            found.add(name)

    for node in _runtime_nodes(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                source = _resolve_relative(module, is_package, node.level, node.module)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                add(submodule if submodule in known else source)
        elif isinstance(node, ast.Call) and (target := _import_module_target(node)) is not None:
            add(target)
    return found


def import_graph(root: Path = PACKAGE_ROOT) -> dict[str, set[str]]:
    """``{module: modules it imports}`` restricted to the package's own modules."""
    modules = _module_names(root)
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module (each one holds a cycle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def _a_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One concrete cycle through the first module of ``component`` (breadth-first, shortest)."""
    start, members = component[0], set(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(graph[node] & members):
                if succ == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if succ not in parents:
                    parents[succ] = node
                    following.append(succ)
        frontier = following
    raise AssertionError(f"{component} is not strongly connected")


def test_graph_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The walker itself: module- and function-level, from-imports of modules and names, relative imports,
    importlib with a literal; TYPE_CHECKING blocks and unknown modules are not edges."""
    pkg = tmp_path / "tensorslim"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "import tensorslim.b\n",
        "b.py": "def f():\n    from tensorslim.sub import c\n",
        "sub/__init__.py": "from .c import name\n",
        "sub/c.py": "from .. import d\nimport importlib\nimportlib.import_module('tensorslim.e')\n",
        "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import tensorslim.a\nimport os\n",
        "e.py": "from tensorslim import a\nfrom tensorslim.sub import name\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(pkg)
    assert graph == {
        "tensorslim": set(),
        "tensorslim.a": {"tensorslim.b"},
        "tensorslim.b": {"tensorslim.sub.c"},
        "tensorslim.sub": {"tensorslim.sub.c"},
        "tensorslim.sub.c": {"tensorslim.d", "tensorslim.e"},
        "tensorslim.d": set(),
        "tensorslim.e": {"tensorslim.a", "tensorslim.sub"},
    }
    components = strongly_connected(graph)
    assert components == [["tensorslim.a", "tensorslim.b", "tensorslim.e", "tensorslim.sub", "tensorslim.sub.c"]]
    assert _a_cycle(graph, components[0]) == [
        "tensorslim.a",
        "tensorslim.b",
        "tensorslim.sub.c",
        "tensorslim.e",
        "tensorslim.a",
    ]


def test_no_import_cycles() -> None:
    graph = import_graph()
    assert "tensorslim.convert" in graph and "tensorslim.layers.lowrank" in graph
    cycles = [
        f"{' -> '.join(_a_cycle(graph, component))} (modules in the cycle: {', '.join(component)})"
        for component in strongly_connected(graph)
    ]
    assert not cycles, "import cycles in tensorslim:\n" + "\n".join(cycles)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, stack = set(), [start]
    while stack:
        for succ in graph[stack.pop()] - seen:
            seen.add(succ)
            stack.append(succ)
    return seen


def test_registry_and_convert_import_no_layer() -> None:
    """A registry imports nothing it registers: layer families register themselves (DESIGN)."""
    graph = import_graph()
    for module in ("tensorslim.registry", "tensorslim.convert"):
        layers = sorted(m for m in _reachable(graph, module) if m.startswith("tensorslim.layers"))
        assert not layers, f"{module} imports layer modules: {layers}"


def _part(module: str) -> str | None:
    """The top-level part of ``tensorslim.<part>...``; None for the package root (re-exports only, loaded lazily)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def layer_violations(graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """Every import between two top-level parts that does not point to a strictly lower layer, and every part that
    sits in no layer."""
    rank = {part: i for i, layer in enumerate(layers) for part in layer}
    problems = sorted(
        f"{part} (in {module}) sits in no layer of LAYERS"
        for module in graph
        if (part := _part(module)) is not None and part not in rank
    )
    for module in sorted(graph):
        part = _part(module)
        if part is None or part not in rank:
            continue
        for target in sorted(graph[module]):
            other = _part(target)
            if other is None or other == part or other not in rank or rank[other] < rank[part]:
                continue
            problems.append(
                f"{module} -> {target} ({part} may not import {other}: layer {rank[part]} <= {rank[other]})"
            )
    return problems


def test_layer_check_sees_upward_and_sideways_imports() -> None:
    graph = {
        "tensorslim": set(),
        "tensorslim.low": set(),
        "tensorslim.mid.a": {"tensorslim.low", "tensorslim.mid.b", "tensorslim"},
        "tensorslim.mid.b": {"tensorslim.top"},
        "tensorslim.side": {"tensorslim.mid.a"},
        "tensorslim.top": {"tensorslim.mid.a"},
        "tensorslim.stray": set(),
    }
    layers = (("low",), ("mid", "side"), ("top",))
    assert layer_violations(graph, layers) == [
        "stray (in tensorslim.stray) sits in no layer of LAYERS",
        "tensorslim.mid.b -> tensorslim.top (mid may not import top: layer 1 <= 2)",
        "tensorslim.side -> tensorslim.mid.a (side may not import mid: layer 1 <= 1)",
    ]


def test_imports_point_down_the_layers() -> None:
    """The whole package follows :data:`LAYERS`: no import points up or sideways."""
    problems = layer_violations(import_graph(), LAYERS)
    assert not problems, "imports against the layer order (tests/unit/test_import_graph.py LAYERS):\n" + "\n".join(
        problems
    )
