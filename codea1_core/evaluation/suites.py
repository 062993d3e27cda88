"""Test-LLM benchmark evaluation, pure parts: the two-phase plan, the verdicts, the metrics.

What it does (docs/method.md §13.2, UnLeakedTestBench definitions): the first ``k`` asserts of one suite per
problem are checked on the reference (pass@k), the suites that fully pass it are run on mutants of the
reference (mut@k), and Mul = pass@k × mut@k / 100. The training pattern of :mod:`codea1_core.method.outcomes`
applied to evaluation — the core plans, one task runs, the core assembles:

1. :func:`plan_suites` parses one test response per problem and keeps its first ``k`` asserts;
   ``plan.reference_jobs()`` checks every non-empty suite on its problem's reference (each call and each
   predicted answer evaluated once, :func:`reference_exprs`).
2. ``plan.reference_verdicts(outcomes)`` judges them in the trusted parent; ``plan.mutant_targets(verdicts)``
   names the problems whose suite fully passes its reference, and ``plan.mutant_jobs(verdicts, mutants)``
   runs exactly those suites' calls on each mutant of those references.
3. ``plan.records(verdicts, mutants, outcomes)`` gives one :class:`SuiteRecord` per problem
   (mutants killed / completed); :func:`suite_metrics` aggregates them.

What it does not: generate text, generate or cache mutants (the caller passes their sources), run code.
Infrastructure failures are never scored: a reference that hit one gives ``None`` verdicts (the problem
counts as generating nothing), a mutant that hit one is not completed (D4).

How to run: through ``tasks/evaluate_tests.py``; unit tests in ``tests/core/evaluation/test_evaluation.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from codea1_core.evaluation.verdicts import INFRA
from codea1_core.method.parsing import ParseMode, extract_tests
from codea1_core.types import CallOutcome, ParsedTest, Problem
from codea1_core.values import values_equal

# --------------------------------------------------------------------------------------------------
# Verdicts and metrics: pass@k on the reference, mut@k on mutants, Mul
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TestVerdict:
    """One generated test checked on the reference: ``correct`` = the call runs and its answer holds."""

    __test__ = False

    call: str
    answer: str
    correct: bool
    expected: Any = None
    reason: str = ""


def reference_exprs(tests: Sequence[Any]) -> list[str]:
    """Interleaved ``[call_1, answer_1, call_2, answer_2, ...]`` evaluated in the reference program.

    The predicted ANSWER is evaluated in the sandbox like any call (docs/method.md §18.2 proposal) and
    compared in the trusted parent (D2).
    """
    return [expr for t in tests for expr in (t.call, t.answer)]


def judge_reference(
    tests: Sequence[Any], outcomes: Sequence[CallOutcome], rel_tol: float, abs_tol: float
) -> list[TestVerdict] | None:
    """Verdicts of ``tests`` (objects with ``call``/``answer``); None when the sandbox failed (D4)."""
    if len(outcomes) != 2 * len(tests):
        raise ValueError(f"{len(outcomes)} outcomes for {len(tests)} tests (expected call+answer pairs)")
    if any(o.status == INFRA for o in outcomes):
        return None
    verdicts = []
    for i, test in enumerate(tests):
        got, ans = outcomes[2 * i], outcomes[2 * i + 1]
        if not got.ok:
            verdicts.append(
                TestVerdict(test.call, test.answer, False, None, f"call {got.status}: {got.error}")
            )
        elif not ans.ok:
            verdicts.append(TestVerdict(test.call, test.answer, False, got.value, f"answer {ans.status}"))
        else:
            same = values_equal(ans.value, got.value, rel_tol, abs_tol)
            verdicts.append(
                TestVerdict(test.call, test.answer, same, got.value, "" if same else "wrong answer")
            )
    return verdicts


def mutant_killed(
    verdicts: Sequence[TestVerdict], outcomes: Sequence[CallOutcome], rel_tol: float, abs_tol: float
) -> bool | None:
    """A mutant is killed when any test fails or errors on it; None when the sandbox failed (D4).

    ``outcomes`` are the mutant's results for the calls of ``verdicts`` (all correct on the reference).
    """
    if len(outcomes) != len(verdicts):
        raise ValueError(f"{len(outcomes)} outcomes for {len(verdicts)} tests")
    if any(o.status == INFRA for o in outcomes):
        return None
    return any(
        not o.ok or not values_equal(o.value, v.expected, rel_tol, abs_tol)
        for v, o in zip(verdicts, outcomes, strict=True)
    )


@dataclass(frozen=True)
class SuiteRecord:
    """What one problem contributes to the Test-LLM metrics."""

    problem_id: str
    generated: int
    """Asserts considered: min(k, parsed + invalid) of the suite."""
    verdicts: tuple[TestVerdict, ...]
    killed: int = 0
    mutants: int = 0
    """Mutants that completed (infra failures excluded)."""

    @property
    def passes_reference(self) -> bool:
        """The reference passes every judged test (and at least one was judged)."""
        return bool(self.verdicts) and all(v.correct for v in self.verdicts)


def aggregate_tests(bench: str, records: Sequence[SuiteRecord], k: int) -> dict[str, float]:
    """``test/<bench>/pass@k``, ``mut@k``, ``mul`` (docs/method.md §13.2) in percent.

    ``pass@k`` is the share of generated tests (first k asserts of one suite) correct on the reference;
    ``pass@k_ult`` uses the strict UnLeakedTestBench denominator k × #problems (missing tests count as
    wrong); ``mul`` / ``mul_ult`` multiply each with ``mut@k``. ``mut@k`` averages killed/completed over
    problems whose suite passes the reference (``mut_suites`` of them), as UnLeakedTestBench does; with
    few valid suites it swings wildly, so ``mut@k_all`` averages over every problem with a suite
    (``mut_all_suites``): a suite that fails the reference, or is empty, kills nothing (0). A passing
    suite whose mutants all failed to run (or a reference without mutants) is in neither denominator.
    """
    out: dict[str, float] = {}
    n = len(records)
    correct = sum(v.correct for r in records for v in r.verdicts)
    generated = sum(r.generated for r in records)
    kept = [r for r in records if r.passes_reference and r.mutants > 0]
    out[f"test/{bench}/pass@{k}"] = 100.0 * correct / generated if generated else 0.0
    out[f"test/{bench}/pass@{k}_ult"] = 100.0 * correct / (k * n) if n else 0.0
    out[f"test/{bench}/mut@{k}"] = (
        100.0 * sum(r.killed / r.mutants for r in kept) / len(kept) if kept else 0.0
    )
    out |= _mut_all(bench, records, k)
    out[f"test/{bench}/mul"] = out[f"test/{bench}/pass@{k}"] * out[f"test/{bench}/mut@{k}"] / 100.0
    out[f"test/{bench}/mul_ult"] = out[f"test/{bench}/pass@{k}_ult"] * out[f"test/{bench}/mut@{k}"] / 100.0
    out[f"test/{bench}/n_problems"] = float(n)
    out[f"test/{bench}/suites_passing_reference"] = float(sum(r.passes_reference for r in records))
    out[f"test/{bench}/mutants_mean"] = sum(r.mutants for r in kept) / len(kept) if kept else 0.0
    return out


def _mut_all(bench: str, records: Sequence[SuiteRecord], k: int) -> dict[str, float]:
    """``mut@k`` over all suites (failing ones count 0) and both denominators (see :func:`aggregate_tests`)."""
    kept = [r for r in records if r.passes_reference and r.mutants > 0]
    counted = [r for r in records if not r.passes_reference or r.mutants > 0]
    killed = sum(r.killed / r.mutants for r in kept)
    return {
        f"test/{bench}/mut@{k}_all": 100.0 * killed / len(counted) if counted else 0.0,
        f"test/{bench}/mut_suites": float(len(kept)),
        f"test/{bench}/mut_all_suites": float(len(counted)),
    }


def suite_metrics(
    bench: str, records: Sequence[SuiteRecord], k: int, subsets: dict[str, list[int]] | None = None
) -> dict[str, float]:
    """:func:`aggregate_tests` of a benchmark, and again of each subset as ``<bench>_<name>``."""
    metrics = aggregate_tests(bench, records, k)
    for name, idx in (subsets or {}).items():
        metrics |= aggregate_tests(f"{bench}_{name}", [records[i] for i in idx], k)
    return metrics


# --------------------------------------------------------------------------------------------------
# The plan: references first, then the mutants of the suites that pass them
# --------------------------------------------------------------------------------------------------


Job = tuple[str, list[str]]


Verdicts = list[list[TestVerdict] | None]
"""Per problem: its suite's verdicts on the reference; ``[]`` no suite, ``None`` the sandbox failed (D4)."""


