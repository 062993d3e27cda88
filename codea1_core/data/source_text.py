"""Dataset source text -> golden-test calls, prompts and descriptions, with ``ast`` only (docs/method.md §12).

What it does, for the loaders of ``codea1_core.data.datasets``:

* :func:`parse_assert` / :func:`parse_asserts`: a dataset assert -> a :class:`~codea1_core.types.TestCase`
  whose call is the assert's one call of the entry point and whose expected value is a
  :class:`~codea1_core.data.dataset_types.Pending` marker holding the dataset's claim (``answer`` of
  ``assert CALL == ANSWER``, else the whole assert as a boolean ``check``). ``candidate`` is renamed to
  the entry point, names bound by earlier simple assignments are substituted (D5) and
  ``pytest.approx(x)`` becomes ``x``. Asserts inside loops, branches or helpers, or whose call uses
  non-builtin names, are skipped with a reason.
* :func:`call_source`: an argument list -> the call's source (``repr`` when it round-trips, else
  ``values.to_literal``; complex numbers as ``complex(re, im)``).
* :func:`top_level_function`, :func:`signature_line`, :func:`top_level_names`, :func:`docstring_prompt`,
  :func:`describe`: a reference solution -> its ``def`` line, top-level names and imports, the code
  prompt and the problem description.

What it does not: read files, run code or decide expected values (the ``prepare`` flow runs the
reference; :func:`codea1_core.data.prepared.resolve` fills them). How to run: ``parse_assert(node, "candidate",
"f", set())``; tests in ``tests/core/data/test_datasets.py`` (``test_parse_assert_forms`` and the loader tests).
"""

from __future__ import annotations

import ast
import builtins
import copy
import math
from collections.abc import Sequence
from typing import Any

from codea1_core.data.dataset_types import DatasetError, Pending
from codea1_core.types import TestCase

_BUILTINS = frozenset(dir(builtins))


# --------------------------------------------------------------------------------------------------
# Reference source -> def line, names, prompt, description
# --------------------------------------------------------------------------------------------------


