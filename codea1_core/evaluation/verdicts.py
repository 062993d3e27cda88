"""Code-LLM benchmark evaluation, pure parts: job building, verdicts and aggregation.

What it does (docs/method.md §13.1, EvalPlus protocol): one sandbox program per *distinct* sample of a
problem (identical code is deduplicated and runs once), with every base and plus input as one call; a sample
passes ``base`` when all base calls match the reference output and ``plus`` when it passes base AND all plus
inputs (EvalPlus semantics). Under the EvalPlus protocol a sample runs in stages that stop at its first
failing input, as evalplus stops it (:func:`run_code_jobs`). EvalPlus' special oracles (``find_zero``,
MBPP set equality, ...) are applied in the trusted parent. Aggregates unbiased pass@k and avg@n per split.
The Test LLM's benchmark (pass@k on the reference, mut@k on mutants, Mul) is
:mod:`codea1_core.evaluation.suites`; test-time collaboration (``solve``) is
:mod:`codea1_core.evaluation.collaboration`.

What it does not: generate text, run code (the caller passes executor outcomes, or a function that runs
jobs, in), touch files, or import prefect/mlflow/sandbox. Infrastructure failures (``infra_error``) are
never scored: affected samples and mutants are dropped from the denominators and counted (docs/method.md D4).

Two rule sets (``eval.evalplus_protocol``, reported as ``code/<bench>/evalplus_protocol``):
  * **EvalPlus protocol** (default on HumanEval+ / MBPP+): the sample runs as written (no imports added),
    each input is compared as evalplus compares it (:func:`codea1_core.data.evalplus_rules.outputs_match`:
    equality, its special oracles, its float rule) and fails past ``max(1 s, 4 x the reference's time)``
    (the reference's time per input is ``metadata["ref_time_s"]``, recorded by prepare).
  * **training rules** (every other benchmark, e.g. the lab; or ``eval.evalplus_protocol: false``): the
    sample runs as :func:`codea1_core.method.outcomes.candidate_program`, the program training runs it
    as (the problem's imports first), compared with ``values.values_equal`` (``sandbox.float_*_tol``).
A problem without any test (every golden test dropped by prepare) is never scored: its samples are
excluded and counted (``code/<bench>/excluded_problems``), never a vacuous pass.

How to run: imported by ``tasks/evaluate.py`` and the other ``codea1_core.evaluation`` plans; unit tests in
``tests/core/evaluation/test_evaluation.py``.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from codea1_core.data.evalplus_rules import (
    EVALPLUS_SOURCES,
    MIN_TIME_LIMIT_S,
    OUTPUT_NOT_NONE,
    judged_call,
    outputs_match,
    run_cap_s,
    time_limit_s,
)
from codea1_core.evaluation.metrics import pass_at_k
from codea1_core.method.outcomes import candidate_program
from codea1_core.types import CallOutcome, Problem
from codea1_core.values import values_equal

INFRA = "infra_error"
NOT_RUN = "NotRun: an earlier input of this sample failed (EvalPlus stops a sample at its first failure)"
"""The error of the inputs a staged run (:func:`run_code_jobs`) did not run: the verdict was already decided."""


# --------------------------------------------------------------------------------------------------
# Jobs, verdicts, aggregation
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SampleVerdict:
    """EvalPlus verdict of one code sample; ``infra`` samples are excluded from every rate."""

    base: bool
    plus: bool
    infra: bool = False
    sparse: bool | None = None
    """Passes the problem's sparse golden tests (``metadata["sparse_calls"]``, lab only); None = none named."""
    excluded: bool = False
    """The problem has no test left: never scored (excluded from every rate, counted)."""


@dataclass
class CodeJobs:
    """Deduplicated sandbox jobs for a benchmark: ``sample_job[p][s]`` indexes ``jobs``."""

    jobs: list[tuple[str, list[str]]] = field(default_factory=list)
    job_problem: list[int] = field(default_factory=list)
    sample_job: list[list[int]] = field(default_factory=list)


def benchmark_calls(problem: Problem) -> list[str]:
    """Every call of a problem: base inputs first, then EvalPlus plus inputs.

    The loader wraps the calls of EvalPlus' "output is not None" MBPP tasks (which return ``re.Match``
    objects, not plain data) in ``judged_call``; wrapping again here is idempotent, so prepared files whose
    calls are not wrapped are judged the same way.
    """
    calls = [t.call for t in problem.tests] + [t.call for t in problem.plus_tests]
    return [judged_call(problem.source, problem.entry_point, c) for c in calls]


