"""The pure execution plan of one problem and the assembly of its :class:`OutcomeMatrix` (docs/method.md §6).

What it does: decides which expressions run where, then turns the executor's
:class:`~codea1_core.types.CallOutcome` lists back into per-suite quantities (V, I, failure flags) and
replay pass flags. Two phases per problem (docs/method.md §6.2):

1. ``plan.reference_job()`` — the reference solution evaluates every unique call of all M·N suites and
   every unique predicted answer, once each (GT filling, D1).
2. ``plan.candidate_jobs(ref_outcomes)`` — one job per code: the problem's imports + code m, evaluating
   the replayed Mistake-Book calls and the unique calls of code m's kept tests, once each.
3. ``plan.assemble(ref_outcomes, cand_outcomes, rel_tol, abs_tol)`` — comparisons happen here, in the
   trusted parent, with ``values.values_equal`` (D2).

A job is ``(program_source, exprs)``; the sandbox evaluates each expression in the program's namespace
and returns one ``CallOutcome`` per expression (``sandbox.ProcessExecutor.run_many``).

What it does not do: execute anything (no sandbox import; core stays pure) or compute rewards
(``codea1_core.method.rewards``).

Differences from the official single-program layout (§6.2), by design: GT and candidate run in separate
programs, so GT names never leak into the candidate namespace (quirk 9); tests are (call, value) pairs,
so there is no misalignment (quirk 11, D1); a GT time-out or unsupported output makes a test invalid
(§18.2); an infrastructure failure masks a code (or the whole problem) instead of failing it (D4).

How to run: ``tests/core/method/test_outcomes.py``.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Sequence
from dataclasses import dataclass

from codea1_core.types import (
    CallOutcome,
    GoldenOutcome,
    OutcomeMatrix,
    ParsedSuite,
    Problem,
    SuiteOutcome,
    TestCase,
)
from codea1_core.values import values_equal

Job = tuple[str, list[str]]
"""``(program_source, exprs)``: one sandbox program and the expressions it evaluates, in order."""

SENTINEL_EXPR = "None"
"""Evaluated when a program has nothing else to run, so that ``program_error`` (valid(m) = 0) is seen."""


# --------------------------------------------------------------------------------------------------
# Program sources
# --------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _top_level_imports(source: str) -> tuple[str, ...]:
    """Source lines of the top-level ``import`` / ``from ... import`` statements of ``source``.

    Cached by source text: every candidate of a problem shares the reference, parsed once.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()
    return tuple(
        ast.unparse(node)
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "module", "") != "__future__"
    )


def problem_imports(problem: Problem) -> list[str]:
    """Sorted union of the problem's import lines and the reference's top-level imports (§6.2 step 1)."""
    return sorted(set(problem.imports) | set(_top_level_imports(problem.reference_solution)))


def candidate_program(problem: Problem, code: str) -> str:
    """THE program a candidate runs as, in training and in evaluation alike (§6.2 step 1).

    ``code`` is preceded by :func:`problem_imports`, so a candidate may use modules the problem's prompt
    or its reference imports (a candidate's own imports stay in place: re-importing is harmless). A
    leading docstring and ``from __future__`` imports of the candidate stay first, where Python requires
    them. ``metadata["test_program"]`` (BigCodeBench's unittest class and its check function) is appended
    after the code. One function on purpose: training and evaluation must judge the same program.
    """
    program = _with_header(code, problem_imports(problem))
    suffix = (problem.metadata or {}).get("test_program", "")
    return f"{program}\n{suffix}" if suffix else program


def _with_header(code: str, imports: Sequence[str]) -> str:
    """``code`` with ``imports`` inserted after its leading docstring and ``from __future__`` lines."""
    header = "\n".join(imports)
    if not header:
        return code
    split_line = 0
    try:
        body = ast.parse(code).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        body = []  # the sandbox reports the syntax error as program_error
    for i, node in enumerate(body):
        is_doc = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        is_future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
        if not (is_doc or is_future):
            break
        split_line = node.end_lineno or 0
    lines = code.splitlines()
    return "\n".join([*lines[:split_line], header, *lines[split_line:]])


