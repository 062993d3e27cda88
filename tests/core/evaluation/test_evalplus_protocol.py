"""EvalPlus parity: non-plain reference outputs, problems without tests, EvalPlus' comparison and time rules.

Each test names the bug it guards:
  * Mbpp/737, 787, 794 return an ``re.Match``: prepare dropped every matching input (not plain data), so a
    sample returning ``None`` passed base and plus;
  * a problem whose tests all dropped was judged on nothing: every sample passed (a vacuous pass);
  * floats were compared with 1e-6 relative error everywhere, the reference's imports were put in front of
    the sample, and one flat time limit applied, where EvalPlus does none of these;
  * which reference inputs survived prepare depended on the chunking (the per-program result budget).
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from codea1_core.config import Config
from codea1_core.data.dataset_types import PENDING
from codea1_core.data.datasets import load_evalplus
from codea1_core.data.evalplus_rules import OUTPUT_NOT_NONE, outputs_match, time_limit_s
from codea1_core.data.prepared import chunk_exprs, load_prepared, reference_exprs, rerun_alone, resolve
from codea1_core.evaluation.verdicts import (
    NOT_RUN,
    build_code_jobs,
    code_metrics,
    evalplus_flags,
    judge_sample,
    run_code_jobs,
    verdicts_for,
)
from codea1_core.method.outcomes import plan_golden
from codea1_core.method.rewards import golden_scores
from codea1_core.types import CallOutcome, Problem, TestCase
from flows.prepare import prepare, run_reference_jobs
from sandbox import ExecLimits, ProcessExecutor

MATCH_ROW = {
    "task_id": "Mbpp/787",
    "prompt": '"""\nWrite a function that matches a string that has an a followed by three \'b\'.\n"""\n',
    "entry_point": "text_match_three",
    "canonical_solution": "\nimport re\ndef text_match_three(text):\n    return re.search('ab{3}?', text)\n",
    "base_input": [["ac"], ["dc"], ["abbbba"], ["caacabbbba"]],
    "plus_input": [[""], ["xxabbbx"], ["abb"]],
    "atol": 0,
}
NONE_SAMPLE = "def text_match_three(text):\n    return None\n"
RIGHT_SAMPLE = "import re\ndef text_match_three(text):\n    return re.search('abbb', text)\n"
BOOL_SAMPLE = "def text_match_three(text):\n    return 'abbb' in text\n"
WRONG_ON_MATCHES = "def text_match_three(text):\n    return None if 'abbb' in text else 1\n"


def _write_evalplus(folder: Path, stem: str, rows: list[dict]) -> Path:
    path = folder / f"{stem}-v0.0.0.jsonl.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    return path


def _judge(problem: Problem, samples: list[str], evalplus: bool = True) -> list[tuple[bool, bool]]:
    jobs = build_code_jobs([problem], [samples], evalplus)
    with ProcessExecutor(workers=1, limits=ExecLimits(call_timeout_s=5.0)) as ex:
        results = ex.run_many(jobs.jobs)
    return [(v.base, v.plus) for v in verdicts_for([problem], jobs, results, 1e-6, 1e-6, evalplus)[0]]


# --------------------------------------------------------------------------------------------------
# A reference returning non-plain data (re.Match)
# --------------------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_match_returning_task_keeps_every_input_and_fails_a_none_sample(tmp_path, prefect_harness):
    """Bug: prepare dropped the 2 matching base inputs (``re.Match`` is not plain data); what was left
    expected ``None``, so ``return None`` passed base and plus."""
    _write_evalplus(tmp_path / "data" / "mbppplus", "MbppPlus", [MATCH_ROW])
    cfg = Config.from_dict(
        {
            "data": {
                "prepared_dir": str(tmp_path / "prepared"),
                "data_dir": str(tmp_path / "data"),
                "train_sources": ["lab"],
                "val_sources": ["lab"],
                "eval_benchmarks": ["mbppplus"],
                "max_problems_per_source": 2,
                "reference_call_timeout_s": 5.0,
            },
            "lab": {"train_per_family": 1, "heldout_per_family": 1},
        }
    )
    report = prepare(cfg)
    assert report["excluded_tests"] == {} and report["rejected"] == []
    (problem,) = load_prepared(Path(cfg.data.prepared_dir) / "eval_mbppplus.parquet")
    assert [t.expected for t in problem.tests] == [False, False, True, True]
    assert [t.expected for t in problem.plus_tests] == [False, True, False]
    assert len(problem.metadata["ref_time_s"]) == 7
    verdicts = _judge(problem, [NONE_SAMPLE, RIGHT_SAMPLE, BOOL_SAMPLE, WRONG_ON_MATCHES])
    assert verdicts == [(False, False), (True, True), (True, True), (False, False)]


