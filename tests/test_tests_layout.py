"""The test suite's own layout: tests/ mirrors the source tree and no test module imports another.

* Every ``test_*.py`` lives in the folder of what it tests: ``tests/core/`` (and ``core/data``, ``core/method``, ...)
  for ``codea1_core/``, ``tests/sandbox/``, ``tests/tracking/``, ``tests/workspace/``, ``tests/gates/``,
  ``tests/tasks/``, ``tests/flows/``, ``tests/tools/``, ``tests/bench/``;
  only the whole-repository checks stay at the top (:data:`TOP_LEVEL`).
* Shared fakes and builders are in ``tests/support.py`` (fixtures a folder shares in its ``conftest.py``); a test
  module never imports another test module (that made ``conftest.py`` depend on ``test_train_flow``).

How to run: ``pytest tests/test_tests_layout.py`` (parses files, a second).
"""

from __future__ import annotations

import ast
from pathlib import Path

TOP_LEVEL = {"test_imports.py", "test_layout.py", "test_tests_layout.py", "test_citations.py", "test_docs.py"}
"""Tests of the repository as a whole (import graph, layout, citations, doc paths, this file)."""
MIRRORS = {
    "core": "codea1_core",
    "sandbox": "sandbox",
    "tracking": "tracking",
    "workspace": "workspace",
    "gates": "gates",
    "tasks": "tasks",
    "flows": "flows",
    "tools": "tools",
    "bench": "bench",
}
"""tests/<folder> -> the source folder it mirrors."""


def _test_modules(tests: Path) -> list[Path]:
    return sorted(tests.rglob("test_*.py"))


def imported_test_modules(path: Path) -> list[str]:
    """The ``test_*`` modules (and ``conftest``) that ``path`` imports, at any depth of the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        found += [n for n in names if n.split(".")[-1].startswith("test_") or n == "conftest"]
    return found


def misplaced(tests: Path, repo: Path) -> list[str]:
    """Test files outside the mirror: at the top (other than :data:`TOP_LEVEL`) or in a folder the source lacks."""
    bad = []
    for path in _test_modules(tests):
        rel = path.relative_to(tests)
        if len(rel.parts) == 1:
            if rel.name not in TOP_LEVEL:
                bad.append(str(rel))
            continue
        top, *sub = rel.parts[:-1]
        source = MIRRORS.get(top)
        if source is None or not (repo / source / Path(*sub) if sub else repo / source).is_dir():
            bad.append(str(rel))
    return bad


def test_no_test_module_imports_another(repo_root: Path) -> None:
    tests = repo_root / "tests"
    offenders = {
        str(p.relative_to(tests)): imported_test_modules(p)
        for p in [*tests.rglob("*.py")]
        if imported_test_modules(p)
    }
    assert not offenders, f"import shared helpers from tests/support.py instead: {offenders}"


def test_every_test_file_sits_in_the_folder_of_what_it_tests(repo_root: Path) -> None:
    assert not misplaced(repo_root / "tests", repo_root)


def test_the_checks_catch_a_cross_import_and_a_stray_file(tmp_path: Path) -> None:
    """The detectors themselves, on a synthetic tree (else both tests above could pass on blind checks)."""
    (tmp_path / "codea1_core" / "method").mkdir(parents=True)
    tests = tmp_path / "tests"
    (tests / "core" / "method").mkdir(parents=True)
    (tests / "core" / "nowhere").mkdir(parents=True)
    (tests / "core" / "method" / "test_a.py").write_text("def f():\n    from test_b import helper\n")
    (tests / "core" / "nowhere" / "test_c.py").write_text("import support\n")
    (tests / "test_stray.py").write_text("")
    assert imported_test_modules(tests / "core" / "method" / "test_a.py") == ["test_b"]
    assert imported_test_modules(tests / "core" / "nowhere" / "test_c.py") == []
    assert misplaced(tests, tmp_path) == ["core/nowhere/test_c.py", "test_stray.py"]