def top_level_function(source: str, name: str, where: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    """The top-level ``def name`` of ``source``; a :class:`DatasetError` (naming ``where``) otherwise."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise DatasetError(f"{where}: source does not parse: {exc.msg} (line {exc.lineno})") from None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return node
    raise DatasetError(f"{where}: no top-level function {name!r}")


def signature_line(fn: ast.FunctionDef | ast.AsyncFunctionDef, annotations: bool = True) -> str:
    """The ``def ...:`` line of ``fn`` without decorators (and without type hints unless ``annotations``)."""
    stub = copy.deepcopy(fn)
    stub.body, stub.decorator_list = [ast.Pass()], []
    if not annotations:
        stub.returns = None
        for arg in [*stub.args.posonlyargs, *stub.args.args, *stub.args.kwonlyargs]:
            arg.annotation = None
    return ast.unparse(stub).splitlines()[0]


def top_level_names(source: str) -> tuple[set[str], tuple[str, ...]]:
    """Names defined or imported at the top level of ``source``, and its import lines."""
    tree = ast.parse(source)
    names: set[str] = set()
    imports: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            imports.append(ast.unparse(node))
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names, tuple(imports)


def docstring_prompt(def_line: str, text: str) -> str:
    """A code prompt: ``def_line`` followed by ``text`` as the function's docstring (escaped)."""
    body = text.strip().replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    indented = "\n".join(f"    {line}" if line else "" for line in body.splitlines())
    return f'{def_line}\n    """\n{indented}\n    """\n'


def describe(text: str, def_line: str) -> str:
    """The problem description: the task text, then the function signature."""
    return f"{text.strip()}\n\nFunction signature: {def_line.removesuffix(':')}"


# --------------------------------------------------------------------------------------------------
# Argument values -> call source
# --------------------------------------------------------------------------------------------------


def _repr_ok(value: Any) -> bool:
    """True when ``repr(value)`` is a Python literal that evaluates back to an equal value."""
    kind = type(value)
    if kind in (int, bool, str, bytes, type(None)):
        return True
    if kind is float:
        return math.isfinite(value)  # repr(nan) / repr(inf) are names, not literals
    if kind in (list, tuple, set):
        return all(_repr_ok(v) for v in value)
    if kind is dict:
        return all(_repr_ok(k) and _repr_ok(v) for k, v in value.items())
    return False  # frozenset(...), complex, user classes


def _literal(value: Any) -> str:
    """Source of a call argument: ``repr`` when it round-trips, else ``values.to_literal``.

    Complex numbers (MBPP+ 124/252) are outside the value codec (D2): written as ``complex(re, im)``.
    """
    try:
        if _repr_ok(value):
            return repr(value)
    except (RecursionError, ValueError):  # deep nesting; ints beyond the str-conversion digit limit
        pass
    if not _has_complex(value):
        from codea1_core.values import to_literal

        return to_literal(value)
    if isinstance(value, complex):
        return f"complex({_literal(value.real)}, {_literal(value.imag)})"
    if isinstance(value, list | tuple | set):
        inner = ", ".join(_literal(v) for v in value)
        return {list: f"[{inner}]", tuple: f"({inner}{',' if len(value) == 1 else ''})"}.get(
            type(value), f"{{{inner}}}"
        )
    return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"


def _has_complex(value: Any) -> bool:
    if isinstance(value, complex):
        return True
    if isinstance(value, dict):
        return any(_has_complex(k) or _has_complex(v) for k, v in value.items())
    return isinstance(value, list | tuple | set | frozenset) and any(_has_complex(v) for v in value)


def call_source(entry_point: str, args: list[Any]) -> str:
    """Source of the call ``entry_point(*args)`` with each argument written as a literal."""
    return f"{entry_point}({', '.join(_literal(a) for a in args)})"


# --------------------------------------------------------------------------------------------------
# Asserts -> (call, Pending claim)
# --------------------------------------------------------------------------------------------------


def _free_names(node: ast.AST) -> set[str]:
    loads: set[str] = set()
    bound: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            (loads if isinstance(sub.ctx, ast.Load) else bound).add(sub.id)
        elif isinstance(sub, ast.arg):
            bound.add(sub.arg)
    return loads - bound


class _Rewrite(ast.NodeTransformer):
    """Rename ``candidate`` to the entry point and substitute names bound earlier (D5)."""

    def __init__(self, rename: dict[str, str], env: dict[str, ast.expr]):
        self.rename, self.env = rename, env

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if isinstance(node.ctx, ast.Load) and node.id in self.env:
            return copy.deepcopy(self.env[node.id])
        if node.id in self.rename:
            return ast.copy_location(ast.Name(self.rename[node.id], node.ctx), node)
        return node


def _unwrap_approx(node: ast.expr) -> ast.expr:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "approx":
        return node.args[0] if node.args else node
    return node


def parse_assert(
    node: ast.Assert,
    called: str,
    entry_point: str,
    ref_names: set[str],
    env: dict[str, ast.expr] | None = None,
) -> tuple[TestCase | None, str]:
    """One dataset assert -> (TestCase with a :class:`Pending` claim, "") or (None, reason).

    Args:
        node: The assert statement.
        called: The function name the assert calls (``candidate`` in HumanEval, else the entry point).
        entry_point: The problem's function name (the call is renamed to it).
        ref_names: Top-level names of the reference (claims may use them: they run beside it).
        env: Names bound by earlier simple assignments, substituted first.
    """
    test = _Rewrite({called: entry_point}, env or {}).visit(copy.deepcopy(node.test))
    calls = [
        n
        for n in ast.walk(test)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == entry_point
    ]
    if len(calls) != 1:
        return None, f"{len(calls)} calls of {called}"
    call = calls[0]
    extra = _free_names(call) - _BUILTINS - {entry_point}
    if extra:
        return None, f"call uses non-builtin names {sorted(extra)}"
    allowed = _BUILTINS | ref_names | {entry_point}
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        sides = [test.left, test.comparators[0]]
        if call in sides:
            answer = _unwrap_approx(sides[1] if sides[0] is call else sides[0])
            extra = _free_names(answer) - allowed
            if not extra:
                return TestCase(ast.unparse(call), Pending(answer=ast.unparse(answer))), ""
    extra = _free_names(test) - allowed
    if extra:
        return None, f"assert uses unknown names {sorted(extra)}"
    return TestCase(ast.unparse(call), Pending(check=ast.unparse(test))), ""


def parse_asserts(
    statements: Sequence[ast.stmt], called: str, entry_point: str, ref_names: set[str]
) -> tuple[list[TestCase], list[dict[str, str]]]:
    """The top-level asserts of ``statements`` -> (tests, skipped ``{"assert", "reason"}``).

    Simple assignments bind names for later asserts (D5); asserts nested in other statements are
    skipped; a call already seen is kept once. Arguments as in :func:`parse_assert`.
    """
    tests: list[TestCase] = []
    skipped: list[dict[str, str]] = []
    env: dict[str, ast.expr] = {}
    for st in statements:
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
            env[st.targets[0].id] = _Rewrite({}, env).visit(copy.deepcopy(st.value))
        elif isinstance(st, ast.Assert) and isinstance(st.test, ast.Constant):
            continue  # `assert True, "debug message"`: not a test
        elif isinstance(st, ast.Assert):
            case, reason = parse_assert(st, called, entry_point, ref_names, env)
            if case is None:
                skipped.append({"assert": ast.unparse(st)[:300], "reason": reason})
            elif case.call not in {t.call for t in tests}:
                tests.append(case)
        else:  # asserts in loops, branches, with-blocks or helpers depend on local state
            kind = type(st).__name__
            skipped += [
                {"assert": ast.unparse(a)[:300], "reason": f"inside {kind}"}
                for a in ast.walk(st)
                if isinstance(a, ast.Assert)
            ]
    return tests, skipped