def test_not_none_tasks_of_mbppplus_keep_all_inputs(shared_data_dir):
    """Bug guarded: Mbpp/737, 787 and 794 lost 22 of 110, 2 of 105 and 56 of 106 inputs."""
    path = next((shared_data_dir / "mbppplus").glob("MbppPlus-*.jsonl*"))
    problems = [p for p in load_evalplus(path, "mbppplus") if p.entry_point in OUTPUT_NOT_NONE]
    assert sorted(p.id for p in problems) == ["Mbpp/737", "Mbpp/787", "Mbpp/794"]
    jobs = [(p.reference_solution, reference_exprs(p)) for p in problems]
    with ProcessExecutor(workers=2, limits=ExecLimits(call_timeout_s=10.0)) as ex:
        outcomes = run_reference_jobs(ex, jobs, [p.id for p in problems])
    for p, out in zip(problems, outcomes, strict=True):
        filled, excluded = resolve(p, out, 1e-6, 1e-6)
        assert excluded == [], (p.id, excluded[:3])
        expected = [t.expected for t in filled.tests + filled.plus_tests]
        assert set(expected) == {True, False}, p.id  # both matching and non-matching inputs are judged


# --------------------------------------------------------------------------------------------------
# A problem whose tests all dropped
# --------------------------------------------------------------------------------------------------


def _problem(pid: str, tests: tuple[TestCase, ...], source: str = "mbppplus") -> Problem:
    return Problem(
        id=pid,
        source=source,
        split="test",
        prompt="",
        description="",
        entry_point="f",
        reference_solution="def f(x):\n    return x\n",
        tests=tests,
    )


def test_problem_without_tests_is_excluded_and_counted_never_passed():
    """Bug: ``all([])`` — a problem whose every test dropped passed every sample (base and plus)."""
    empty = _problem("Mbpp/1", ())
    normal = _problem("Mbpp/2", (TestCase("f(1)", 1),))
    verdict = judge_sample(empty, [], 1e-6, 1e-6, True)
    assert verdict.excluded and not verdict.base and not verdict.plus
    wrong = [CallOutcome("ok", 2, duration_s=0.01)]
    verdicts = [[judge_sample(empty, [], 1e-6, 1e-6, True)], [judge_sample(normal, wrong, 1e-6, 1e-6, True)]]
    m = code_metrics("x", [empty, normal], verdicts, [1], evalplus_protocol=True)
    assert m["code/x/pass@1"] == 0.0 and m["code/x/n_problems"] == 1.0 and m["code/x/n_samples"] == 1.0
    assert m["code/x/excluded_problems"] == 1.0 and m["code/x/evalplus_protocol"] == 1.0


def test_problem_without_tests_is_rejected_by_prepare_and_masked_in_golden_rewards():
    """The other places a test-less problem could score: prepare rejects it with its reasons (so neither
    training nor the Mistake Book ever sees it), and the Golden-Tests reward masks one (a reward from no
    tests would train on nothing)."""
    from flows.prepare import _verify

    problem = _problem("Mbpp/3", (TestCase("f(1)", PENDING), TestCase("f(2)", PENDING)))
    report = {
        "sources": {"eval_x/mbppplus": {"loaded": 1}},
        "excluded_test_reasons": Counter(),
        "excluded_tests": {},
        "skipped_asserts": {},
        "rejected": [],
    }
    outcomes = [CallOutcome("unsupported_output", None, "UnsupportedValue: re.Match"), CallOutcome("timeout")]
    kept = _verify(Config(), "eval_x", [("mbppplus", problem)], [outcomes], report)
    assert kept == [] and report["rejected"][0]["id"] == "Mbpp/3"
    assert "no golden tests left" in report["rejected"][0]["reason"]
    assert report["sources"]["eval_x/mbppplus"]["excluded_tests"] == 2

    plan = plan_golden(_problem("Mbpp/3", ()), ["def f(x):\n    return x\n"] * 2)
    assert [exprs for _, exprs in plan.jobs()] == [["None"], ["None"]]
    scores = golden_scores(plan.assemble([[CallOutcome("ok", None)]] * 2, 1e-6, 1e-6))
    assert scores.code_mask == [False, False] and scores.code_rewards == [0.0, 0.0]
    assert scores.metrics["problem/masked"] == 1.0