def uses_evalplus(problem: Problem, evalplus_protocol: bool) -> bool:
    """Whether ``problem`` is judged by the EvalPlus protocol (see the module docstring)."""
    return evalplus_protocol and problem.source in EVALPLUS_SOURCES


def sample_program(problem: Problem, code: str, evalplus_protocol: bool = False) -> str:
    """The program a sample runs as: as written under the EvalPlus protocol, else training's program."""
    return code if uses_evalplus(problem, evalplus_protocol) else candidate_program(problem, code)


def build_code_jobs(
    problems: Sequence[Problem], codes: Sequence[Sequence[str]], evalplus_protocol: bool = False
) -> CodeJobs:
    """One job per distinct (problem, program); ``codes[p][s]`` is sample s of problem p."""
    if len(problems) != len(codes):
        raise ValueError(f"{len(problems)} problems but {len(codes)} sample lists")
    out = CodeJobs()
    for p_idx, (problem, samples) in enumerate(zip(problems, codes, strict=True)):
        seen: dict[str, int] = {}
        calls = benchmark_calls(problem)
        row = []
        for code in samples:
            program = sample_program(problem, code, evalplus_protocol)
            if program not in seen:
                seen[program] = len(out.jobs)
                out.jobs.append((program, calls))
                out.job_problem.append(p_idx)
            row.append(seen[program])
        out.sample_job.append(row)
    return out


def _call_args(call: str) -> list[Any] | None:
    """Literal positional arguments of ``f(a, b)``; None when not plain literals."""
    try:
        node = ast.parse(call, mode="eval").body
        if not isinstance(node, ast.Call) or node.keywords:
            return None
        return [ast.literal_eval(a) for a in node.args]
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return None


def _poly(xs: list, x: float) -> float:
    return sum(coeff * math.pow(x, i) for i, coeff in enumerate(xs))


def _surface_area(base_edge: float, height: float) -> int:
    slant = math.sqrt((base_edge / 2) ** 2 + height**2)
    return round(base_edge**2 + 4 * (base_edge * slant) / 2)


def _digit_distance(num1: int, num2: int) -> int:
    a, b = str(num1), str(num2)
    width = max(len(a), len(b))
    return sum(abs(int(x) - int(y)) for x, y in zip(a.zfill(width), b.zfill(width), strict=True))


_MBPP_SET_EQ = {"similar_elements", "find_char_long", "common_in_nested_lists", "extract_singly"}
_MBPP_SET_EQ |= {"larg_nnum", "intersection_array", "find_dissimilar", "Diff"}
_MBPP_NOT_NONE = set(OUTPUT_NOT_NONE)


def _special_oracle(problem: Problem, call: str, out: Any, expected: Any, atol: float) -> bool | None:
    """EvalPlus' special oracles for the plain (non-protocol) check: :func:`_evalplus_exact` with the expected
    output of a not-None task as a bool and find_zero's default tolerance; None = use the plain comparison."""
    if (
        problem.source == "mbppplus"
        and problem.entry_point in _MBPP_NOT_NONE
        and not isinstance(expected, bool)
    ):
        expected = expected is not None  # ``out`` is already ``r is not None`` (see benchmark_calls)
    try:
        return _evalplus_exact(problem, call, out, expected, atol or 1e-6)
    except Exception:  # a wrong-typed output of untrusted code: not a match
        return False


def call_matches(
    problem: Problem, call: str, outcome: CallOutcome, expected: Any, rel_tol: float, abs_tol: float
) -> bool:
    """Whether one call's outcome matches the reference output (EvalPlus tolerance: the task's atol)."""
    if not outcome.ok:
        return False
    atol = problem.atol if problem.atol > 0 else abs_tol
    special = _special_oracle(problem, call, outcome.value, expected, atol)
    if special is not None:
        return special
    return values_equal(outcome.value, expected, rel_tol, atol)


