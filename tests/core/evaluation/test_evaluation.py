"""Evaluation core and tasks: jobs, EvalPlus verdicts, pass@k aggregation, Test-LLM metrics, adapters.

Pure parts use hand-built ``CallOutcome`` lists. The task-level tests use an in-process fake executor
(``exec`` in a dict: NOT a sandbox, only a stand-in for the layer under test) and fake policies; the
real sandbox and data run in ``tests/tasks/test_eval_sanity.py``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from support import FakeExecutor, TextPolicy, fenced, problem

from codea1_core.config import Config
from codea1_core.evaluation.benchmarks import (
    BCB_CHECK_CALL,
    BenchmarkFormatError,
    load_bigcodebench,
    load_unleakedtestbench,
)
from codea1_core.evaluation.collaboration import CandidateScore, score_candidates, select_candidate
from codea1_core.evaluation.suites import (
    SuiteRecord,
    TestVerdict,
    aggregate_tests,
    judge_reference,
    mutant_killed,
)
from codea1_core.evaluation.verdicts import (
    SampleVerdict,
    aggregate_code,
    build_code_jobs,
    call_matches,
    judge_sample,
    verdicts_for,
)
from codea1_core.method.outcomes import candidate_program
from codea1_core.types import CallOutcome, Problem

OK = lambda v: CallOutcome("ok", v)  # noqa: E731
ERR = CallOutcome("error", error="ValueError: boom")
INFRA = CallOutcome("infra_error", error="worker died")


# --------------------------------------------------------------------------------------------------
# Code jobs and verdicts
# --------------------------------------------------------------------------------------------------


def test_build_code_jobs_dedupes_identical_samples_per_problem():
    p1, p2 = problem("a"), problem("b")
    same = "def add(a, b):\n    return a + b"
    jobs = build_code_jobs([p1, p2], [[same, same, "x = 1"], [same]])
    assert len(jobs.jobs) == 3  # 2 distinct for p1, 1 for p2 (not shared across problems)
    assert jobs.sample_job == [[0, 0, 1], [2]]
    assert jobs.job_problem == [0, 0, 1]
    assert jobs.jobs[0][1] == ["add(1, 2)", "add(5, 5)"]  # base then plus


def test_candidate_program_prepends_imports_and_appends_test_program():
    p = problem(imports=("import math",), metadata={"test_program": "X = 1"})
    assert candidate_program(p, "def add(a, b): pass") == "import math\ndef add(a, b): pass\nX = 1"


FUTURE_SAMPLE = "from __future__ import annotations\n\ndef add(a: List[int], b) -> int:\n    return a + b\n"
DOC_SAMPLE = '"""Module doc."""\ndef add(a, b):\n    return a + b\n'


def _typed_problem() -> Problem:
    """A prompt import (``List``) and a reference import (``math``) the prompt does not have."""
    return problem(
        imports=("from typing import List",), reference="import math\n\ndef add(a, b):\n    return a + b\n"
    )


def test_training_and_evaluation_run_the_same_program_text():
    """Regression: ``verdicts.program_for`` (evaluation) and ``outcomes.candidate_program``
    (training) built a sample's program differently — evaluation left out the reference's imports and put
    its import lines before a ``from __future__`` line — so a code was judged on another program than
    the one it was trained on. Training, golden mode, evaluation and ``solve`` now run one text."""
    from codea1_core.method.outcomes import plan_golden, plan_problem
    from codea1_core.types import ParsedSuite

    p = _typed_problem()
    for code in ("def add(a, b):\n    return a + b", FUTURE_SAMPLE, DOC_SAMPLE, "def add(a, b) return"):
        evaluated = build_code_jobs([p], [[code]]).jobs[0][0]
        golden = plan_golden(p, [code]).jobs()[0][0]
        plan = plan_problem(p, [code], [[ParsedSuite()]])
        trained = plan.candidate_jobs(FakeExecutor().run(*plan.reference_job()))[0][0]
        assert evaluated == trained == golden, code
        from codea1_core.evaluation.collaboration import plan_solve

        assert plan_solve([p], [[code]], [""], "strict").jobs()[0][0] == trained, code


def test_an_evaluated_sample_may_start_with_a_future_import():
    """Regression: evaluation put the prompt's imports before the sample's
    ``from __future__`` line, a SyntaxError, so a correct sample failed every call (program_error)."""
    p = _typed_problem()
    jobs = build_code_jobs([p], [[FUTURE_SAMPLE]])
    assert jobs.jobs[0][0].startswith("from __future__ import annotations\n")
    verdicts = verdicts_for([p], jobs, FakeExecutor().run_many(jobs.jobs), 1e-6, 1e-6)
    assert verdicts == [[SampleVerdict(True, True)]]


def test_judge_sample_plus_requires_base_and_plus():
    p = problem(tests=(("add(1, 2)", 3), ("add(0, 0)", 0)), plus=(("add(5, 5)", 10),))
    assert judge_sample(p, [OK(3), OK(0), OK(10)], 1e-6, 1e-6) == SampleVerdict(True, True)
    assert judge_sample(p, [OK(3), OK(0), OK(11)], 1e-6, 1e-6) == SampleVerdict(True, False)
    assert judge_sample(p, [OK(3), ERR, OK(10)], 1e-6, 1e-6) == SampleVerdict(False, False)
    assert judge_sample(p, [OK(3), INFRA, OK(10)], 1e-6, 1e-6).infra
    with pytest.raises(ValueError, match="t/1: 2 outcomes for 3 calls"):
        judge_sample(p, [OK(3), OK(0)], 1e-6, 1e-6)


def test_float_tolerance_uses_the_task_atol():
    p = problem(tests=(("f(1)", 0.5),), plus=(), atol=1e-3)
    assert call_matches(p, "f(1)", OK(0.5004), 0.5, 0.0, 1e-6)
    assert not call_matches(p, "f(1)", OK(0.502), 0.5, 0.0, 1e-6)
    tight = problem(tests=(("f(1)", 0.5),), plus=())
    assert not call_matches(tight, "f(1)", OK(0.5004), 0.5, 0.0, 1e-6)


def test_special_oracles_find_zero_and_mbpp_set_equality():
    fz = problem(entry="find_zero", tests=(("find_zero([-6, 11, -6, 1])", 1.0),), plus=())
    assert call_matches(fz, "find_zero([-6, 11, -6, 1])", OK(3.0), 1.0, 1e-6, 1e-6)  # another root
    assert not call_matches(fz, "find_zero([-6, 11, -6, 1])", OK(2.5), 1.0, 1e-6, 1e-6)
    se = problem(
        entry="similar_elements", source="mbppplus", tests=(("similar_elements((1, 2), (2, 1))", (1, 2)),)
    )
    assert call_matches(se, "similar_elements((1, 2), (2, 1))", OK((2, 1)), (1, 2), 1e-6, 1e-6)
    plain = problem(entry="other", source="mbppplus")
    assert not call_matches(plain, "other()", OK((2, 1)), (1, 2), 1e-6, 1e-6)


def test_aggregate_code_unbiased_pass_at_k_and_avg():
    ps = [problem("a"), problem("b")]
    v = [
        [SampleVerdict(True, False), SampleVerdict(False, False)],
        [SampleVerdict(True, True), SampleVerdict(True, True)],
    ]
    m = aggregate_code("he", ps, v, [1, 2, 4])
    assert m["code/he/base/pass@1"] == pytest.approx(75.0)
    assert m["code/he/base/pass@2"] == pytest.approx(100.0)
    assert m["code/he/plus/pass@1"] == pytest.approx(50.0)
    assert m["code/he/plus/avg@2"] == pytest.approx(50.0)
    assert m["code/he/pass@1"] == m["code/he/plus/pass@1"]  # headline = plus when plus inputs exist
    assert "code/he/base/pass@4" not in m  # k > n is not reported
    assert m["code/he/n_samples"] == 4


def test_aggregate_code_drops_infra_samples_and_counts_them():
    ps = [problem("a", plus=())]
    v = [[SampleVerdict(True, True), SampleVerdict(False, False, infra=True)]]
    m = aggregate_code("x", ps, v, [1])
    assert m["code/x/base/pass@1"] == 100.0  # infra sample is not a failure
    assert m["code/x/infra_errors"] == 1
    assert "code/x/plus/pass@1" not in m and m["code/x/pass@1"] == 100.0


def test_sparse_verdict_judges_only_the_named_sparse_calls():
    """A lab sample is judged on the sparse golden tests too, from the same outcomes."""
    p = problem(
        tests=(("add(0, 0)", 0), ("add(1, 2)", 3)),
        plus=(("add(5, 5)", 10),),
        source="lab",
        metadata={"sparse_calls": ["add(1, 2)", "add(5, 5)"]},
    )
    assert judge_sample(p, [OK(0), OK(3), OK(10)], 1e-6, 1e-6) == SampleVerdict(True, True, sparse=True)
    # passes the sparse tests, fails the boundary test add(0, 0): the bug sparse tests cannot see
    assert judge_sample(p, [OK(1), OK(3), OK(10)], 1e-6, 1e-6) == SampleVerdict(False, False, sparse=True)
    assert judge_sample(p, [OK(0), OK(3), OK(11)], 1e-6, 1e-6) == SampleVerdict(True, False, sparse=False)
    assert judge_sample(problem(), [OK(3), OK(10)], 1e-6, 1e-6).sparse is None  # none named


def test_aggregate_code_reports_sparse_beside_base_and_plus():
    ps = [problem("a", source="lab", metadata={"sparse_calls": ["add(1, 2)"]}), problem("b")]
    v = [
        [SampleVerdict(False, False, sparse=True), SampleVerdict(True, True, sparse=True)],
        [SampleVerdict(True, True), SampleVerdict(False, False)],  # no sparse tests named: not counted
    ]
    m = aggregate_code("lab", ps, v, [1])
    assert m["code/lab/base/pass@1"] == pytest.approx(50.0)
    assert m["code/lab/plus/pass@1"] == pytest.approx(50.0)
    assert m["code/lab/sparse/pass@1"] == pytest.approx(100.0)  # problem a only, 2/2 (base: 1/2)
    assert m["code/lab/sparse/avg@2"] == pytest.approx(100.0)
    assert "code/he/sparse/pass@1" not in aggregate_code(
        "he", [problem()], [[SampleVerdict(True, True)]], [1]
    )


def test_verdicts_for_maps_each_sample_to_its_judged_job():
    p = problem()
    jobs = build_code_jobs([p], [["good", "bad", "good"]])
    res = [[OK(3), OK(10)], [OK(3), OK(0)]]
    v = verdicts_for([p], jobs, res, 1e-6, 1e-6)
    assert [s.plus for s in v[0]] == [True, False, True]


# --------------------------------------------------------------------------------------------------
# Test LLM metrics
# --------------------------------------------------------------------------------------------------

T = SimpleNamespace


def test_judge_reference_checks_call_and_answer():
    tests = [
        T(call="f(1)", answer="2"),
        T(call="f(2)", answer="5"),
        T(call="f(3)", answer="1"),
        T(call="f(4)", answer="x"),
    ]
    outs = [OK(2), OK(2), OK(4), OK(5.5), ERR, OK(1), OK(8), ERR]
    v = judge_reference(tests, outs, 1e-6, 1e-6)
    assert [x.correct for x in v] == [True, False, False, False]
    assert v[1].reason == "wrong answer" and v[2].reason.startswith("call error")
    assert judge_reference(tests[:1], [OK(2), INFRA], 1e-6, 1e-6) is None


def test_mutant_killed_and_aggregate_tests():
    vs = [TestVerdict("f(1)", "2", True, 2), TestVerdict("f(2)", "4", True, 4)]
    assert mutant_killed(vs, [OK(2), OK(4)], 1e-6, 1e-6) is False
    assert mutant_killed(vs, [OK(2), OK(5)], 1e-6, 1e-6) is True
    assert mutant_killed(vs, [OK(2), ERR], 1e-6, 1e-6) is True
    assert mutant_killed(vs, [OK(2), INFRA], 1e-6, 1e-6) is None
    records = [
        SuiteRecord("a", 2, tuple(vs), killed=3, mutants=4),  # passes reference, 75 %
        SuiteRecord("b", 5, (TestVerdict("g(1)", "0", False),) + tuple(vs), killed=0, mutants=0),
    ]
    m = aggregate_tests("lab", records, k=5)
    assert m["test/lab/pass@5"] == pytest.approx(100 * 4 / 7)
    assert m["test/lab/pass@5_ult"] == pytest.approx(100 * 4 / 10)
    assert m["test/lab/mut@5"] == pytest.approx(75.0)
    assert m["test/lab/mul"] == pytest.approx(m["test/lab/pass@5"] * 75.0 / 100)
    assert m["test/lab/mul_ult"] == pytest.approx(40.0 * 75.0 / 100)


def test_mut_at_k_over_all_suites_counts_failing_suites_as_killing_nothing():
    """mut@k over passing suites only swings 0 -> 57 with few valid suites; ``mut@k_all``
    divides by every suite (a suite failing the reference kills nothing) and both denominators show."""
    good = (TestVerdict("f(1)", "2", True, 2),)
    records = [
        SuiteRecord("a", 1, good, killed=3, mutants=4),  # 75 %
        SuiteRecord("b", 1, good, killed=1, mutants=2),  # 50 %
        SuiteRecord("c", 1, (TestVerdict("f(2)", "9", False),), killed=0, mutants=0),  # fails reference
        SuiteRecord("d", 0, (), killed=0, mutants=0),  # nothing parsed
        SuiteRecord("e", 1, good, killed=0, mutants=0),  # passes, but no mutant completed: undefined
    ]
    m = aggregate_tests("lab", records, k=5)
    assert m["test/lab/mut@5"] == pytest.approx(62.5)  # existing key unchanged: (75 + 50) / 2
    assert m["test/lab/mut_suites"] == 2
    assert m["test/lab/mut@5_all"] == pytest.approx((75 + 50) / 4)
    assert m["test/lab/mut_all_suites"] == 4
    empty = aggregate_tests("lab", [], k=5)
    assert empty["test/lab/mut@5_all"] == 0.0 and empty["test/lab/mut_all_suites"] == 0


def test_score_and_select_candidates_most_passed_then_agreement():
    answers = [OK(3), OK(10), ERR]  # third answer does not evaluate: invalid test
    calls = [
        [OK(3), OK(10)],  # passes both
        [OK(3), OK(11)],  # passes one
        [OK(3), OK(10)],  # passes both, agrees with candidate 0
    ]
    tests = [(0, 0), (1, 1), (1, 2)]
    scores = score_candidates(calls, answers, tests, 1e-6, 1e-6)
    assert [(s.passed, s.valid) for s in scores] == [(2, 2), (1, 2), (2, 2)]
    assert scores[0].agreement == 3 and scores[1].agreement == 2
    assert select_candidate(scores) == 0
    tie = [CandidateScore(0, 1, 2, 0), CandidateScore(1, 1, 2, 4)]
    assert select_candidate(tie) == 1
    with pytest.raises(ValueError):
        select_candidate([])


# --------------------------------------------------------------------------------------------------
# Tasks with a fake executor and fake policies
# --------------------------------------------------------------------------------------------------


def small_cfg(tmp_path, **over) -> Config:
    base = {
        "eval": {"n_samples": 3, "k_list": [1, 2], "max_mutants": 6, "out_dir": str(tmp_path / "eval")},
        "tracking": {"backend": "null"},
    }
    cfg = Config.from_dict(base)
    return cfg.replace(**over) if over else cfg


def test_evaluate_code_oracle_100_pass_policy_0_and_one_batch(tmp_path):
    from tasks.evaluate import evaluate_code

    ps = [
        problem("a"),
        problem(
            "b",
            entry="mul",
            tests=(("mul(2, 3)", 6),),
            plus=(),
            reference="def mul(a, b):\n    return a * b\n",
        ),
    ]
    oracle = TextPolicy(
        lambda text: fenced(next(p.reference_solution for p in ps if p.prompt.strip() in text))
    )
    ex = FakeExecutor()
    m = evaluate_code(oracle, ps, small_cfg(tmp_path), ex, "toy")
    assert m["code/toy/base/pass@1"] == 100.0 and m["code/toy/plus/pass@1"] == 100.0
    # 3 identical samples per problem -> one program each, run in stages (EvalPlus protocol): problem a on
    # its base input, then on base and plus; problem b (base only) once
    assert len({program for program, _ in ex.jobs}) == 2
    assert sorted((program.count("mul"), len(calls)) for program, calls in ex.jobs) == [
        (0, 1),
        (0, 2),
        (1, 1),
    ]
    m0 = evaluate_code(TextPolicy(lambda t: fenced("pass")), ps, small_cfg(tmp_path), FakeExecutor(), "toy")
    assert m0["code/toy/base/pass@1"] == 0.0 and m0["code/toy/plus/pass@2"] == 0.0


def test_score_suites_pass_mut_mul_with_golden_suite(tmp_path):
    from tasks.evaluate_tests import score_suites

    ref = "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x\n"
    p = problem("c", entry="clamp", reference=ref, tests=(), plus=())
    good = fenced(
        "assert clamp(-5, 0, 10) == 0\nassert clamp(50, 0, 10) == 10\n"
        "assert clamp(3, 0, 10) == 3\nassert clamp(0, 0, 10) == 0"
    )
    weak = fenced("assert clamp(3, 0, 10) == 3\nassert clamp(1, 0, 10) == 2")
    cfg = small_cfg(tmp_path)
    m, recs = score_suites([p, p], [good, weak], cfg, FakeExecutor(), "lab", tmp_path / "mut")
    assert recs[0].passes_reference and not recs[1].passes_reference
    assert m["test/lab/pass@5"] == pytest.approx(100 * 5 / 6)
    assert 0 < m["test/lab/mut@5"] <= 100 and recs[0].mutants > 0
    assert m["test/lab/mul"] == pytest.approx(m["test/lab/pass@5"] * m["test/lab/mut@5"] / 100)


def test_cached_mutants_are_reused_from_disk(tmp_path, monkeypatch):
    import codea1_core.evaluation.mutants as mutants_mod
    from tasks.evaluate_tests import cached_mutants

    src = "def f(x):\n    return x + 1 if x > 0 else x - 1\n"
    first = cached_mutants(src, 5, 0, tmp_path)
    assert first and len(list(tmp_path.rglob("*.json"))) == 1

    def boom(*a, **k):
        raise AssertionError("regenerated instead of reading the cache")

    monkeypatch.setattr(mutants_mod, "generate_mutants", boom)
    assert cached_mutants(src, 5, 0, tmp_path) == first


def test_check_infra_raises_over_threshold(tmp_path):
    from tasks.execute import InfraFailure, check_infra

    frac = small_cfg(tmp_path).sandbox.max_infra_failure_frac
    assert frac == 0.1
    assert check_infra([[OK(1)] * 19 + [INFRA]], frac, "x") == 1  # 5 % <= 10 %
    with pytest.raises(InfraFailure, match="x: 2/4 calls"):
        check_infra([[OK(1), INFRA], [INFRA, OK(1)]], frac, "x")


class FlakyExecutor(FakeExecutor):
    """``infra_error`` on every call of the first ``bad_rounds`` ``run_many`` calls (a broken worker pool)."""

    def __init__(self, bad_rounds: int) -> None:
        super().__init__()
        self.bad_rounds, self.rounds = bad_rounds, 0

    def run_many(self, jobs):
        self.rounds += 1
        if self.rounds <= self.bad_rounds:
            return [[INFRA for _ in exprs] for _, exprs in jobs]
        return super().run_many(jobs)


def test_evaluation_runs_through_the_training_guard_retry_then_abort(tmp_path):
    """Regression: evaluation had its own infra guard (``tasks/evaluate.check_infra``, raising
    ``SandboxInfraError``) without training's batch retry, so one worker-pool hiccup aborted a benchmark
    that training would have recovered from. Both now go through ``tasks.execute.run_jobs``."""
    from tasks.evaluate import score_codes
    from tasks.execute import InfraFailure

    cfg = small_cfg(tmp_path)
    codes = [["def add(a, b):\n    return a + b"]]
    ex = FlakyExecutor(bad_rounds=1)
    m = score_codes([problem()], codes, cfg, ex, "toy")
    # the first stage (its base input): a bad round and its retry; then its second stage (all inputs)
    assert ex.rounds == 3 and m["code/toy/pass@1"] == 100.0 and m["code/toy/infra_errors"] == 0
    with pytest.raises(InfraFailure, match=r"code/toy: 2/2 calls .* e\.g\. \['t/1'\] \(> sandbox\.max_infra"):
        score_codes([problem()], codes, cfg, FlakyExecutor(bad_rounds=2), "toy")


# --------------------------------------------------------------------------------------------------
# Benchmark adapters (fixtures in the public release formats)
# --------------------------------------------------------------------------------------------------

BCB_ROW = {
    "task_id": "BigCodeBench/0",
    "complete_prompt": "import math\ndef task_func(x):\n    '''Square root.'''\n",
    "instruct_prompt": "Write task_func(x) returning the square root of x.",
    "canonical_solution": "    return math.sqrt(x)\n",
    "code_prompt": "import math\ndef task_func(x):\n",
    "test": (
        "import unittest\nclass TestCases(unittest.TestCase):\n"
        "    def test_a(self):\n        self.assertEqual(task_func(9), 3.0)\n"
    ),
    "entry_point": "task_func",
    "doc_struct": "{}",
    "libs": "['math']",
}


def test_bigcodebench_adapter_runs_unittest_through_the_check_call(tmp_path):
    path = tmp_path / "bcb.jsonl"
    path.write_text(json.dumps(BCB_ROW) + "\n" + json.dumps({**BCB_ROW, "task_id": "BigCodeBench/1"}) + "\n")
    ps = load_bigcodebench(path, max_problems=1)
    assert len(ps) == 1 and ps[0].tests[0].call == BCB_CHECK_CALL and ps[0].imports == ("import math",)
    ex = FakeExecutor()
    good = ex.run(candidate_program(ps[0], ps[0].reference_solution), [BCB_CHECK_CALL])
    bad = ex.run(candidate_program(ps[0], "def task_func(x):\n    return x"), [BCB_CHECK_CALL])
    assert good[0].value is True and bad[0].value is False
    assert load_bigcodebench(path, split="instruct")[0].prompt == BCB_ROW["instruct_prompt"]


def test_bigcodebench_missing_field_names_file_and_row(tmp_path):
    path = tmp_path / "bcb.json"
    path.write_text(json.dumps([BCB_ROW, {k: v for k, v in BCB_ROW.items() if k != "test"}]))
    with pytest.raises(BenchmarkFormatError, match=r"bcb.json: row 1 \(task_id BigCodeBench/0\): .*test"):
        load_bigcodebench(path)


def test_unleakedtestbench_adapter_json_array_and_entry_point(tmp_path):
    rows = [
        {
            "task_id": 7,
            "code": "import re\n\ndef helper(): pass\n\ndef helper2(s):\n    return s\n",
            "prompt": "Echo.",
        },
        {"task_id": 8, "code": "def g(x):\n    return x\n", "prompt": "Identity.", "func_name": "g"},
    ]
    path = tmp_path / "ULT.jsonl"
    path.write_text(json.dumps(rows))  # the release is a JSON array despite the name
    ps = load_unleakedtestbench(path)
    assert [p.id for p in ps] == ["ult/7", "ult/8"]
    assert ps[0].entry_point == "helper" and ps[0].imports == ("import re",) and ps[0].tests == ()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": 1, "code": "x = 1", "prompt": "p"}\n{oops\n')
    with pytest.raises(BenchmarkFormatError, match="bad.jsonl:2: invalid JSON line"):
        load_unleakedtestbench(bad)


def test_mbpp_not_none_tasks_compare_presence_of_output():
    """Regression: Mbpp/737-style tasks return re.Match (not plain data); EvalPlus checks `is not None`."""
    p = problem(
        entry="check_str",
        source="mbppplus",
        tests=(("check_str('a')", None), ("check_str('b')", True)),
        plus=(),
    )
    calls = build_code_jobs([p], [["x"]]).jobs[0][1]
    assert calls[0].startswith("(lambda r:") and calls[0].endswith("(check_str('a'))")
    ex = FakeExecutor()
    ref = "import re\ndef check_str(s):\n    return re.match('b', s)"
    outs = ex.run(ref, calls)
    assert [o.value for o in outs] == [False, True]
    assert judge_sample(p, outs, 1e-6, 1e-6).base
    assert not judge_sample(p, ex.run("def check_str(s):\n    return s", calls), 1e-6, 1e-6).base
