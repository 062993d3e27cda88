"""One home for the test-validity rules: the parser and the generated-test gate apply the same
function, ``codea1_core.method.validity``, and agree on every answer.

How to run: ``pytest tests/core/method/test_validity.py`` (a few seconds: one GX gate run).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from codea1_core import config as config_mod
from codea1_core.method import parsing, validity
from tasks import quality

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
    result = quality.gx_gate_tests.fn(rows, config_mod.TestsConfig(max_rejected_frac=1.0))
    return [r != "expected_not_literal" for r in result.reasons]


def test_parser_gate_and_rule_agree_on_every_answer() -> None:
    rule = [validity.is_plain_literal(a, "f") for a in ANSWERS]
    assert rule == [_parser_says_literal(a) for a in ANSWERS]
    assert rule == _gate_says_literal(ANSWERS)
    assert 0 < rule.count(False) < len(rule)  # the cases above are not all one kind


def _functions_calling(path: Path, name: str) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return sorted(
        f.name
        for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef)
        and any(isinstance(c, ast.Call) and getattr(c.func, "id", None) == name for c in ast.walk(f))
    )


@pytest.mark.parametrize("module", ["codea1_core/method/parsing.py", "tasks/quality.py"])
def test_neither_the_parser_nor_the_gate_keeps_its_own_copy_of_a_rule(repo_root: Path, module: str) -> None:
    """The literal check lived twice (``parsing.is_plain_literal`` and ``quality._is_plain_literal``), the call
    and answer checks in the gate only; now only ``validity`` evaluates literals or lists forbidden names."""
    path = repo_root / module
    assert _functions_calling(path, "literal_value") == []
    assert "FORBIDDEN_NAMES = " not in path.read_text(encoding="utf-8")
    assert _functions_calling(repo_root / "codea1_core/method/validity.py", "literal_value") == [
        "is_plain_literal"
    ]


def test_the_parser_and_the_gate_call_the_same_function() -> None:
    assert parsing.is_plain_literal is validity.is_plain_literal
    assert quality.call_reason is validity.call_reason and quality.answer_reason is validity.answer_reason