def _evalplus_exact(problem: Problem, call: str, out: Any, expected: Any, atol: float) -> bool | None:
    """evalplus' ``exact_match`` of a task with a special oracle (evalplus/eval/__init__.py); None = none."""
    ep = problem.entry_point
    if problem.source == "humanevalplus" and ep == "find_zero":
        args = _call_args(call)  # its float rule does not apply: the oracle is the whole check
        # the call's own arguments (the coefficients) then the candidate's root, as evalplus calls poly
        return args is not None and abs(_poly(*args, out)) <= atol  # type: ignore[call-arg]
    if problem.source != "mbppplus":
        return None
    if ep == "are_equivalent":
        return True
    if ep in _MBPP_SET_EQ:
        return set(out) == set(expected)
    if ep in _MBPP_NOT_NONE:  # ``out`` is already ``r is not None`` or the sample's bool (judged_call)
        return out == expected
    exact = out == expected
    if ep == "sum_div":
        return exact or out == 0
    if ep in ("surface_Area", "digit_distance_nums"):
        args = _call_args(call)
        if args is None:
            return None
        if ep == "surface_Area":
            return exact or abs(out - _surface_area(*args)) <= atol
        return exact or out == _digit_distance(*args)
    return None


def evalplus_flags(problem: Problem, outcomes: Sequence[CallOutcome]) -> list[bool]:
    """Per input, the EvalPlus verdict (``codea1_core.data.evalplus_rules``), base run then plus run; of
    the first ``len(outcomes)`` inputs when fewer outcomes than inputs are given (a staged run's prefix).

    An input fails when the call did not return, took longer than ``max(1 s, 4 x the reference's time)``
    (``metadata["ref_time_s"]``; 1 s where none was recorded), came after its run (base, plus) used up
    ``run_cap_s`` of the run's limits, or its output does not match.
    """
    cases = list(problem.tests) + list(problem.plus_tests)
    if len(outcomes) > len(cases):
        raise ValueError(f"{problem.id}: {len(outcomes)} outcomes for {len(cases)} calls")
    times = list((problem.metadata or {}).get("ref_time_s") or [])
    limits = [time_limit_s(times[i]) if i < len(times) else MIN_TIME_LIMIT_S for i in range(len(cases))]
    n_base = len(problem.tests)
    flags: list[bool] = []
    atol, spent, cap = problem.atol, 0.0, run_cap_s(limits[:n_base])
    # (a prefix's flags: each depends only on the inputs before it, the run caps on every input's limit)
    for i, (case, o) in enumerate(zip(cases[: len(outcomes)], outcomes, strict=True)):
        if i == n_base:  # the plus inputs are a separate evalplus run: atol and the run's clock start afresh
            atol, spent, cap = problem.atol, 0.0, run_cap_s(limits[n_base:])
        spent += o.duration_s
        if not o.ok or o.duration_s > limits[i] or spent > cap:
            flags.append(False)
            continue
        try:
            exact = _evalplus_exact(problem, case.call, o.value, case.expected, atol)
            if exact is not None and problem.entry_point == "find_zero":
                flags.append(bool(exact))
                continue
            ok, atol = outputs_match(o.value, case.expected, atol, exact)
        except Exception:  # a wrong-typed output of untrusted code: that input fails, as in evalplus
            ok = False
        flags.append(ok)
    return flags


def judge_sample(
    problem: Problem,
    outcomes: Sequence[CallOutcome],
    rel_tol: float,
    abs_tol: float,
    evalplus_protocol: bool = False,
) -> SampleVerdict:
    """Base and plus verdict of one sample from its outcomes (in :func:`benchmark_calls` order).

    A problem without tests gives an ``excluded`` verdict (never a vacuous pass).
    """
    cases = list(problem.tests) + list(problem.plus_tests)
    if len(outcomes) != len(cases):
        raise ValueError(f"{problem.id}: {len(outcomes)} outcomes for {len(cases)} calls")
    if not problem.tests:
        return SampleVerdict(base=False, plus=False, excluded=True)
    if any(o.status == INFRA for o in outcomes):
        return SampleVerdict(base=False, plus=False, infra=True)
    if uses_evalplus(problem, evalplus_protocol):
        ok = evalplus_flags(problem, outcomes)
    else:
        ok = [
            call_matches(problem, c.call, o, c.expected, rel_tol, abs_tol)
            for c, o in zip(cases, outcomes, strict=True)
        ]
    n_base = len(problem.tests)
    base = all(ok[:n_base])
    return SampleVerdict(
        base=base, plus=base and all(ok[n_base:]), sparse=_sparse_verdict(problem, cases, ok)
    )