# --------------------------------------------------------------------------------------------------
# EvalPlus' comparison, imports and time
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("out", "exp", "atol", "ok"),
    [
        (1, 1.0, 0.0, True),  # Python equality
        (True, 1, 0.0, True),
        (1.0000001, 1.0, 0.0, True),  # float expected: atol 1e-6 enforced
        (1.00001, 1.0, 0.0, False),  # ours accepted 1e-6 *relative*: 1e-5 off fails in EvalPlus
        (1000000.5, 1000000.0, 0.0, False),  # ... and so 0.5 off at 1e6 (ours: within 1e-6 relative)
        (1, 1.0000001, 0.0, False),  # not equal, so the float rule: int vs float is a type mismatch
        ([1.0, 2.0000001], [1.0, 2.0], 0.0, True),
        ((1.0, 2.0000001), [1.0, 2.0], 0.0, False),  # same type required
        ([[1.0000001]], [[1.0]], 0.0, False),  # is_floats looks one level deep: nested floats are exact
        (0.15, 0.1, 0.1, True),  # the task's atol
        (float("nan"), float("nan"), 0.0, False),
    ],
)
def test_outputs_match_is_evalplus_comparison(out, exp, atol, ok):
    assert outputs_match(out, exp, atol)[0] is ok


def test_float_atol_sticks_for_the_rest_of_a_run():
    """evalplus sets its local ``atol`` to 1e-6 at the first float expected value and keeps it."""
    ok, atol = outputs_match(2.0, 2.0, 0.0)
    assert ok and atol == 1e-6
    assert outputs_match(3, 3.0000001, atol)[0] is False  # int vs float: type mismatch
    assert outputs_match([1.0000001], [1.0], atol)[0] is True


def test_time_limit_is_evalplus_rule():
    assert time_limit_s(0.0) == 1.0 and time_limit_s(0.2) == 1.0 and time_limit_s(0.5) == 2.0


def test_sample_runs_as_written_and_slow_inputs_fail_under_the_evalplus_protocol():
    """Bug: the reference's imports were put in front of the sample (a forgotten ``import math`` passed),
    the float tolerance was 1e-6 relative, and the time limit flat. Training rules stay available."""
    problem = Problem(
        id="HumanEval/0",
        source="humanevalplus",
        split="test",
        prompt="",
        description="",
        entry_point="f",
        reference_solution="import math\ndef f(x):\n    return math.sqrt(x)\n",
        tests=(TestCase("f(4e12)", 2e6),),
        plus_tests=(TestCase("f(9e12)", 3e6),),
        metadata={"ref_time_s": [0.001, 0.001]},
    )
    forgot_import = "def f(x):\n    return math.sqrt(x)\n"
    close = "import math\ndef f(x):\n    return math.sqrt(x) * (1 + 5e-7)\n"  # 1.0 off at 2e6: 5e-7 relative
    slow = "import math, time\ndef f(x):\n    time.sleep(1.3 if x > 5e12 else 0)\n    return math.sqrt(x)\n"
    assert _judge(problem, [forgot_import, close, slow], evalplus=True) == [
        (False, False),
        (False, False),
        (True, False),
    ]
    assert _judge(problem, [forgot_import, close, slow], evalplus=False) == [
        (True, True),
        (True, True),
        (True, True),
    ]


# --------------------------------------------------------------------------------------------------
# Chunking never decides which inputs survive
# --------------------------------------------------------------------------------------------------


