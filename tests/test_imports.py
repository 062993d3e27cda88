"""The project's import graph: no cycle among its modules, and each layer imports only the ones below it.

Layers, bottom up: ``codea1_core`` (the algorithm, pure) < ``sandbox`` (runs untrusted code) <
``tracking`` (MLflow), ``workspace`` (the training workspace on disk) and ``gates`` (the Great Expectations
data gates), side by side < ``tasks`` (thin Prefect tasks) < ``flows`` (the DVC stages, the pipeline runner,
the CLI, the deployments) < ``tools`` (lab-compare, readme-numbers, the UIs). Packages that share a layer
are independent: neither imports the other. Every module of those packages is parsed (nothing is
imported), and every import statement counts — top level, inside functions and under ``if`` — because a
function-level import is still a dependency: it only moves the cycle or the layering breach to run time.

How to run: ``pytest tests/test_imports.py`` (no model, no sandbox; a second).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

LAYERS = (
    ("codea1_core",),
    ("sandbox",),
    ("tracking", "workspace", "gates"),
    ("tasks",),
    ("flows",),
    ("tools",),
)
"""Bottom up, each layer a tuple of packages: a module may import from its own package and the layers before
it, never from a later layer nor from another package of its own layer."""

PACKAGES = tuple(package for layer in LAYERS for package in layer)
"""Every package the checks parse, bottom up."""

FRONT_DOOR = "flows.cli"
"""The ``codea1`` console script dispatches to every command, ``codea1 ui`` (``tools.ui``) included, so it may
import the top layer; no other module may import a layer above its own."""

ALLOWED_CYCLES: set[frozenset[str]] = set()
"""No cycle is allowed; kept as a named, empty set so an exception would have to be written down here."""


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file of every module of :data:`PACKAGES` (``pkg/__init__.py`` is ``pkg``)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    """Every dotted name an import statement of ``tree`` may load (``from a import b``: ``a.b`` and ``a``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against this module's package
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                yield f"{base}.{alias.name}"
            yield base


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module a dotted name loads: itself, else its longest prefix that is a module."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the project modules it imports (self-imports dropped)."""
    modules = module_files(root)
    graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets = {_resolve(n, modules) for n in _imported_names(tree, module, path.name == "__init__.py")}
        graph[module] = {t for t in targets if t and t != module and not module.startswith(t + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _layer(module: str) -> int:
    package = module.split(".")[0]
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def _breach(a: str, b: str) -> bool:
    """``a`` importing ``b`` reaches up a layer, or across to another package of its own layer."""
    if _layer(b) != _layer(a):
        return _layer(b) > _layer(a)
    return a.split(".")[0] != b.split(".")[0]


def layering_breaches(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for every import of a higher layer from a lower one (core -> sandbox/tasks/flows, ...) and
    between the packages of one layer (tracking <-> workspace <-> gates)."""
    return sorted(
        f"{a} -> {b}" for a, targets in graph.items() for b in targets if _breach(a, b) and a != FRONT_DOOR
    )


def test_no_import_cycle_among_project_modules(repo_root: Path) -> None:
    """Regression: ``flows.evaluate`` and ``flows.solve`` imported each other (``solve_benchmark``
    one way, ``load_policy`` the other, both inside functions), and ``sandbox.executor`` /
    ``sandbox.docker_executor`` did too; a cycle hides which module is the base of the other."""
    found = [c for c in cycles(import_graph(repo_root)) if frozenset(c) not in ALLOWED_CYCLES]
    assert not found, f"import cycles among project modules: {found}"


def test_each_layer_imports_only_the_layers_below(repo_root: Path) -> None:
    """codea1_core imports nothing from sandbox/tracking/workspace/gates/tasks/flows; sandbox nothing above
    it; tracking, workspace and gates nothing from each other or above; tasks nothing from flows (the whole
    point of the layering: the core is usable, and testable, without the rest)."""
    assert not layering_breaches(import_graph(repo_root))


def test_no_cycle_is_allowed() -> None:
    """The allow-list stays empty: a new cycle is fixed, not parked."""
    assert not ALLOWED_CYCLES


def test_the_checks_see_function_level_imports_and_cycles(tmp_path: Path) -> None:
    """The detector itself: a cycle made only of function-level and relative imports is found, a core module
    importing a flow is a breach, and so is one package of a shared layer importing the other, while an import
    of a lower layer is not (else the two tests above could pass on a blind graph)."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "flows" / "a.py").write_text("def f():\n    from flows.b import g\n")
    (tmp_path / "flows" / "b.py").write_text("def g():\n    from .a import f\n")
    (tmp_path / "codea1_core" / "c.py").write_text("if True:\n    import flows.a\n")
    (tmp_path / "tracking" / "t.py").write_text(
        "import codea1_core.c\ndef h():\n    from workspace.w import y\n"
    )
    (tmp_path / "workspace" / "w.py").write_text("from sandbox.x import z\n")
    (tmp_path / "sandbox" / "x.py").write_text("")
    graph = import_graph(tmp_path)
    assert cycles(graph) == [["flows.a", "flows.b"]]
    assert layering_breaches(graph) == ["codea1_core.c -> flows.a", "tracking.t -> workspace.w"]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_is_parsed(repo_root: Path, package: str) -> None:
    """Guard against a silently empty graph: each layer has modules and its own imports are resolved."""
    graph = import_graph(repo_root)
    mine = [m for m in graph if m.split(".")[0] == package]
    assert len(mine) > 2 and any(graph[m] for m in mine)