@dataclass(frozen=True)
class SuitePlan:
    """One parsed suite per problem (first ``k`` asserts) and how many asserts each one counts."""

    problems: tuple[Problem, ...]
    suites: tuple[tuple[ParsedTest, ...], ...]
    generated: tuple[int, ...]
    """Asserts considered per problem: min(k, parsed + invalid)."""

    # -- phase 1: the references ------------------------------------------------------------------

    def _with_suite(self) -> list[int]:
        return [i for i, s in enumerate(self.suites) if s]

    def reference_jobs(self) -> list[Job]:
        """One job per problem with a non-empty suite: its reference evaluating every call and answer."""
        return [
            (self.problems[i].reference_solution, reference_exprs(self.suites[i])) for i in self._with_suite()
        ]

    def reference_verdicts(
        self, outcomes: Sequence[Sequence[CallOutcome]], rel_tol: float, abs_tol: float
    ) -> Verdicts:
        """Each suite judged on its reference, from the outcomes of :meth:`reference_jobs` (in order)."""
        idx = self._with_suite()
        if len(outcomes) != len(idx):
            raise ValueError(f"{len(outcomes)} reference results for {len(idx)} reference jobs")
        verdicts: Verdicts = [[] for _ in self.problems]
        for i, res in zip(idx, outcomes, strict=True):
            verdicts[i] = judge_reference(self.suites[i], res, rel_tol, abs_tol)
        return verdicts

    # -- phase 2: the mutants ---------------------------------------------------------------------

    @staticmethod
    def mutant_targets(verdicts: Verdicts) -> list[int]:
        """Problems whose suite fully passes its reference: only those are run on mutants (mut@k)."""
        return [i for i, vs in enumerate(verdicts) if vs and all(v.correct for v in vs)]

    def _mutant_owners(self, verdicts: Verdicts, mutants: Sequence[Sequence[str]]) -> list[int]:
        """The problem of every mutant job; ``mutants[j]`` are the sources of ``mutant_targets()[j]``."""
        targets = self.mutant_targets(verdicts)
        if len(mutants) != len(targets):
            raise ValueError(f"{len(mutants)} mutant lists for {len(targets)} suites passing the reference")
        return [i for i, sources in zip(targets, mutants, strict=True) for _ in sources]

    def mutant_jobs(self, verdicts: Verdicts, mutants: Sequence[Sequence[str]]) -> list[Job]:
        """Every mutant of every target reference, evaluating that suite's calls."""
        targets = self.mutant_targets(verdicts)
        self._mutant_owners(verdicts, mutants)  # checks the lengths
        return [
            (source, [v.call for v in verdicts[i] or ()])
            for i, sources in zip(targets, mutants, strict=True)
            for source in sources
        ]

    # -- assembly ---------------------------------------------------------------------------------

    def records(
        self,
        verdicts: Verdicts,
        mutants: Sequence[Sequence[str]],
        outcomes: Sequence[Sequence[CallOutcome]],
        rel_tol: float,
        abs_tol: float,
    ) -> list[SuiteRecord]:
        """One :class:`SuiteRecord` per problem from both phases (a failed reference generated nothing)."""
        owners = self._mutant_owners(verdicts, mutants)
        if len(outcomes) != len(owners):
            raise ValueError(f"{len(outcomes)} mutant results for {len(owners)} mutant jobs")
        killed = [0] * len(self.problems)
        completed = [0] * len(self.problems)
        for i, res in zip(owners, outcomes, strict=True):
            verdict = mutant_killed(verdicts[i] or [], res, rel_tol, abs_tol)
            if verdict is not None:
                completed[i] += 1
                killed[i] += int(verdict)
        return [
            SuiteRecord(
                p.id,
                self.generated[i] if verdicts[i] is not None else 0,
                tuple(verdicts[i] or ()),
                killed[i],
                completed[i],
            )
            for i, p in enumerate(self.problems)
        ]


def plan_suites(
    problems: Sequence[Problem],
    texts: Sequence[str],
    k: int,
    parse_mode: ParseMode,
    literal_answers: bool,
) -> SuitePlan:
    """Parse one test response per problem (``texts[i]`` for ``problems[i]``) into its first ``k`` asserts."""
    suites, generated = [], []
    for problem, text in zip(problems, texts, strict=True):
        parsed = extract_tests(text, problem.entry_point, parse_mode, literal_answers=literal_answers)
        suites.append(tuple(parsed.tests[:k]))
        generated.append(min(k, len(parsed.tests) + parsed.invalid))
    return SuitePlan(tuple(problems), tuple(suites), tuple(generated))
