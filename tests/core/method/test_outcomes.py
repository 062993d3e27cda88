"""The pure execution plan and OutcomeMatrix assembly (docs/method.md §6, D1-D4).

Programs run through a tiny in-process fake executor (``local_run``): these are unit tests of the layer
above the sandbox. One test at the end runs the same plan through the real ``sandbox`` when it exists.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from codea1_core import values
from codea1_core.config import RewardConfig
from codea1_core.method.outcomes import SENTINEL_EXPR, candidate_program, plan_golden, plan_problem
from codea1_core.method.parsing import extract_tests
from codea1_core.method.rewards import score_problem
from codea1_core.types import (
    CallOutcome,
    OutcomeMatrix,
    ParsedSuite,
    ParsedTest,
    Problem,
    TestCase,
    literal_value,
)

REF = "import math\n\ndef f(x):\n    if x == 13:\n        raise ValueError('unlucky')\n    return x + 1\n"
PROBLEM = Problem(
    id="toy/0",
    source="lab",
    split="train",
    prompt="def f(x):",
    description="f(x) returns x + 1.",
    entry_point="f",
    reference_solution=REF,
    tests=(TestCase("f(1)", 2), TestCase("f(5)", 6)),
)
GOOD = "def f(x):\n    return x + 1"
BUGGY = "def f(x):\n    return x + 1 if x < 3 else x"
BROKEN = "def f(x) return x"


def local_run(job: tuple[str, list[str]]) -> list[CallOutcome]:
    """In-process stand-in for ``ProcessExecutor.run``: exec the program, eval each expression, encode."""
    program, exprs = job
    ns: dict = {}
    try:
        exec(compile(program, "<program>", "exec"), ns)
    except Exception as exc:
        return [CallOutcome("program_error", error=f"{type(exc).__name__}: {exc}") for _ in exprs]
    out = []
    for expr in exprs:
        try:
            value = eval(expr, ns)
        except Exception as exc:
            out.append(CallOutcome("error", error=f"{type(exc).__name__}: {exc}"))
            continue
        try:
            out.append(CallOutcome("ok", value=values.decode(values.encode(value))))
        except values.UnsupportedValue:
            out.append(CallOutcome("unsupported_output", error="unsupported"))
    return out


def suite(*pairs: tuple[str, str], invalid: int = 0, nonprintable: float = 0.0) -> ParsedSuite:
    reasons = ("no_call",) * invalid
    return ParsedSuite(tuple(ParsedTest(c, a) for c, a in pairs), invalid, reasons, nonprintable)


def run_plan(plan, rel_tol=1e-6, abs_tol=1e-6, ref_override=None, cand_override=None):
    ref_job = plan.reference_job()
    ref_out = ref_override(ref_job) if ref_override else local_run(ref_job)
    jobs = plan.candidate_jobs(ref_out)
    cand_out = [(cand_override or local_run)(job) for job in jobs]
    return plan.assemble(ref_out, cand_out, rel_tol, abs_tol)


# --------------------------------------------------------------------------------------------------
# jobs
# --------------------------------------------------------------------------------------------------


def test_reference_job_runs_each_unique_call_and_answer_once():
    s1 = suite(("f(1)", "2"), ("f(2)", "3"))
    s2 = suite(("f(2)", "f(1) + 1"), ("f(1)", "2"))
    plan = plan_problem(PROBLEM, [GOOD, BUGGY], [[s1, s2], [s2]], replay=[TestCase("f(9)", 10)])
    program, exprs = plan.reference_job()
    assert program == REF
    assert exprs == ["f(1)", "2", "f(2)", "3", "f(1) + 1"]


def test_candidate_jobs_keep_calls_that_ran_on_gt_replay_first_each_once():
    s1 = suite(("f(13)", "14"), ("f(2)", "3"), ("f(2)", "3"), ("g(1)", "0"))
    plan = plan_problem(
        PROBLEM, [GOOD, BUGGY], [[s1], [suite()]], replay=[TestCase("f(2)", 3), TestCase("f(7)", 8)]
    )
    jobs = plan.candidate_jobs(local_run(plan.reference_job()))
    assert [exprs for _, exprs in jobs] == [["f(2)", "f(7)"], ["f(2)", "f(7)"]]
    assert jobs[0][0] == "import math\n" + GOOD  # the reference's imports come first (§6.2 step 1)
    lonely = plan_problem(PROBLEM, [GOOD], [[suite(("f(13)", "1"))]], replay=[])
    assert lonely.candidate_jobs(local_run(lonely.reference_job()))[0][1] == [SENTINEL_EXPR]


def test_candidate_program_keeps_docstring_and_future_imports_first():
    code = '"""Doc."""\nfrom __future__ import annotations\nimport os\n\ndef f(x: List[int]) -> int:\n    return 1'
    typed = dataclasses.replace(PROBLEM, imports=("from typing import List",), reference_solution=GOOD)
    program = candidate_program(typed, code)
    assert program.splitlines()[:3] == [
        '"""Doc."""',
        "from __future__ import annotations",
        "from typing import List",
    ]
    assert local_run((program, ["f([1])"]))[0].value == 1
    assert candidate_program(dataclasses.replace(PROBLEM, reference_solution=GOOD), "x = 1") == "x = 1"
    assert candidate_program(PROBLEM, BROKEN) == "import math\n" + BROKEN  # the reference's import


# --------------------------------------------------------------------------------------------------
# assembly
# --------------------------------------------------------------------------------------------------


def test_validity_and_gt_filling_per_section_6_and_d1():
    s = suite(
        ("f(1)", "2"),  # valid, right answer
        ("f(2)", "99"),  # valid, wrong answer: counts invalid, stays kept with the GT value
        ("f(13)", "14"),  # raises on GT: invalid, not kept
        ("f(1)", "2"),  # duplicate: invalid, not kept
        ("f(5)", "undefined_name"),  # answer raises: invalid, kept
        ("f(0.5)", "1.5000001"),  # within the float tolerance: right answer
        invalid=1,  # one assert the parser already rejected
        nonprintable=0.25,
    )
    matrix = run_plan(plan_problem(PROBLEM, [BUGGY], [[s]], replay=[]))
    out = matrix.suites[0][0]
    assert [t.call for t in out.tests] == ["f(1)", "f(2)", "f(5)", "f(0.5)"]
    assert [t.expected for t in out.tests] == [2, 3, 6, 1.5]
    assert out.valid == 4
    assert out.invalid == 5
    assert out.reasons == ("no_call", "wrong_answer", "gt_error", "duplicate", "wrong_answer")
    assert out.fails == (False, False, True, False)  # BUGGY returns 5 for f(5)
    assert out.nonprintable == 0.25
    assert matrix.code_valid == (True,) and matrix.code_infra == (False,) and not matrix.problem_infra


def test_gt_timeout_and_unsupported_output_make_a_test_invalid():
    def ref_run(job):
        return [
            CallOutcome("timeout") if e == "f(7)" else CallOutcome("unsupported_output") if e == "f(8)" else o
            for e, o in zip(job[1], local_run(job), strict=True)
        ]

    s = suite(("f(7)", "8"), ("f(8)", "9"), ("f(1)", "2"))
    out = run_plan(plan_problem(PROBLEM, [GOOD], [[s]]), ref_override=ref_run).suites[0][0]
    assert out.valid == 1 and out.reasons == ("gt_timeout", "gt_unsupported_output")


def test_candidate_failures_errors_and_invalid_code():
    s = suite(("f(1)", "2"), ("f(4)", "5"))
    matrix = run_plan(plan_problem(PROBLEM, [GOOD, BUGGY, BROKEN, "def f(x):\n    return 1 / 0"], [[s]] * 4))
    assert [row[0].fails for row in matrix.suites] == [
        (False, False),
        (False, True),
        (True, True),
        (True, True),
    ]
    assert matrix.code_valid == (True, True, False, True)  # a raising call is a failure, not an invalid code
    assert [row[0].valid for row in matrix.suites] == [2, 2, 2, 2]  # validity depends on GT only


def test_float_tolerance_is_applied_in_the_parent():
    s = suite(("f(0.1)", "1.1"))
    near = "def f(x):\n    return x + 1 + 1e-9"
    assert run_plan(plan_problem(PROBLEM, [near], [[s]])).suites[0][0].fails == (False,)
    assert run_plan(plan_problem(PROBLEM, [near], [[s]]), 0.0, 0.0).suites[0][0].fails == (True,)


def test_infra_error_masks_the_code_and_on_the_reference_the_problem():
    s = suite(("f(1)", "2"), ("f(4)", "5"))
    plan = plan_problem(PROBLEM, [GOOD, BUGGY], [[s], [s]], replay=[TestCase("f(4)", 5)])
    ref_out = local_run(plan.reference_job())
    cand_out = [local_run(job) for job in plan.candidate_jobs(ref_out)]
    cand_out[1][1] = CallOutcome("infra_error", error="worker died")
    matrix = plan.assemble(ref_out, cand_out, 1e-6, 1e-6)
    assert matrix.code_infra == (False, True) and matrix.code_valid == (True, False)
    assert matrix.failed_tests() == [] and matrix.passed_replay() == [TestCase("f(4)", 5)]

    broken_ref = [CallOutcome("infra_error", error="pipe")] + ref_out[1:]
    jobs = plan.candidate_jobs(broken_ref)
    assert [exprs for _, exprs in jobs] == [[SENTINEL_EXPR]] * 2  # nothing worth running
    masked = plan.assemble(broken_ref, [local_run(j) for j in jobs], 1e-6, 1e-6)
    assert masked.problem_infra and "infra_error" in masked.problem_error
    assert masked.failed_tests() == [] and masked.passed_replay() == []


def test_a_reference_that_cannot_load_masks_the_problem():
    bad = Problem(**{**PROBLEM.__dict__, "reference_solution": "import no_such_module_xyz\n"})
    matrix = run_plan(plan_problem(bad, [GOOD], [[suite(("f(1)", "2"))]]))
    assert matrix.problem_infra and "reference solution failed" in matrix.problem_error


def test_mistake_book_lists_count_duplicates_and_only_valid_codes():
    s = suite(("f(4)", "5"), ("f(1)", "2"))
    replay = [TestCase("f(1)", 2), TestCase("f(6)", 7)]
    matrix = run_plan(plan_problem(PROBLEM, [BUGGY, BUGGY, BROKEN], [[s, s], [s], [s]], replay=replay))
    assert (
        matrix.failed_tests() == [TestCase("f(4)", 5)] * 3
    )  # 2 suites of code 0 + 1 of code 1; BROKEN skipped
    assert matrix.passed_replay() == [TestCase("f(1)", 2)] * 2
    assert matrix.replay_passed == ((True, False), (True, False), (False, False))


def test_wrong_outcome_counts_are_a_clear_error():
    plan = plan_problem(PROBLEM, [GOOD], [[suite(("f(1)", "2"))]])
    with pytest.raises(ValueError, match="toy/0: the reference job has 1 outcomes for 2"):
        plan.candidate_jobs([CallOutcome("ok", 2)])
    ref_out = local_run(plan.reference_job())
    with pytest.raises(ValueError, match="toy/0: candidate job 0 has 0 outcomes"):
        plan.assemble(ref_out, [[]], 0.0, 0.0)
    with pytest.raises(ValueError, match="2 codes but 1 suite lists"):
        plan_problem(PROBLEM, [GOOD, GOOD], [[]])


def test_to_rows_are_flat_parquet_friendly_and_round_trip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    float_ref = Problem(**{**PROBLEM.__dict__, "reference_solution": "def f(x):\n    return float(x)\n"})
    s = suite(("f('nan')", "0"), ("f(2)", "2.0"), ("f('-inf')", "0"))
    replay = [TestCase("f(3)", 3.0), TestCase("f(0)", frozenset({1}))]
    matrix = run_plan(plan_problem(float_ref, [GOOD, BUGGY, BROKEN], [[s, s], [s, s], [s, s]], replay=replay))
    rows = matrix.to_rows()
    assert [(r["kind"], r["m"], r["n"]) for r in rows] == [
        (kind, m, n) for m in range(3) for kind, n in (("suite", 0), ("suite", 1), ("replay", -1))
    ]
    assert len({tuple(sorted(r)) for r in rows}) == 1  # one schema
    assert rows[0]["expected"] == ["float('nan')", "2.0", "float('-inf')"] and rows[0]["invalid"] == 2
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "outcomes.parquet")
    back = pq.read_table(tmp_path / "outcomes.parquet").to_pylist()
    rebuilt = OutcomeMatrix.from_rows(back)
    assert rebuilt.code_valid == matrix.code_valid and rebuilt.replay_passed == matrix.replay_passed
    assert [[(x.valid, x.invalid, x.fails, x.reasons) for x in row] for row in rebuilt.suites] == [
        [(x.valid, x.invalid, x.fails, x.reasons) for x in row] for row in matrix.suites
    ]
    assert math.isnan(rebuilt.suites[0][0].tests[0].expected) and rebuilt.replay == tuple(replay)
    assert score_problem(rebuilt, RewardConfig()) == score_problem(matrix, RewardConfig())
    with pytest.raises(ValueError, match="toy/0: missing or malformed field"):
        OutcomeMatrix.from_rows([{k: v for k, v in r.items() if k != "fails"} for r in back])


def test_masked_problem_rows_round_trip():
    broken = Problem(**{**PROBLEM.__dict__, "reference_solution": "raise SystemError\n"})
    matrix = run_plan(plan_problem(broken, [GOOD], [[suite(("f(1)", "2"))]]))
    rebuilt = OutcomeMatrix.from_rows(matrix.to_rows())
    assert rebuilt == matrix and rebuilt.problem_infra


@pytest.mark.parametrize(
    "src, value",
    [
        ("float('nan')", "nan"),
        ("set()", set()),
        ("frozenset({1, 2})", frozenset({1, 2})),
        ("{(1,): [b'x']}", {(1,): [b"x"]}),
        ("-0x10", -16),
        ("{1}", {1}),
    ],
)
def test_literal_value(src, value):
    got = literal_value(src)
    assert math.isnan(got) if value == "nan" else got == value and type(got) is type(value)


@pytest.mark.parametrize("src", ["__import__('os')", "float('1e3')", "x", "[f(1)]"])
def test_literal_value_rejects_code(src):
    with pytest.raises(ValueError):
        literal_value(src)


def test_golden_plan_and_assembly():
    tests = (TestCase("f(1)", 2), TestCase("f(5)", 6), TestCase("f(1)", 2))
    plan = plan_golden(PROBLEM, [GOOD, BUGGY, BROKEN], tests)
    jobs = plan.jobs()
    assert [exprs for _, exprs in jobs] == [["f(1)", "f(5)"]] * 3
    outs = [local_run(job) for job in jobs]
    outs[2] = [CallOutcome("infra_error")] * 2
    golden = plan.assemble(outs, 1e-6, 1e-6)
    assert golden.passed == ((True, True, True), (True, False, True), (False, False, False))
    assert golden.code_valid == (True, True, False) and golden.code_infra == (False, False, True)
    assert plan_golden(PROBLEM, [GOOD]).tests == PROBLEM.tests
    assert [r["passed"] for r in golden.to_rows()][1] == [True, False, True]


def test_quirk_11_worked_case_has_no_misalignment():
    """§17 quirk 11: with structured (call, value) tests (D1) later tests keep their own GT values."""
    text = (
        "```python\nassert f(0) == 1\nexpected = 99\nassert f(1) == expected\nassert f(2) == 3\n"
        "assert f(5) == 6\nassert f(1) == 5\n```"
    )
    for mode in ("strict", "official"):
        parsed = extract_tests(text, "f", mode=mode, literal_answers=False)  # the official answer rule
        out = run_plan(plan_problem(PROBLEM, [BUGGY], [[parsed]])).suites[0][0]
        assert (out.valid, out.invalid) == (4, 2)
        assert out.reasons == ("wrong_answer", "duplicate")
        assert out.fails == (False, False, False, True)  # official reports pass, pass, FAIL, fail


def test_same_plan_through_the_real_sandbox():
    """The fake executor above agrees with the real sandbox, including hostile candidates whose
    forged equality, early exit or hang must end as failures or an invalid code — never as passes."""
    import sandbox  # the real executor: a broken sandbox must fail this test, not skip it

    forged = "class Yes(int):\n    def __eq__(self, o):\n        return True\n\ndef f(x):\n    return Yes(0)"
    exits = "import sys\nsys.exit(0)\ndef f(x):\n    return x + 1"
    hangs = "def f(x):\n    while x == 4:\n        pass\n    return x + 1"
    codes = [GOOD, BUGGY, BROKEN, forged, exits, hangs]
    s = suite(("f(1)", "2"), ("f(13)", "14"), ("f(4)", "5"), ("f(1)", "2"))
    plan = plan_problem(PROBLEM, codes, [[s]] * len(codes), replay=[TestCase("f(6)", 7)])
    limits = sandbox.ExecLimits(call_timeout_s=0.5, program_timeout_s=5.0)
    with sandbox.ProcessExecutor(workers=1, limits=limits) as ex:
        ref_out = ex.run(*plan.reference_job())
        cand_out = ex.run_many(plan.candidate_jobs(ref_out))
    real = plan.assemble(ref_out, cand_out, 1e-6, 1e-6)
    assert real.code_valid == (True, True, False, True, False, True)
    assert [row[0].fails for row in real.suites] == [
        (False, False),
        (False, True),
        (True, True),
        (True, True),
        (True, True),
        (False, True),
    ]
    assert real.replay_passed == ((True,), (False,), (False,), (False,), (False,), (True,))
    assert real.suites[0][0].reasons == ("gt_error", "duplicate")
    fake_codes = run_plan(plan_problem(PROBLEM, codes[:4], [[s]] * 4, replay=[TestCase("f(6)", 7)]))
    assert fake_codes.suites == real.suites[:4] and fake_codes.replay_passed == real.replay_passed[:4]


def test_a_call_is_filled_and_compared_once_per_problem():
    """The assembly's memos: every suite of a problem shares one filled test per call, and a code's verdict
    on a call is the same in each of its suites (the matrix equals the suite-by-suite reading)."""
    s1 = suite(("f(1)", "2"), ("f(5)", "6"), ("f(2)", "99"))
    s2 = suite(("f(5)", "7"), ("f(1)", "2"))
    matrix = run_plan(plan_problem(PROBLEM, [GOOD, BUGGY], [[s1, s2], [s2, s1]], replay=[]))
    first = {t.call: t for t in matrix.suites[0][0].tests}
    for row in matrix.suites:
        for out in row:
            assert all(t is first[t.call] for t in out.tests)
    assert [o.fails for o in matrix.suites[0]] == [(False, False, False), (False, False)]
    assert [o.fails for o in matrix.suites[1]] == [(True, False), (False, True, False)]
    assert [o.reasons for o in matrix.suites[1]] == [("wrong_answer",), ("wrong_answer",)]