def _unique(items: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _check_outcomes(what: str, outcomes: Sequence[CallOutcome], exprs: Sequence[str], pid: str) -> None:
    if len(outcomes) != len(exprs):
        raise ValueError(f"problem {pid}: {what} has {len(outcomes)} outcomes for {len(exprs)} expressions")


def _passes(outcome: CallOutcome, expected: object, rel_tol: float, abs_tol: float) -> bool:
    """A call passes when it ran OK and its value equals the expected value (D2, in the parent)."""
    return outcome.status == "ok" and values_equal(outcome.value, expected, rel_tol, abs_tol)


def _code_status(outcomes: Sequence[CallOutcome]) -> tuple[bool, bool]:
    """(valid, infra) of a candidate job: infra_error anywhere masks it (D4); program_error → invalid."""
    infra = any(o.status == "infra_error" for o in outcomes)
    valid = not infra and not any(o.status == "program_error" for o in outcomes)
    return valid, infra


# --------------------------------------------------------------------------------------------------
# Generated tests: the plan of one problem
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Filled:
    """GT filling of one suite, independent of the candidate (§6.2 step 2 with D1)."""

    tests: tuple[TestCase, ...]
    reasons: tuple[str, ...]  # parser reasons first, then GT/duplicate/answer reasons in order


class ProblemPlan:
    """What to run for one problem and how to read the results back (see the module docstring)."""

    def __init__(
        self,
        problem: Problem,
        codes: Sequence[str],
        suites: Sequence[Sequence[ParsedSuite]],
        replay: Sequence[TestCase],
    ):
        if len(suites) != len(codes):
            raise ValueError(f"problem {problem.id}: {len(codes)} codes but {len(suites)} suite lists")
        self.problem = problem
        self.codes = tuple(codes)
        self.suites = tuple(tuple(row) for row in suites)
        self.replay = tuple(replay)
        exprs = [e for row in self.suites for s in row for t in s.tests for e in (t.call, t.answer)]
        self._ref_exprs = _unique(exprs) or [SENTINEL_EXPR]

    # -- phase 1 ----------------------------------------------------------------------------------

    def reference_job(self) -> Job:
        """The reference solution evaluating every unique call and predicted answer once (D1)."""
        return self.problem.reference_solution, list(self._ref_exprs)

    def _ref_map(self, ref_outcomes: Sequence[CallOutcome]) -> dict[str, CallOutcome]:
        _check_outcomes("the reference job", ref_outcomes, self._ref_exprs, self.problem.id)
        return dict(zip(self._ref_exprs, ref_outcomes, strict=True))

    def _problem_error(self, ref: dict[str, CallOutcome]) -> str:
        """Why the whole problem is masked: an infra failure (D4) or a reference that cannot load."""
        for outcome in ref.values():
            if outcome.status == "infra_error":
                return f"infra_error on the reference job: {outcome.error}"
        for outcome in ref.values():
            if outcome.status == "program_error":  # a data fault, never the models' doing
                return f"reference solution failed to load: {outcome.error}"
        return ""

    def _fill(
        self,
        suite: ParsedSuite,
        ref: dict[str, CallOutcome],
        rel_tol: float,
        abs_tol: float,
        filled: dict[str, TestCase],
        right: dict[tuple[str, str], bool],
    ) -> _Filled:
        """Validate and GT-fill one suite (§6.2 step 2, §6.3, D1, §18.2).

        ``filled`` (call -> its test) and ``right`` ((call, answer) -> the answer equals the GT value) are the
        problem's memos: a call's GT value is the same in every suite, so its test and each answer's
        comparison are made once per problem."""
        tests: list[TestCase] = []
        reasons = list(suite.reasons)
        seen: set[str] = set()
        for parsed in suite.tests:
            call = parsed.call
            gt = ref[call]
            if gt.status != "ok":  # raises / times out / unsupported output on GT → invalid, not kept
                reasons.append(f"gt_{gt.status}")
                continue
            if call in seen:  # same call ⇒ same GT value ⇒ same filled test: a duplicate
                reasons.append("duplicate")
                continue
            seen.add(call)
            test = filled.get(call)
            if test is None:
                test = filled[call] = TestCase(call, gt.value)
            tests.append(test)
            # The predicted answer only decides validity; the test stays kept with the GT value.
            key = (call, parsed.answer)
            ok = right.get(key)
            if ok is None:
                ok = right[key] = _passes(ref[parsed.answer], gt.value, rel_tol, abs_tol)
            if not ok:
                reasons.append("wrong_answer")
        return _Filled(tuple(tests), tuple(reasons))

    # -- phase 2 ----------------------------------------------------------------------------------

    def _code_calls(self, m: int, ref: dict[str, CallOutcome], problem_error: str) -> list[str]:
        replay_calls = [t.call for t in self.replay]
        if problem_error:
            return [SENTINEL_EXPR]
        ran_ok = [t.call for s in self.suites[m] for t in s.tests if ref[t.call].status == "ok"]
        return _unique(replay_calls + ran_ok) or [SENTINEL_EXPR]

    def candidate_jobs(self, ref_outcomes: Sequence[CallOutcome]) -> list[Job]:
        """One job per code: replayed calls first (as official), then the unique calls that ran OK on GT.

        Always M jobs; a code with nothing to run (or a masked problem) gets the sentinel expression.
        """
        ref = self._ref_map(ref_outcomes)
        problem_error = self._problem_error(ref)
        return [
            (candidate_program(self.problem, code), self._code_calls(m, ref, problem_error))
            for m, code in enumerate(self.codes)
        ]

    # -- assembly ---------------------------------------------------------------------------------

    def assemble(
        self,
        ref_outcomes: Sequence[CallOutcome],
        cand_outcomes: Sequence[Sequence[CallOutcome]],
        rel_tol: float,
        abs_tol: float,
    ) -> OutcomeMatrix:
        """Build the :class:`OutcomeMatrix` from both phases' outcomes (§6.3, D1-D4).

        Raises:
            ValueError: when an outcome list does not match its job (a caller bug, named by problem id).
        """
        ref = self._ref_map(ref_outcomes)
        problem_error = self._problem_error(ref)
        calls = [self._code_calls(m, ref, problem_error) for m in range(len(self.codes))]
        if len(cand_outcomes) != len(calls):
            raise ValueError(
                f"problem {self.problem.id}: {len(cand_outcomes)} candidate results for {len(calls)} jobs"
            )
        if problem_error:
            return self._masked(problem_error)
        valid, infra, suites, replay_passed = [], [], [], []
        tests: dict[str, TestCase] = {}
        right: dict[tuple[str, str], bool] = {}
        for m, (exprs, outcomes) in enumerate(zip(calls, cand_outcomes, strict=True)):
            _check_outcomes(f"candidate job {m}", outcomes, exprs, self.problem.id)
            got = dict(zip(exprs, outcomes, strict=True))
            code_valid, code_infra = _code_status(outcomes)
            valid.append(code_valid)
            infra.append(code_infra)
            replay_passed.append(
                tuple(_passes(got[t.call], t.expected, rel_tol, abs_tol) for t in self.replay)
            )
            failed: dict[str, bool] = {}  # call -> code m fails its test (the same in every suite)
            row = []
            for suite in self.suites[m]:
                filled = self._fill(suite, ref, rel_tol, abs_tol, tests, right)
                fails = []
                for t in filled.tests:
                    fail = failed.get(t.call)
                    if fail is None:
                        fail = failed[t.call] = not _passes(got[t.call], t.expected, rel_tol, abs_tol)
                    fails.append(fail)
                row.append(
                    SuiteOutcome(
                        tests=filled.tests,
                        fails=tuple(fails),
                        invalid=len(filled.reasons),
                        reasons=filled.reasons,
                        nonprintable=suite.nonprintable,
                    )
                )
            suites.append(tuple(row))
        return OutcomeMatrix(
            problem_id=self.problem.id,
            code_valid=tuple(valid),
            code_infra=tuple(infra),
            problem_infra=False,
            suites=tuple(suites),
            replay=self.replay,
            replay_passed=tuple(replay_passed),
        )

    def _masked(self, problem_error: str) -> OutcomeMatrix:
        """The whole problem masked (D4): nothing is scored and the Mistake Book learns nothing."""
        m_codes = len(self.codes)
        return OutcomeMatrix(
            problem_id=self.problem.id,
            code_valid=(False,) * m_codes,
            code_infra=(False,) * m_codes,
            problem_infra=True,
            suites=tuple(
                tuple(SuiteOutcome(nonprintable=s.nonprintable) for s in row) for row in self.suites
            ),
            replay=self.replay,
            replay_passed=tuple((False,) * len(self.replay) for _ in range(m_codes)),
            problem_error=problem_error,
        )


def plan_problem(
    problem: Problem,
    codes: Sequence[str],
    suites: Sequence[Sequence[ParsedSuite]],
    replay: Sequence[TestCase] = (),
) -> ProblemPlan:
    """Plan one problem: ``codes`` are the M extracted codes, ``suites[m]`` the N suites written against
    code m, ``replay`` the Mistake-Book tests retrieved for this problem (the same for every code, §8)."""
    return ProblemPlan(problem, codes, suites, replay)


# --------------------------------------------------------------------------------------------------
# Golden tests (§7.4, the Golden-Tests baseline)
# --------------------------------------------------------------------------------------------------


class GoldenPlan:
    """Each code runs the problem's golden calls (each unique call once); assembly compares in the parent."""

    def __init__(self, problem: Problem, codes: Sequence[str], tests: Sequence[TestCase] | None = None):
        self.problem = problem
        self.codes = tuple(codes)
        self.tests = tuple(problem.tests if tests is None else tests)
        self._exprs = _unique([t.call for t in self.tests]) or [SENTINEL_EXPR]

    def jobs(self) -> list[Job]:
        """One job per code: imports + code, evaluating every unique golden call."""
        return [(candidate_program(self.problem, code), list(self._exprs)) for code in self.codes]

    def assemble(
        self, outcomes: Sequence[Sequence[CallOutcome]], rel_tol: float, abs_tol: float
    ) -> GoldenOutcome:
        """Pass flags per (code, golden test); infra failures mask the code (D4)."""
        if len(outcomes) != len(self.codes):
            raise ValueError(
                f"problem {self.problem.id}: {len(outcomes)} golden results for {len(self.codes)} codes"
            )
        valid, infra, passed = [], [], []
        for m, outs in enumerate(outcomes):
            _check_outcomes(f"golden job {m}", outs, self._exprs, self.problem.id)
            got = dict(zip(self._exprs, outs, strict=True))
            code_valid, code_infra = _code_status(outs)
            valid.append(code_valid)
            infra.append(code_infra)
            passed.append(tuple(_passes(got[t.call], t.expected, rel_tol, abs_tol) for t in self.tests))
        return GoldenOutcome(
            problem_id=self.problem.id,
            tests=self.tests,
            code_valid=tuple(valid),
            code_infra=tuple(infra),
            passed=tuple(passed),
        )


def plan_golden(
    problem: Problem, codes: Sequence[str], tests: Sequence[TestCase] | None = None
) -> GoldenPlan:
    """Plan the golden-test run of M codes (``tests`` defaults to ``problem.tests``)."""
    return GoldenPlan(problem, codes, tests)