def _sparse_verdict(problem: Problem, cases: Sequence[Any], ok: Sequence[bool]) -> bool | None:
    """All sparse golden calls matched; None when the problem names none (non-lab benchmarks)."""
    named = problem.metadata.get("sparse_calls")
    if not named:
        return None
    sparse = set(named)
    return all(flag for case, flag in zip(cases, ok, strict=True) if case.call in sparse)


def verdicts_for(
    problems: Sequence[Problem],
    jobs: CodeJobs,
    results: Sequence[Sequence[CallOutcome]],
    rel_tol: float,
    abs_tol: float,
    evalplus_protocol: bool = False,
) -> list[list[SampleVerdict]]:
    """Per problem, per sample verdicts; each distinct job is judged once."""
    if len(results) != len(jobs.jobs):
        raise ValueError(f"{len(results)} results for {len(jobs.jobs)} jobs")
    judged = [
        judge_sample(problems[p], res, rel_tol, abs_tol, evalplus_protocol)
        for p, res in zip(jobs.job_problem, results, strict=True)
    ]
    return [[judged[j] for j in row] for row in jobs.sample_job]


Job = tuple[str, list[str]]
RunJobs = Callable[[list[Job], list[int]], Sequence[Sequence[CallOutcome]]]
"""``run(jobs, ids)``: the outcomes of ``jobs`` (``ids``: their indices in :attr:`CodeJobs.jobs`, to name them)."""


def evalplus_stages(problem: Problem) -> list[int]:
    """The prefixes of a sample's inputs a staged run tries in turn: its first input, its base inputs, all."""
    n_base, n = len(problem.tests), len(problem.tests) + len(problem.plus_tests)
    return sorted({k for k in (1, n_base, n) if 0 < k <= n})


def _reference_s(problem: Problem, k: int) -> float:
    """The reference's time on the first ``k`` inputs (0 where prepare recorded none)."""
    return float(sum(((problem.metadata or {}).get("ref_time_s") or [])[:k]))


def run_code_jobs(
    problems: Sequence[Problem],
    jobs: CodeJobs,
    run: RunJobs,
    evalplus_protocol: bool = False,
    only: Sequence[int] | None = None,
) -> list[list[CallOutcome]]:
    """The outcomes of ``jobs.jobs`` (or of the jobs ``only`` lists, in its order), one per call, via ``run``.

    An EvalPlus job runs in stages (:func:`evalplus_stages`), each from a freshly defined program on a longer
    prefix of its calls, and stops at the first stage with a failing input (:func:`evalplus_flags`) or an
    ``infra_error``: as evalplus stops a sample at its first failure. Its verdict is the full run's: a
    stage runs the full run's first calls in the same order (for a program whose results do not vary from
    run to run, the same outcomes), and after a failed input no later input changes ``base`` or ``plus``;
    those are :data:`NOT_RUN` errors (after an infra failure, its outcome, for the D4 count). The verdicts
    are still decided here from outcomes; the stages only decide how many calls run. A job under the training
    rules runs once with every call (the lab's sparse verdict needs them all): without EvalPlus jobs ``run``
    is called once, with the jobs as built. A stage's jobs go out longest first (reference time).
    """
    select = list(range(len(jobs.jobs))) if only is None else list(only)
    problem_of = [problems[jobs.job_problem[j]] for j in select]
    stage = {i: 0 for i, p in enumerate(problem_of) if p.tests and uses_evalplus(p, evalplus_protocol)}
    batch = [i for i in range(len(select)) if i not in stage]  # the first round only: every call at once
    out: list[list[CallOutcome] | None] = [None] * len(select)
    while batch or stage:
        prefix = {i: evalplus_stages(problem_of[i])[k] for i, k in stage.items()}
        batch = sorted(stage, key=lambda i: -_reference_s(problem_of[i], prefix[i])) + batch
        calls = [jobs.jobs[select[i]][1] for i in batch]
        sent = [
            (jobs.jobs[select[i]][0], c[: prefix.get(i, len(c))]) for i, c in zip(batch, calls, strict=True)
        ]
        results = run(sent, [select[i] for i in batch])
        for i, c, res in zip(batch, calls, results, strict=True):
            res = list(res)
            infra = any(o.status == INFRA for o in res)
            if i in stage and len(res) < len(c) and not infra and all(evalplus_flags(problem_of[i], res)):
                stage[i] += 1
                continue
            stage.pop(i, None)
            filler = res[-1] if infra else CallOutcome("error", None, NOT_RUN)
            out[i] = res + [filler] * (len(c) - len(res))
        batch = []
    return out  # type: ignore[return-value]


