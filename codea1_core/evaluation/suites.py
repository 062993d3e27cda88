"""Test-LLM benchmark plan: which suites run where, in two phases, and how their records are assembled.

What it does (docs/method.md §13.2, UnLeakedTestBench definitions), the training pattern of
:mod:`codea1_core.method.outcomes` applied to evaluation — the core plans, one task runs, the core
assembles:

1. :func:`plan_suites` parses one test response per problem and keeps its first ``k`` asserts;
   ``plan.reference_jobs()`` checks every non-empty suite on its problem's reference (each call and each
   predicted answer evaluated once, :func:`~codea1_core.evaluation.verdicts.reference_exprs`).
2. ``plan.reference_verdicts(outcomes)`` judges them in the trusted parent; ``plan.mutant_targets(verdicts)``
   names the problems whose suite fully passes its reference, and ``plan.mutant_jobs(verdicts, mutants)``
   runs exactly those suites' calls on each mutant of those references.
3. ``plan.records(verdicts, mutants, outcomes)`` gives one :class:`SuiteRecord` per problem
   (mutants killed / completed); :func:`~codea1_core.evaluation.verdicts.suite_metrics` aggregates them.

What it does not: generate text, generate or cache mutants (the caller passes their sources), run code.
Infrastructure failures are never scored: a reference that hit one gives ``None`` verdicts (the problem
counts as generating nothing), a mutant that hit one is not completed (D4).

How to run: through ``tasks/evaluate_tests.py``; unit tests in ``tests/core/evaluation/test_evaluation.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from codea1_core.evaluation.verdicts import (
    SuiteRecord,
    TestVerdict,
    judge_reference,
    mutant_killed,
    reference_exprs,
)
from codea1_core.method.parsing import extract_tests
from codea1_core.types import CallOutcome, ParsedTest, Problem

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
    parse_mode: str,
    literal_answers: bool,
) -> SuitePlan:
    """Parse one test response per problem (``texts[i]`` for ``problems[i]``) into its first ``k`` asserts."""
    suites, generated = [], []
    for problem, text in zip(problems, texts, strict=True):
        parsed = extract_tests(text, problem.entry_point, parse_mode, literal_answers=literal_answers)
        suites.append(tuple(parsed.tests[:k]))
        generated.append(min(k, len(parsed.tests) + parsed.invalid))
    return SuitePlan(tuple(problems), tuple(suites), tuple(generated))
