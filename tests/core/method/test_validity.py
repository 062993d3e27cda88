"""One home for the test-validity rules: ``codea1_core.method.validity``. The parser applies them, once per
test, and records the generated-test gate's code of each kept test; the gate decides from those codes and
applies no rule itself; parser, gate and rule agree on every answer.

How to run: ``pytest tests/core/method/test_validity.py`` (a few seconds: one GX gate run).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support import checked_rows

from codea1_core import config as config_mod
from codea1_core.method import parsing, validity
from codea1_core.types import ParsedTest
from gates import generated_tests

ANSWERS = [
    "3",
    "'abc'",
    "[1, 2, [3]]",
    "{'a': (1, 2.5)}",
    "set()",
    "frozenset({1})",
    "float('nan')",
    "-7",
    "None",
    "f(2)",  # the tautology: the answer calls the function under test
    "sorted(f(2))",
    "[f, 1]",  # names the entry point
    "len([1])",  # a call of something else: not plain data
    "x",  # a free name
    "1 + 1",
    "b'\\x00'",
    "(1,)",
]


def _parser_says_literal(answer: str) -> bool:
    suite = parsing.extract_tests(
        f"```python\nassert f(1) == {answer}\n```", "f", "strict", literal_answers=True
    )
    assert len(suite.tests) + len(suite.reasons) == 1, (answer, suite)
    return "expected_not_literal" not in suite.reasons


def _gate_says_literal(answers: list[str]) -> list[bool]:
    rows = [
        {"problem_id": "p", "suite_id": i, "call": f"f({i})", "answer": a, "entry_point": "f"}
        for i, a in enumerate(answers)
    ]
    result = generated_tests.check_tests(checked_rows(rows), config_mod.TestsConfig(max_rejected_frac=1.0))
    return [r != "expected_not_literal" for r in result.reasons]


def test_parser_gate_and_rule_agree_on_every_answer() -> None:
    rule = [validity.is_plain_literal(a, "f") for a in ANSWERS]
    assert rule == [_parser_says_literal(a) for a in ANSWERS]
    assert rule == _gate_says_literal(ANSWERS)
    assert 0 < rule.count(False) < len(rule)  # the cases above are not all one kind


@pytest.mark.parametrize(
    ("answer", "plain"),
    [
        ("1" * 5000, False),  # over Python's 4,300-digit int limit: the pattern alone would accept it
        ("-" + "9" * 4299, True),
        ("'a\rb'", False),  # a raw carriage return ends the line: not a string literal
        ("'a\x00b'", False),  # a NUL byte cannot be parsed
        ("'\u2028'", True),
        ("[1, 2,]", True),
        ("00", True),
    ],
)
def test_plain_literal_shortcut_agrees_with_the_parse(answer: str, plain: bool) -> None:
    """The pattern that spares the parse of plain answers keeps its verdicts: the answers at its edges."""
    assert validity.is_plain_literal(answer, "f") is plain


def _functions_calling(path: Path, name: str) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return sorted(
        f.name
        for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef)
        and any(isinstance(c, ast.Call) and getattr(c.func, "id", None) == name for c in ast.walk(f))
    )


@pytest.mark.parametrize(
    "module", ["codea1_core/method/parsing.py", "gates/generated_tests.py", "tasks/quality.py"]
)
def test_neither_the_parser_nor_the_gate_keeps_its_own_copy_of_a_rule(repo_root: Path, module: str) -> None:
    """Only ``validity`` evaluates literals or lists forbidden names (bug guarded: the literal check had a
    second copy in the gate, and the call and answer checks lived in the gate alone)."""
    path = repo_root / module
    assert _functions_calling(path, "literal_value") == []
    assert "FORBIDDEN_NAMES = " not in path.read_text(encoding="utf-8")
    assert _functions_calling(repo_root / "codea1_core/method/validity.py", "literal_value") == [
        "is_plain_literal"
    ]


def test_the_parser_applies_the_rules_and_the_gate_none() -> None:
    """The parser calls the rules of ``validity`` (the literal check while parsing, the gate's codes after);
    the gate (``gates/generated_tests.py``) calls none of them and imports nothing of ``validity`` but
    ``OK``."""
    assert parsing.is_plain_literal is validity.is_plain_literal
    assert parsing.suite_checks is validity.suite_checks
    rules = {"is_plain_literal", "call_reason", "answer_reason", "suite_checks", "literal_value"}
    tree = ast.parse(Path(generated_tests.__file__).read_text(encoding="utf-8"))
    called = {
        getattr(c.func, "id", getattr(c.func, "attr", None))
        for c in ast.walk(tree)
        if isinstance(c, ast.Call)
    }
    assert called.isdisjoint(rules)
    from_validity = [
        n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and "validity" in (n.module or "")
    ]
    imported = {alias.name for node in from_validity for alias in node.names}
    assert imported == {"OK"}


# --------------------------------------------------------------------------------------------------
# suite_checks: the code of every kept test, as the gate reads it
# --------------------------------------------------------------------------------------------------


def _codes(pairs: list[tuple[str, str]], **kw) -> tuple[str, ...]:
    kw = {"any_function": False, "literal": True, **kw}
    return validity.suite_checks([ParsedTest(c, a) for c, a in pairs], "f", **kw)


def test_suite_checks_take_the_call_then_the_answer_then_duplicates() -> None:
    cases = [
        ("f(1)", "1", "ok"),
        ("f(1)", "2", "duplicate"),  # same call as an acceptable earlier one
        ("f(().__class__)", "1", "dunder"),
        ("f(().__class__)", "1", "dunder"),  # the call's own code wins over duplicate
        ("f(2)", "().__class__", "answer_dunder"),  # a bad answer: its code; the call still counts as seen
        ("f(2)", "3", "duplicate"),
        ("f(2)", "f(2)", "expected_not_literal"),  # the answer's code before duplicate
        (" f(3) ", " 4 ", "ok"),  # sources are stripped
        ("f(3)", "4", "duplicate"),
    ]
    assert _codes([(c, a) for c, a, _ in cases]) == tuple(code for _, _, code in cases)
    assert _codes([("g(1)", "1"), ("len(f(1))", "1")]) == ("wrong_function", "wrong_function")
    assert _codes([("g(1)", "1"), ("len(f(1))", "1")], any_function=True) == ("ok", "ok")
    assert _codes([("f(1)", "f(2)")], literal=False) == ("ok",)


PLAIN_CANDIDATES = [
    *ANSWERS,
    "float('inf')",
    "frozenset({1, 2})",
    "{'k': [1.5, None, (True,)]}",
    "['\uff3c']",  # fullwidth backslash in a string: NFKC turns it into a backslash, the source breaks
    "('\uff07',)",  # fullwidth apostrophe: NFKC closes the string early
    "['\uff45\uff56\uff41\uff4c']",  # fullwidth letters in a string: NFKC changes the text, still plain
    "-1.5e+300",
]


@pytest.mark.parametrize("answer", PLAIN_CANDIDATES)
@pytest.mark.parametrize("literal", [True, False])
def test_the_plain_shortcut_gives_the_full_checks_code(answer: str, literal: bool) -> None:
    """``plain=True`` (what the parser passes after its literal check) skips work, never changes a code."""
    if validity.is_plain_literal(answer, "f"):
        assert validity.answer_reason(answer, "f", literal, plain=True) == validity.answer_reason(
            answer, "f", literal
        )


def test_the_parser_records_one_code_per_kept_test() -> None:
    text = (
        "```python\nassert f(1) == 1\nassert f(1) == 2\nassert f(().__class__) == 3\nassert f(4) == f(4)\n```"
    )
    suite = parsing.extract_tests(text, "f")
    assert [t.call for t in suite.tests] == [
        "f(1)",
        "f(1)",
    ]  # the dunder call is refused by the parser itself
    assert suite.checks == ("ok", "duplicate") and suite.reasons == ("dunder", "expected_not_literal")
    official = parsing.extract_tests("```python\nassert len(f(1)) == 1\n```", "f", "official")
    assert official.checks == ("ok",)  # official: any call on the left is a test


# --------------------------------------------------------------------------------------------------
# The allow-list: no test's call or answer binds a name or reaches a namespace (the parser refuses it)
# --------------------------------------------------------------------------------------------------

HOSTILE_CALLS = [
    ("f((sorted := lambda *a: [7]) and [3, 1])", "walrus"),  # rebinds a builtin the reference calls
    ("f([(sorted := len) for _ in [0]])", "walrus"),  # in a comprehension: binds in the program's namespace
    ("f((lambda: (sorted := len))() and [1])", "walrus"),  # inside a lambda
    ("f((lambda s=sorted: s)([1]))", "binding"),  # a lambda default
    ("f((lambda f: f)([1]))", "binding"),  # a parameter hiding the entry point
    ("f([sorted for sorted in [len]])", "binding"),  # a loop variable hiding a builtin the call may use
    ("f([0 for x[0] in [[1]]])", "binding"),  # a loop target that writes into an object
    ("f(globals().update(sorted=len) or [1])", "forbidden_name"),
    ("f(vars().update(sorted=len) or [1])", "forbidden_name"),
    ("f(locals())", "forbidden_name"),
    ("f(setattr(f, 'x', 1))", "forbidden_name"),
    ("f(delattr(f, 'x'))", "forbidden_name"),
    ("f(exec('sorted = len') or [1])", "forbidden_name"),
    ("f(eval('1'))", "forbidden_name"),
    ("f(' '.globals)", "forbidden_name"),  # a forbidden name as an attribute too
    ("f(__import__('builtins'))", "dunder"),
    ("f(__builtins__)", "dunder"),
    ("f(f.__globals__.update(sorted=len) or [1])", "dunder"),
    ("f(f.__dict__)", "dunder"),
    ("f(f.__code__)", "dunder"),
    ("f(f.__closure__)", "dunder"),
    ("f(().__class__.__base__.__subclasses__())", "dunder"),
    ("f([].__setattr__)", "dunder"),
    ("f((x for x in [1]).gi_frame.f_globals.update(sorted=len) or [1])", "attribute"),  # no dunder needed
    ("f(f([1]).gi_frame)", "attribute"),  # an attribute of what the program returns
    ("f(list.append(f([0]), 9))", "attribute"),  # a builtin's method changing the program's object
    ("f([1]._x)", "attribute"),
    ("f(inspect.currentframe())", "free_name"),  # a name the program may define or import
    ("f(sorted)", "ok"),  # a safe builtin passed as a value
]


@pytest.mark.parametrize(("call", "code"), HOSTILE_CALLS)
def test_the_parser_refuses_every_binding_form_and_namespace_access(call: str, code: str) -> None:
    """Bug guarded: the parser kept these asserts (walrus, dunder and forbidden names were left to the
    training gate, frames and builtins' methods to nobody), so evaluation, which runs no gate, judged a
    reference whose names the call had rebound."""
    for mode in ("strict", "official"):
        suite = parsing.extract_tests(f"```python\nassert {call} == [1]\n```", "f", mode)  # type: ignore[arg-type]
        if code == "ok":
            assert [t.call for t in suite.tests] == [call] and suite.reasons == ()
        else:
            assert suite.tests == () and suite.reasons == (code,), (mode, suite)
    assert validity.call_reason(call, "f") == code


def test_answers_may_not_bind_either_with_any_expression_allowed() -> None:
    """``tests.literal_answers: false`` takes any expression as the answer, but never a binding one."""
    text = "```python\nassert f(1) == (sorted := len)\nassert f(2) == [x for x in [1]]\nassert f(3) == y\n```"
    suite = parsing.extract_tests(text, "f", literal_answers=False)
    assert [t.answer for t in suite.tests] == ["[x for x in [1]]", "y"] and suite.reasons == (
        "answer_walrus",
    )


def test_honest_calls_stay_acceptable() -> None:
    honest = [
        "f([1, -2, 3.5], key='a', *[(1, 2)], **{'k': {1: None}})",
        "f('a b'.split(), ' '.join(['x', 'y']), float('inf'), 2 ** 10 - 1, [0] * 3, (1, 2)[::-1])",
        "f(list(range(10)), sorted({3, 1}), max(1, 2), abs(-1), len('ab') > 1, 1 if True else 2)",
        "f([i * i for i in range(5) if i % 2], {k: v for k, v in zip('ab', [1, 2])}, lambda x, y: x + y)",
        "f(f(1), map(f, [1, 2]), f'{1:>3}', b'\\x00', 1j, not None)",
    ]
    assert [validity.call_reason(c, "f") for c in honest] == ["ok"] * len(honest)
