"""The test-validity rules, in one place: what makes a generated test's call and predicted answer acceptable.

What it does: the per-test checks, each returning a reason code (``"ok"`` when acceptable). The parser
(:mod:`codea1_core.method.parsing`) applies every one of them, once per test, when it turns an ``assert``
into a test:

* :func:`is_plain_literal` — the predicted answer is plain data (``codea1_core.types.literal_value``) that
  names no entry point (``tests.literal_answers``; reason ``expected_not_literal``). The parser rejects
  such an assert itself (counted invalid).
* :func:`suite_checks` — the code of every test the parser kept, carried in ``ParsedSuite.checks`` for the
  generated-test gate (``tasks.quality.gx_gate_tests``, whose GX expectations reject what is not ``ok``):
  the first that applies of :func:`call_reason` (``call_syntax``, ``not_a_call``, ``wrong_function`` in
  strict parse mode, ``dunder``, ``forbidden_name``, ``walrus``), :func:`answer_reason` (``answer_syntax``,
  ``answer_dunder``, ``answer_forbidden_name``, ``answer_walrus``, ``expected_not_literal``) and
  ``duplicate`` (the same call source as an earlier test of the suite).

Sources are NFKC-normalised before the call and answer checks, as Python does for identifiers
(``ｅｖａｌ`` is ``eval``). These checks are data quality, **not** security: untrusted code is contained by the
sandbox only.
What it does not: parse model responses (``parsing``), check lengths or missing fields (the gate's GX
expectations do), or decide a batch (the gate does).
How to test: ``pytest tests/core/method/test_validity.py``.
"""

from __future__ import annotations

import ast
import functools
import re
import unicodedata
from collections.abc import Sequence

from codea1_core.types import ParsedTest, literal_value

OK = "ok"
DUPLICATE = "duplicate"
FORBIDDEN_NAMES = frozenset(
    {
        "eval",
        "exec",
        "compile",
        "open",
        "input",
        "breakpoint",
        "globals",
        "locals",
        "vars",
        "getattr",
        "setattr",
        "delattr",
        "exit",
        "quit",
        "importlib",
        "help",
        "memoryview",
    }
)
_PARSE_ERRORS = (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError)
_SUSPECT = re.compile(r"__|:=|\b(?:await|yield|" + "|".join(sorted(FORBIDDEN_NAMES)) + r")\b")
_INT = r"-?(?:0|[1-9][0-9]*)"
_ATOM = rf"{_INT}(?:\.[0-9]+)?|True|False|None|'[^'\\\n]*'|\"[^\"\\\n]*\""
_SIMPLE_LITERAL = re.compile(rf"(?:{_ATOM})|\[ *(?:{_INT} *(?:, *{_INT} *)*,? *)?\]")


def is_plain_literal(answer: str, entry_point: str, tree: ast.Expression | None = None) -> bool:
    """True when ``answer`` is plain data (no call, no name of the function under test).

    ``tree``: ``answer`` already parsed (``mode="eval"``), to skip a second parse.
    """
    try:
        if tree is None:
            tree = ast.parse(answer, mode="eval")
        if any(isinstance(n, ast.Name) and n.id == entry_point for n in ast.walk(tree)):
            return False
        literal_value(answer)
    except (*_PARSE_ERRORS, TypeError):
        return False
    return True


def _names_reason(source: str, tree: ast.AST, prefix: str) -> str:
    if not _SUSPECT.search(source):  # fast path: none of the flagged spellings appears anywhere
        return OK
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id.startswith("__") and node.id.endswith("__"):
                return prefix + "dunder"
            if node.id in FORBIDDEN_NAMES:
                return prefix + "forbidden_name"
        elif isinstance(node, ast.Attribute) and node.attr.startswith("__"):
            return prefix + "dunder"
        elif isinstance(node, ast.NamedExpr):
            return prefix + "walrus"
        elif isinstance(node, ast.Await | ast.Yield | ast.YieldFrom):
            return prefix + "syntax"
    return OK


@functools.lru_cache(maxsize=4096)  # the suites written for one problem repeat calls; the code is pure
def call_reason(call: str, entry_point: str, any_function: bool = False) -> str:
    """Reason code of one call source (``ok`` when acceptable).

    ``any_function`` (``tests.parse_mode: official``, §5.2): any call is a test, as the official parser keeps
    ``assert len(f(x)) == 2``; the strict mode (D5) requires a call of the entry point.
    """
    call, entry_point = unicodedata.normalize("NFKC", call), unicodedata.normalize("NFKC", entry_point)
    try:
        tree = ast.parse(call, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "call_syntax"
    body = tree.body
    if not isinstance(body, ast.Call):
        return "not_a_call"
    if not any_function and not (isinstance(body.func, ast.Name) and body.func.id == entry_point):
        return "wrong_function"
    return _names_reason(call, tree, "")


def answer_reason(answer: str, entry_point: str, literal: bool = True, *, plain: bool = False) -> str:
    """Reason code of one predicted answer; ``literal``: it must be plain data (``tests.literal_answers``).

    ``plain``: :func:`is_plain_literal` already holds for ``answer`` as written (the parser applied it).
    Such an answer names nothing the name checks flag (plain data has no attribute, walrus or other name
    than ``float``, ``set`` and ``frozenset``), so it is acceptable as it is unless NFKC normalisation
    changes it.
    """
    if _SIMPLE_LITERAL.fullmatch(answer):  # fast path: a number, bool, None, plain string or flat int list
        return OK
    normal, normal_ep = unicodedata.normalize("NFKC", answer), unicodedata.normalize("NFKC", entry_point)
    if plain and normal == answer and normal_ep == entry_point:
        return OK
    try:
        tree = ast.parse(normal, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "answer_syntax"
    names = _names_reason(normal, tree, "answer_")
    if names == OK and literal and not is_plain_literal(normal, normal_ep, tree):
        return "expected_not_literal"
    return names


def suite_checks(
    tests: Sequence[ParsedTest],
    entry_point: str,
    *,
    any_function: bool,
    literal: bool,
    plain_answers: bool = False,
) -> tuple[str, ...]:
    """The reason code of every test of one suite, in order (``ok`` when acceptable).

    A test's code is the first that applies of :func:`call_reason`, :func:`answer_reason` and ``duplicate``:
    the same call source (stripped; the parser's calls come ``ast.unparse``-normalized, so equal source is
    the same call) as an earlier test of the suite whose call is acceptable.

    Args:
        tests: One suite's tests in document order.
        entry_point: Name of the function under test.
        any_function: ``tests.parse_mode: official``: a call of any function is a test (:func:`call_reason`).
        literal: ``tests.literal_answers``.
        plain_answers: Every answer already passed :func:`is_plain_literal` (``answer_reason``'s ``plain``).
    """
    codes: list[str] = []
    calls_ok: set[str] = set()
    for test in tests:
        call = test.call.strip()
        code = call_reason(call, entry_point, any_function)
        if code == OK:
            code = answer_reason(test.answer.strip(), entry_point, literal, plain=plain_answers)
            if code == OK and call in calls_ok:
                code = DUPLICATE
            calls_ok.add(call)
        codes.append(code)
    return tuple(codes)