def test_reference_inputs_survive_whatever_the_chunking():
    """Bug: the result budget is per program, so a small result after a big one in the same 100-call
    chunk was dropped as "result too large" (Mbpp/255: 7 tiny inputs)."""
    program = "def f(n):\n    return 'x' * n\n"
    exprs = ["f(1)", "f(999000)", "f(2000)", "f(3000)"]
    limits = ExecLimits(call_timeout_s=5.0, max_result_bytes=1_000_000)
    with ProcessExecutor(workers=1, limits=limits) as ex:
        together = ex.run_many([(program, exprs)])[0]
        assert [o.status for o in together] == ["ok", "ok", "unsupported_output", "unsupported_output"]
        assert rerun_alone(exprs, together) == [2, 3]
        fixed = run_reference_jobs(ex, [(program, exprs)], ["p"])[0]
        alone = [ex.run_many([(program, [e])])[0][0] for e in exprs]
    assert [o.status for o in fixed] == [o.status for o in alone] == ["ok"] * 4
    assert [o.value for o in fixed] == [o.value for o in alone]
    assert chunk_exprs(list("abcde"), 2) == [["a", "b"], ["c", "d"], ["e"]]


def test_a_run_past_evalplus_run_cap_fails_its_remaining_inputs():
    """evalplus stops a base or plus run after min(60 s, sum of its limits) + 2 s: slow-but-correct
    samples of heavy tasks (HumanEval/15) fail there, input limits notwithstanding."""
    tests = tuple(TestCase(f"f({i})", i) for i in range(70))
    problem = Problem(
        id="HumanEval/15",
        source="humanevalplus",
        split="test",
        prompt="",
        description="",
        entry_point="f",
        reference_solution="def f(x):\n    return x\n",
        tests=tests,
        metadata={"ref_time_s": [0.1] * 70},
    )
    fast = [CallOutcome("ok", i, duration_s=0.5) for i in range(70)]  # 35 s in all: under the 62 s cap
    slow = [CallOutcome("ok", i, duration_s=0.95) for i in range(70)]  # each under 1 s, 66.5 s in all
    assert judge_sample(problem, fast, 1e-6, 1e-6, True).base
    assert not judge_sample(problem, slow, 1e-6, 1e-6, True).base
    assert judge_sample(problem, slow, 1e-6, 1e-6, False).base  # training rules: per-call limit only


# --------------------------------------------------------------------------------------------------
# Staged runs: a sample stops at its first failing input, with the full run's verdict
# --------------------------------------------------------------------------------------------------


class _InProcess:
    """A stand-in for the executor (trusted test programs only): each job a fresh namespace, each call
    evaluated in it in order; records the calls each job was sent."""

    def __init__(self) -> None:
        self.sent: list[list[tuple[str, int]]] = []

    def __call__(self, jobs: list, ids: list[int]) -> list[list[CallOutcome]]:
        self.sent.append([(program, len(calls)) for program, calls in jobs])
        out = []
        for program, calls in jobs:
            namespace: dict = {}
            exec(program, namespace)
            row = []
            for call in calls:
                try:
                    row.append(CallOutcome("ok", eval(call, namespace), duration_s=0.001))
                except Exception as exc:
                    row.append(CallOutcome("error", None, f"{type(exc).__name__}: {exc}", 0.001))
            out.append(row)
        return out


def _staged_problem(source: str = "humanevalplus") -> Problem:
    """4 base inputs, 6 plus inputs of ``f(x) = 2x``."""
    return Problem(
        id="HumanEval/0",
        source=source,
        split="test",
        prompt="",
        description="",
        entry_point="f",
        reference_solution="def f(x):\n    return 2 * x\n",
        tests=tuple(TestCase(f"f({i})", 2 * i) for i in range(4)),
        plus_tests=tuple(TestCase(f"f({i})", 2 * i) for i in range(4, 10)),
        metadata={"ref_time_s": [0.001] * 10},
    )


