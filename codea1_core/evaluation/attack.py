"""Adversarial tests for a user's function, pure parts: the plan of one sandbox run and its report.

What it does, the training pattern (the core plans, one task runs, the core assembles):
:func:`plan_attack` parses the Test LLM's suites against the user's file and keeps every distinct
(call, predicted answer) test with its support (how many suites wrote it); ``plan.jobs()`` is ONE job,
the user's file evaluating every call and every predicted answer; ``plan.report(outcomes)`` sorts the
tests into those that agree with the function, disagree (candidate bugs, or wrong predictions: a human
judges), raise, or have an unevaluable answer, most-agreed first.

What it does not: generate text, run code (``flows/attack.py`` does, through ``tasks.execute.run_jobs``)
or decide who is right.

How to run: ``codea1 attack FILE.py::function``; unit tests in ``tests/flows/test_solve_attack.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from codea1_core.evaluation.suites import reference_exprs
from codea1_core.method.parsing import ParseMode, extract_tests
from codea1_core.types import CallOutcome, ParsedTest, Problem
from codea1_core.values import values_equal

Job = tuple[str, list[str]]


@dataclass(frozen=True)
class Finding:
    """One generated test and what happened when it ran."""

    call: str
    predicted: str
    actual: str = ""
    """``repr`` of the function's output (disagreements) or the error text (errors)."""
    support: int = 1
    """How many of the sampled suites wrote this same test (call and answer): agreement across suites."""


@dataclass(frozen=True)
class AttackReport:
    """Outcome of an attack: tests that agreed, disagreed, raised, or had an unevaluable answer."""

    target: str
    tests: int
    agreed: tuple[Finding, ...]
    disagreements: tuple[Finding, ...]
    errors: tuple[Finding, ...]
    invalid: tuple[Finding, ...]
    unparsed: int = 0
    """Asserts the parser rejected (not of the form ``assert f(...) == answer``)."""
    suites: int = 1
    note: str = ""
    """A caveat printed first (the built-in lab toy model on a function outside its training)."""


@dataclass(frozen=True)
class AttackPlan:
    """The distinct tests of all suites, their support, and the one job that runs them."""

    problem: Problem
    tests: tuple[ParsedTest, ...]
    support: dict[tuple[str, str], int]
    unparsed: int
    suites: int

    def jobs(self) -> list[Job]:
        """The user's file evaluating every call and predicted answer (none when no test parsed)."""
        if not self.tests:
            return []
        return [(self.problem.reference_solution, reference_exprs(self.tests))]

    def report(
        self, outcomes: Sequence[Sequence[CallOutcome]], rel_tol: float, abs_tol: float
    ) -> AttackReport:
        """Classify every test from the outcomes of :meth:`jobs` (compared in the trusted parent)."""
        if len(outcomes) != len(self.jobs()):
            raise ValueError(f"{len(outcomes)} results for {len(self.jobs())} attack jobs")
        ran = outcomes[0] if outcomes else []
        agreed, wrong, errors, invalid = [], [], [], []
        for i, t in enumerate(self.tests):
            got, ans = ran[2 * i], ran[2 * i + 1]
            n = self.support[(t.call, t.answer)]
            if not got.ok:
                errors.append(Finding(t.call, t.answer, f"{got.status}: {got.error}".rstrip(": "), n))
            elif not ans.ok:
                invalid.append(Finding(t.call, t.answer, f"answer {ans.status}: {ans.error}".rstrip(": "), n))
            elif values_equal(got.value, ans.value, rel_tol, abs_tol):
                agreed.append(Finding(t.call, t.answer, repr(got.value), n))
            else:
                wrong.append(Finding(t.call, t.answer, repr(got.value), n))
        return AttackReport(
            self.problem.entry_point,
            len(self.tests),
            tuple(agreed),
            _ranked(wrong),
            _ranked(errors),
            tuple(invalid),
            self.unparsed,
            self.suites,
        )


def _ranked(findings: list[Finding]) -> tuple[Finding, ...]:
    """Most-agreed first: a test several independent suites wrote is likelier a real bug than one suite's guess
    (stable: ties keep the generation order)."""
    return tuple(sorted(findings, key=lambda f: -f.support))


def plan_attack(problem: Problem, texts: Sequence[str], parse_mode: ParseMode) -> AttackPlan:
    """Parse ``texts`` (one response per sampled suite) into distinct tests with their support."""
    tests: dict[tuple[str, str], ParsedTest] = {}
    support: dict[tuple[str, str], int] = {}
    unparsed = 0
    for text in texts:
        parsed = extract_tests(text, problem.entry_point, parse_mode)
        unparsed += parsed.invalid
        for key in {(t.call, t.answer) for t in parsed.tests}:  # once per suite
            support[key] = support.get(key, 0) + 1
        for t in parsed.tests:
            tests.setdefault((t.call, t.answer), t)
    return AttackPlan(problem, tuple(tests.values()), support, unparsed, len(texts))
