"""Tautological tests (``assert f(2) == f(2)``) must earn nothing.

The predicted answer is evaluated next to the reference (docs/method.md §6.2), so an answer that calls the
entry point always "predicts" the GT value: such a suite scored 8 kept / 0 invalid before. Expected values
must now be plain data (``tests.literal_answers``, default on) in both parse modes and in the GX gate, with
the reason ``expected_not_literal``; gate rows are NFKC-normalised before the name checks.
"""

from __future__ import annotations

import pytest
from support import checked_rows

import sandbox
from codea1_core.config import RewardConfig, TestsConfig
from codea1_core.method.outcomes import plan_problem
from codea1_core.method.parsing import extract_tests
from codea1_core.method.rewards import score_problem
from codea1_core.types import Problem, TestCase
from tasks.quality import gx_gate_tests

REF = "def f(x):\n    return x + 1\n"
BUGGY = "def f(x):\n    return x + 1 if x < 3 else x"
PROBLEM = Problem(
    id="toy/taut",
    source="lab",
    split="train",
    prompt="def f(x):",
    description="f(x) returns x + 1.",
    entry_point="f",
    reference_solution=REF,
    tests=(TestCase("f(1)", 2),),
)
TAUTOLOGIES = [
    "assert f(2) == f(2)",
    "y = f(3)\nassert f(3) == y",
    "assert f(4) == (lambda: f(4))()",
    "assert f(5) == sorted([f(5)])[0]",
    "assert f(6) == f(6) + 0",
    "assert f(7) == int(f(7))",
    "z = f(8)\nassert f(8) == z",
    "assert f(9) == max(f(9), 0)",
]
HONEST = ["assert f(0) == 1", "assert f(3) == 4", "assert f(4) == 5", "assert f(5) == 6", "assert f(1) == 3"]


def block(lines: list[str]) -> str:
    return "```python\n" + "\n".join(lines) + "\n```"


@pytest.mark.parametrize("mode", ["strict", "official"])
@pytest.mark.parametrize("source", TAUTOLOGIES)
def test_an_answer_that_is_not_plain_data_is_rejected_in_every_mode(source, mode):
    suite = extract_tests(block([source]), "f", mode)
    assert suite.tests == () and suite.reasons == ("expected_not_literal",)


@pytest.mark.parametrize("mode", ["strict", "official"])
@pytest.mark.parametrize(
    "answer", ["-1", "(1, 'a')", "{1: [2.5, None]}", "float('nan')", "set()", "b'x'", "True", "1e+300"]
)
def test_plain_data_answers_are_kept(answer, mode):
    suite = extract_tests(block([f"assert f(0) == {answer}"]), "f", mode)
    assert [t.answer for t in suite.tests] == [answer] and suite.invalid == 0


def run_real(parsed_suites):
    """The suites against the buggy code through the real sandbox, scored with K = 8."""
    plan = plan_problem(PROBLEM, [BUGGY], [parsed_suites])
    with sandbox.ProcessExecutor(workers=1, limits=sandbox.ExecLimits(call_timeout_s=1.0)) as ex:
        ref_out = ex.run(*plan.reference_job())
        matrix = plan.assemble(ref_out, ex.run_many(plan.candidate_jobs(ref_out)), 1e-6, 1e-6)
    return matrix, score_problem(matrix, RewardConfig(k=8))


def test_the_tautological_suite_scores_invalid_and_the_honest_one_is_unchanged():
    taut, honest = block(TAUTOLOGIES), block(HONEST)
    official = [extract_tests(t, "f", "strict", literal_answers=False) for t in (taut, honest)]
    ours = [extract_tests(t, "f", "strict") for t in (taut, honest)]
    before, before_scores = run_real(official)
    after, after_scores = run_real(ours)
    assert (before.suites[0][0].valid, before.suites[0][0].invalid) == (8, 0)  # the reward hack
    assert (after.suites[0][0].valid, after.suites[0][0].invalid) == (0, 8)
    assert after_scores.test_rewards[0][0] == 0.0 < before_scores.test_rewards[0][0]
    assert after.suites[0][1] == before.suites[0][1]  # the honest suite: same tests, same verdicts
    assert after_scores.test_rewards[0][1] == before_scores.test_rewards[0][1] > 0.0
    assert after.suites[0][1].fails == (False, True, True, True, False)  # exposes the bug 3 times


def gate(rows, **cfg):
    rows = [dict(problem_id="p", suite_id=f"s{i}", entry_point="f", **r) for i, r in enumerate(rows)]
    tests_cfg = TestsConfig(max_rejected_frac=1.0, **cfg)
    rows = checked_rows(rows, tests_cfg.parse_mode, tests_cfg.literal_answers)
    return gx_gate_tests.fn(rows, tests_cfg).reasons


def test_the_gate_rejects_non_literal_answers_given_directly():
    rows = [
        {"call": "f(2)", "answer": "f(2)"},
        {"call": "f(2)", "answer": "sorted(f(2))"},
        {"call": "f(2)", "answer": "(lambda: 3)()"},
        {"call": "f(2)", "answer": "[1, (2, 'x')]"},
        {"call": "f(2)", "answer": "float('inf')"},
    ]
    assert gate(rows) == ["expected_not_literal"] * 3 + ["ok", "ok"]
    assert gate(rows, literal_answers=False) == ["ok"] * 5  # the official rule


def test_the_gate_normalises_names_nfkc_before_checking_them():
    rows = [
        {"call": "f(\uff45\uff56\uff41\uff4c('1'))", "answer": "1"},  # fullwidth eval
        {"call": "f(1)", "answer": "\uff45\uff58\uff45\uff43('1')"},  # fullwidth exec
        {"call": "\uff46(1)", "answer": "2"},  # fullwidth f is the entry point
        {"call": "f(1)", "answer": "\uff46(1)"},  # ... and names it in the answer
        {"call": "f(_\uff3f\uff43\uff4c\uff41\uff53\uff53__)", "answer": "2"},  # __class__ spelled wide
    ]
    assert gate(rows) == ["forbidden_name", "answer_forbidden_name", "ok", "expected_not_literal", "dunder"]