STAGED_SAMPLES = {  # name: (code, calls it runs in all stages, its verdict)
    "right": ("def f(x):\n    return 2 * x\n", 1 + 4 + 10, (True, True)),
    "wrong_first": ("def f(x):\n    return 2 * x + 1\n", 1, (False, False)),
    "wrong_in_base": ("def f(x):\n    return 0 if x == 2 else 2 * x\n", 1 + 4, (False, False)),
    "raises_in_plus": ("def f(x):\n    assert x < 7\n    return 2 * x\n", 1 + 4 + 10, (True, False)),
    # state carried from call to call, as in one run: wrong from the fourth call of a run on
    "stateful": (
        "seen = []\ndef f(x):\n    seen.append(x)\n    return 2 * x + (len(seen) > 3)\n",
        1 + 4,
        (False, False),
    ),
}


def test_staged_run_stops_at_the_first_failing_input_with_the_full_runs_verdict():
    """EvalPlus stops a sample at its first failing input; ours ran every input of every sample (a
    looping sample paid a time-out per input, 120 s; a wrong one every plus input). Staged, a sample
    runs its first input, then its base inputs, then all, each from a fresh program: the verdicts are
    the full run's, the inputs after a failure are NOT_RUN errors."""
    problem = _staged_problem()
    codes = [code for code, _, _ in STAGED_SAMPLES.values()]
    jobs = build_code_jobs([problem], [codes], True)
    full = _InProcess()(jobs.jobs, list(range(len(jobs.jobs))))
    run = _InProcess()
    staged = run_code_jobs([problem], jobs, run, True)
    verdicts = verdicts_for([problem], jobs, staged, 1e-6, 1e-6, True)[0]
    assert [(v.base, v.plus) for v in verdicts] == [want for _, _, want in STAGED_SAMPLES.values()]
    assert verdicts == verdicts_for([problem], jobs, full, 1e-6, 1e-6, True)[0]
    ran = {code: 0 for code in codes}
    for batch in run.sent:
        for program, n_calls in batch:
            ran[program] += n_calls
    assert [ran[code] for code in codes] == [n for _, n, _ in STAGED_SAMPLES.values()]
    wrong = staged[codes.index(STAGED_SAMPLES["wrong_first"][0])]
    assert wrong[0].ok and [o.error for o in wrong[1:]] == [NOT_RUN] * 9
    assert len(run.sent) == 3  # one round per stage, every sample of the round in one batch


def test_training_rules_and_infra_run_every_call():
    """The lab's sparse verdict needs every call: under the training rules ``run`` gets the jobs once, as
    built. An infrastructure failure in a stage ends the sample as ``infra`` (never scored), its
    outcome repeated for the inputs not run, so the D4 count sees every call."""
    problem = _staged_problem()
    jobs = build_code_jobs([problem], [[STAGED_SAMPLES["wrong_first"][0]]], False)
    run = _InProcess()
    run_code_jobs([problem], jobs, run, False)
    assert run.sent == [[(jobs.jobs[0][0], 10)]]
    lost = CallOutcome("infra_error", None, "InfraError: worker died")
    jobs = build_code_jobs([problem], [[STAGED_SAMPLES["right"][0]]], True)
    out = run_code_jobs([problem], jobs, lambda batch, ids: [[lost] * len(c) for _, c in batch], True)
    assert out == [[lost] * 10]
    assert judge_sample(problem, out[0], 1e-6, 1e-6, True).infra


def test_flags_of_a_prefix_are_the_full_runs_first_flags():
    """A stage judges a prefix of the inputs: each flag, run caps included, must be the full run's."""
    problem = Problem(
        id="HumanEval/15",
        source="humanevalplus",
        split="test",
        prompt="",
        description="",
        entry_point="f",
        reference_solution="def f(x):\n    return x\n",
        tests=tuple(TestCase(f"f({i})", i) for i in range(70)),
        plus_tests=(TestCase("f(70)", 70),),
        metadata={"ref_time_s": [0.1] * 71},
    )
    outcomes = [CallOutcome("ok", i, duration_s=0.95) for i in range(71)]
    full = evalplus_flags(problem, outcomes)
    assert full[0] and not full[69] and full[70]  # past the base run's cap; the plus run's clock is fresh
    assert all(evalplus_flags(problem, outcomes[:k]) == full[:k] for k in range(72))
    with pytest.raises(ValueError):
        evalplus_flags(problem, outcomes + outcomes[:1])