def _split_metrics(prefix: str, passed: list[list[bool]], k_list: Sequence[int]) -> dict[str, float]:
    out: dict[str, float] = {}
    rows = [r for r in passed if r]
    if not rows:
        return out
    n_max = max(len(r) for r in rows)
    for k in k_list:
        if k > n_max:
            continue
        # problems that lost samples to infra errors use k = min(k, n) (pass@n when n < k)
        vals = [pass_at_k(len(r), sum(r), min(k, len(r))) for r in rows]
        out[f"{prefix}/pass@{k}"] = 100.0 * sum(vals) / len(vals)
    out[f"{prefix}/avg@{n_max}"] = 100.0 * sum(sum(r) / len(r) for r in rows) / len(rows)
    return out


def aggregate_code(
    bench: str,
    problems: Sequence[Problem],
    verdicts: Sequence[Sequence[SampleVerdict]],
    k_list: Sequence[int],
) -> dict[str, float]:
    """Flat metrics ``code/<bench>/{base,plus}/pass@k`` and ``avg@n`` in percent.

    ``code/<bench>/pass@k`` is the headline number: plus when the benchmark has plus inputs, else base.
    Lab problems also give ``code/<bench>/sparse/...``: the same samples judged on the sparse golden tests
    only (what a ``lab.golden_tests: sparse`` run was rewarded on), beside ``base`` (the boundary set)
    and ``plus`` (boundary + sparse, the full set) — the EvalPlus idea of base vs plus tests.
    Problems without tests are left out of every rate and counted as ``code/<bench>/excluded_problems``
    (reported when there is one, and always on EvalPlus benchmarks).
    """
    base = [[v.base for v in row if not v.infra and not v.excluded] for row in verdicts]
    plus = [[v.plus for v in row if not v.infra and not v.excluded] for row in verdicts]
    has_plus = any(p.plus_tests for p in problems)
    out = _split_metrics(f"code/{bench}/base", base, k_list)
    if has_plus:
        out |= _split_metrics(f"code/{bench}/plus", plus, k_list)
    if any(v.sparse is not None for row in verdicts for v in row):
        sparse = [
            [bool(v.sparse) for v in row if not v.infra and not v.excluded and v.sparse is not None]
            for row in verdicts
        ]
        out |= _split_metrics(f"code/{bench}/sparse", sparse, k_list)
    headline = "plus" if has_plus else "base"
    for key, value in list(out.items()):
        if key.startswith(f"code/{bench}/{headline}/"):
            out[key.replace(f"/{headline}/", "/", 1)] = value
    out[f"code/{bench}/n_problems"] = float(sum(1 for r in base if r))
    out[f"code/{bench}/n_samples"] = float(sum(not v.excluded for r in verdicts for v in r))
    out[f"code/{bench}/infra_errors"] = float(sum(v.infra for r in verdicts for v in r))
    excluded = sum(any(v.excluded for v in row) for row in verdicts)
    if excluded or any(p.source in EVALPLUS_SOURCES for p in problems):
        out[f"code/{bench}/excluded_problems"] = float(excluded)
    return out


def code_metrics(
    bench: str,
    problems: Sequence[Problem],
    verdicts: Sequence[Sequence[SampleVerdict]],
    k_list: Sequence[int],
    subsets: dict[str, list[int]] | None = None,
    evalplus_protocol: bool = False,
) -> dict[str, float]:
    """:func:`aggregate_code` of a benchmark, and again of each subset (name -> problem indices) as
    ``<bench>_<name>`` from the same verdicts (no extra generation or execution).

    A benchmark with EvalPlus problems also says which rules judged them: ``code/<bench>/evalplus_protocol``
    is 1.0 (EvalPlus' rules) or 0.0 (training rules, ``eval.evalplus_protocol: false``)."""
    metrics = aggregate_code(bench, problems, verdicts, k_list)
    if any(p.source in EVALPLUS_SOURCES for p in problems):
        metrics[f"code/{bench}/evalplus_protocol"] = float(bool(evalplus_protocol))
    for name, idx in (subsets or {}).items():
        sub = [problems[i] for i in idx]
        metrics |= aggregate_code(f"{bench}_{name}", sub, [verdicts[i] for i in idx], k_list)
    return metrics
