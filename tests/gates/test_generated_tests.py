"""The generated-test gate (gates.generated_tests): its columns, a reason per row, counts, report, errors."""

from __future__ import annotations

import json

import pytest
from support import checked_rows, gate_row, gated_problem

from codea1_core import config as config_mod
from codea1_core.types import ParsedSuite, ParsedTest
from gates.errors import DataQualityError
from gates.generated_tests import check_tests, gate_columns

CASES = [
    (gate_row("f(1)"), "ok"),
    (gate_row("f(lambda x: x + 1, [i for i in range(3)])"), "ok"),  # lambdas/comprehensions are fine
    (gate_row("f(1)", suite=1), "ok"),  # same call, other suite
    (gate_row("f(1)", problem="p/2"), "ok"),  # same call, other problem
    (gate_row("f(1)"), "duplicate"),
    (gate_row("g(1)"), "wrong_function"),
    (gate_row("obj.f(1)"), "wrong_function"),
    (gate_row("f(1) + 1"), "not_a_call"),
    (gate_row("import os"), "call_syntax"),
    (gate_row("x = f(1)"), "call_syntax"),
    (gate_row("f(1"), "call_syntax"),
    (gate_row("f(().__class__)"), "dunder"),
    (gate_row("f(__import__('os'))"), "dunder"),
    (gate_row("f(open('/etc/passwd'))"), "forbidden_name"),
    (gate_row("f((y := 2))"), "walrus"),
    (gate_row("f('__init__ eval(')"), "ok"),  # suspicious text inside a string literal is fine
    (gate_row("f(2)", answer="[1, 2"), "answer_syntax"),
    (gate_row("f(3)", answer="().__class__"), "answer_dunder"),
    (gate_row("f(4)", answer="(z := 1)"), "answer_walrus"),
    (gate_row("f(5)", answer="[1, 2, 3]"), "ok"),
    (gate_row("f(" + "1" * 45 + ")"), "call_too_long"),
    (gate_row("f(6)", answer="9" * 46), "answer_too_long"),
    ({**gate_row("f(7)"), "problem_id": None}, "missing_field"),
    ({**gate_row("f(8)"), "answer": None}, "missing_field"),
]


def test_gate_tests_reason_per_row_counts_and_metrics(tmp_path):
    cfg = config_mod.TestsConfig(max_call_chars=45, max_answer_chars=45, max_rejected_frac=0.9)
    result = check_tests(checked_rows([row for row, _ in CASES]), cfg, tmp_path / "gate.json")
    assert result.reasons == [reason for _, reason in CASES]
    assert result.accepted_mask.tolist() == [reason == "ok" for _, reason in CASES]
    rejected = sum(reason != "ok" for _, reason in CASES)
    assert result.rejected_rate == pytest.approx(rejected / len(CASES))
    assert result.counts["call_syntax"] == 3 and result.counts["missing_field"] == 2
    metrics = result.metrics()
    assert metrics["test/rejected_rate"] == pytest.approx(rejected / len(CASES))
    assert metrics["test/rejected/dunder"] == 2.0
    report = json.loads((tmp_path / "gate.json").read_text())
    assert report["counts"] == result.counts and report["n_rows"] == len(CASES)


def test_gate_tests_raises_with_report_path_above_max_rejected_frac(tmp_path):
    rows = checked_rows([gate_row("g(1)"), gate_row("g(2)"), gate_row("f(3)")])
    path = tmp_path / "gate.json"
    with pytest.raises(DataQualityError, match=r"66\.7% of 3 rows rejected") as info:
        check_tests(rows, config_mod.TestsConfig(max_rejected_frac=0.5), path)
    assert info.value.report_path == path
    assert json.loads(path.read_text())["counts"] == {"wrong_function": 2}
    assert [f.name for f in tmp_path.iterdir()] == ["gate.json"]  # atomic write: no temp file left
    check_tests(rows, config_mod.TestsConfig(max_rejected_frac=0.7), path)  # under the threshold: no error


def test_gate_follows_the_official_parse_mode_on_other_functions():
    """§5.2 official: any call on the left is a test (``len(f(1))`` is valid); strict (D5) rejects it."""
    calls = ["g(1)", "len(f(1))", "obj.f(1)", "f(1)", "__import__('os').f(1)", "f(1) + 1"]
    rows = [gate_row(c) for c in calls]
    official = check_tests(
        checked_rows(rows, parse_mode="official"),
        config_mod.TestsConfig(parse_mode="official", max_rejected_frac=0.9),
    )
    assert official.reasons == ["ok", "ok", "ok", "ok", "dunder", "not_a_call"]
    strict = check_tests(checked_rows(rows), config_mod.TestsConfig(max_rejected_frac=0.9))
    assert strict.reasons[:3] == ["wrong_function"] * 3 and strict.reasons[3] == "ok"


def test_gate_takes_the_parsers_codes_and_refuses_rows_without_them():
    """The gate applies no rule in Python: a row's ``check`` (the parser's code) decides, whatever the call
    says; rows without one are refused."""
    rows = [
        {**gate_row("f(1)"), "check": "ok"},
        {**gate_row("f(().__class__)"), "check": "ok"},
        {**gate_row("f(2)"), "check": "dunder"},
    ]
    result = check_tests(rows, config_mod.TestsConfig(max_rejected_frac=0.9))
    assert result.reasons == ["ok", "ok", "dunder"]
    for bad in (
        [gate_row("f(1)")],
        [{**gate_row("f(1)"), "check": "ok"}, {**gate_row("f(3)"), "check": None}],
    ):
        with pytest.raises(ValueError, match="'check' code"):
            check_tests(bad, config_mod.TestsConfig())


def test_gate_columns_lay_out_every_kept_test_in_suite_order():
    problems = [gated_problem("a"), gated_problem("b", entry_point="g")]
    suite = ParsedSuite(tests=(ParsedTest("f(1)", "1"), ParsedTest("f(2)", "2")), checks=("ok", "duplicate"))
    empty, other = ParsedSuite(), ParsedSuite(tests=(ParsedTest("g(0)", "0"),), checks=("ok",))
    table = gate_columns(problems, [[[suite, empty]], [[empty], [other]]])
    assert table == {
        "problem_id": ["a", "a", "b"],
        "suite_id": ["0/0/0", "0/0/0", "1/1/0"],
        "call": ["f(1)", "f(2)", "g(0)"],
        "answer": ["1", "2", "0"],
        "entry_point": ["f", "f", "g"],
        "check": ["ok", "duplicate", "ok"],
    }
    with pytest.raises(ValueError, match="0 checks for 1 tests"):
        gate_columns(problems[:1], [[[ParsedSuite(tests=(ParsedTest("f(1)", "1"),))]]])
