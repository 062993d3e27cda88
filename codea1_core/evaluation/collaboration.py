"""Test-time collaboration, pure parts: the Code LLM proposes, the Test LLM's white-box tests pick (§15.6).

What it does, the training pattern (the core plans, one task runs, the core assembles):

1. :func:`distinct_candidates` / :func:`suite_prompts`: one §4.2 white-box prompt per distinct candidate of
   each problem (the Test LLM writes one suite against each).
2. :func:`plan_solve` parses those suites; ``plan.jobs()`` runs every distinct test call on every
   candidate and evaluates every distinct predicted answer on its own (a program of the problem's
   imports only), all in one batch.
3. ``plan.select(outcomes)``: the candidate passing the most valid tests (tests whose answer evaluates)
   wins; ties go to the candidate whose outputs agree most with the other candidates', then to the
   earliest; a candidate that is not Python is never chosen. The rule is ours (the paper does not
   publish it, §18.1 item 12).
4. :func:`benchmark_jobs` / :func:`solve_metrics`: the chosen candidates of a benchmark judged with the
   EvalPlus verdicts, next to the candidates' mean and best-of-N.

What it does not: generate text or run code (``tasks/collaboration.py`` does, through ``tasks.execute.run_jobs``).

How to run: ``codea1 solve`` (``flows/solve.py``); unit tests in ``tests/flows/test_solve_attack.py`` and
``tests/core/evaluation/test_evaluation.py``.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass

from codea1_core.evaluation.verdicts import benchmark_calls, judge_sample
from codea1_core.method.outcomes import candidate_program
from codea1_core.method.parsing import ParseMode, extract_tests
from codea1_core.method.prompts import test_messages
from codea1_core.types import CallOutcome, Problem
from codea1_core.values import values_equal

Job = tuple[str, list[str]]


@dataclass(frozen=True)
class CandidateScore:
    """Vote of one candidate: valid tests passed, and output agreement with the other candidates."""

    index: int
    passed: int
    valid: int
    agreement: int


@dataclass(frozen=True)
class SolveResult:
    """The chosen candidate, the tests that voted and every candidate's score."""

    code: str
    chosen: int
    candidates: tuple[str, ...]
    tests: tuple[tuple[str, str, bool], ...]
    """(call, predicted answer, chosen candidate passes) of every valid test."""
    votes: tuple[CandidateScore, ...]


# --------------------------------------------------------------------------------------------------
# Scoring and selection rules
# --------------------------------------------------------------------------------------------------


def score_candidates(
    call_outcomes: Sequence[Sequence[CallOutcome]],
    answer_outcomes: Sequence[CallOutcome],
    tests: Sequence[tuple[int, int]],
    rel_tol: float,
    abs_tol: float,
) -> list[CandidateScore]:
    """Score candidates on generated tests.

    Args:
        call_outcomes: ``[candidate][call]`` outcomes of every distinct call on every candidate.
        answer_outcomes: outcome of every distinct predicted answer, evaluated without any candidate.
        tests: ``(call index, answer index)`` pairs; a test is valid when its answer evaluates.
        rel_tol: relative float tolerance.
        abs_tol: absolute float tolerance.

    Returns:
        One score per candidate, in input order. Agreement counts, per call, the other candidates whose
        output equals this one's (the tie-break of :func:`select_candidate`).
    """
    valid = [(c, a) for c, a in tests if answer_outcomes[a].ok]
    scores = []
    for i, outs in enumerate(call_outcomes):
        passed = sum(
            1
            for c, a in valid
            if outs[c].ok and values_equal(outs[c].value, answer_outcomes[a].value, rel_tol, abs_tol)
        )
        agreement = 0
        for j, other in enumerate(call_outcomes):
            if j == i:
                continue
            agreement += sum(
                1
                for o, q in zip(outs, other, strict=True)
                if o.ok and q.ok and values_equal(o.value, q.value, rel_tol, abs_tol)
            )
        scores.append(CandidateScore(index=i, passed=passed, valid=len(valid), agreement=agreement))
    return scores


def select_candidate(scores: Sequence[CandidateScore]) -> int:
    """Most valid tests passed wins; ties: most agreement with other candidates; then the lowest index."""
    if not scores:
        raise ValueError("no candidates to select from")
    return max(scores, key=lambda s: (s.passed, s.agreement, -s.index)).index


def parses(code: str) -> bool:
    """Whether ``code`` is valid Python (a candidate that is not cannot be chosen, whatever its votes)."""
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return bool(code.strip())


# --------------------------------------------------------------------------------------------------
# The plan: prompts, jobs, selection
# --------------------------------------------------------------------------------------------------


def distinct_candidates(candidates: Sequence[Sequence[str]]) -> list[list[str]]:
    """Per problem, its candidates without repeats (first occurrence order): each is tested once."""
    return [list(dict.fromkeys(cands)) for cands in candidates]


def suite_prompts(problems: Sequence[Problem], distinct: Sequence[Sequence[str]], k: int) -> list:
    """One white-box Test-LLM prompt per distinct candidate (§4.2), problem by problem."""
    return [test_messages(p, c, k) for p, cands in zip(problems, distinct, strict=True) for c in cands]


@dataclass(frozen=True)
class _ProblemVote:
    first: int
    """Index of the problem's first candidate job; its answer job follows its candidate jobs."""
    candidates: tuple[str, ...]
    calls: tuple[str, ...]
    answers: tuple[str, ...]
    tests: tuple[tuple[int, int], ...]


class SolvePlan:
    """The sandbox jobs of a collaboration batch and the selection read back from their outcomes."""

    def __init__(
        self,
        problems: Sequence[Problem],
        distinct: Sequence[Sequence[str]],
        texts: Sequence[str],
        parse_mode: ParseMode,
    ):
        self._jobs: list[Job] = []
        self._votes: list[_ProblemVote] = []
        pos = 0
        for problem, cands in zip(problems, distinct, strict=True):
            pairs: dict[tuple[str, str], None] = {}
            for text in texts[pos : pos + len(cands)]:
                for t in extract_tests(text, problem.entry_point, parse_mode).tests:
                    pairs[(t.call, t.answer)] = None
            pos += len(cands)
            calls = list(dict.fromkeys(c for c, _ in pairs))
            answers = list(dict.fromkeys(a for _, a in pairs))
            tests = tuple((calls.index(c), answers.index(a)) for c, a in pairs)
            first = len(self._jobs)
            self._jobs += [(candidate_program(problem, c), calls) for c in cands]
            self._jobs.append(("\n".join(problem.imports) or "pass", answers))
            self._votes.append(_ProblemVote(first, tuple(cands), tuple(calls), tuple(answers), tests))
        if pos != len(texts):
            raise ValueError(f"{len(texts)} test responses for {pos} distinct candidates")

    def jobs(self) -> list[Job]:
        """Every candidate's job (the distinct test calls), then the problem's answer job, per problem."""
        return list(self._jobs)

    def select(
        self, outcomes: Sequence[Sequence[CallOutcome]], rel_tol: float, abs_tol: float
    ) -> list[SolveResult]:
        """One :class:`SolveResult` per problem from the outcomes of :meth:`jobs` (in order)."""
        if len(outcomes) != len(self._jobs):
            raise ValueError(f"{len(outcomes)} results for {len(self._jobs)} solve jobs")
        return [self._select_one(v, outcomes, rel_tol, abs_tol) for v in self._votes]

    @staticmethod
    def _select_one(
        vote: _ProblemVote, outcomes: Sequence[Sequence[CallOutcome]], rel_tol: float, abs_tol: float
    ) -> SolveResult:
        n = len(vote.candidates)
        call_outs, answer_outs = outcomes[vote.first : vote.first + n], outcomes[vote.first + n]
        votes = score_candidates(call_outs, answer_outs, vote.tests, rel_tol, abs_tol)
        valid = [v for v in votes if parses(vote.candidates[v.index])]  # never choose non-Python code
        if not valid:
            return SolveResult("", -1, vote.candidates, (), tuple(votes))
        best = select_candidate(valid)
        rows = []
        for c, a in vote.tests:
            if answer_outs[a].ok:
                got = call_outs[best][c]
                passed = got.ok and values_equal(got.value, answer_outs[a].value, rel_tol, abs_tol)
                rows.append((vote.calls[c], vote.answers[a], passed))
        return SolveResult(vote.candidates[best], best, vote.candidates, tuple(rows), tuple(votes))


def plan_solve(
    problems: Sequence[Problem],
    distinct: Sequence[Sequence[str]],
    texts: Sequence[str],
    parse_mode: ParseMode,
) -> SolvePlan:
    """Plan a collaboration batch: ``texts`` are the suites of :func:`suite_prompts`, in that order."""
    return SolvePlan(problems, distinct, texts, parse_mode)


# --------------------------------------------------------------------------------------------------
# A benchmark of chosen candidates
# --------------------------------------------------------------------------------------------------


def benchmark_jobs(problems: Sequence[Problem], chosen: Sequence[SolveResult]) -> list[Job]:
    """Every distinct candidate of every problem on the benchmark's calls (EvalPlus verdicts follow)."""
    return [
        (candidate_program(p, c), benchmark_calls(p))
        for p, r in zip(problems, chosen, strict=True)
        for c in r.candidates
    ]


def solve_metrics(
    bench: str,
    problems: Sequence[Problem],
    codes: Sequence[Sequence[str]],
    chosen: Sequence[SolveResult],
    outcomes: Sequence[Sequence[CallOutcome]],
    rel_tol: float,
    abs_tol: float,
) -> dict[str, float]:
    """Pass rate (percent) of the chosen candidates, next to the candidates' mean and best-of-N.

    ``codes[i]`` are problem i's samples (with repeats, for the mean); ``outcomes`` those of
    :func:`benchmark_jobs`.
    """
    chosen_ok, base_ok, mean_ok, any_ok, pos = [], [], [], [], 0
    for i, (p, r) in enumerate(zip(problems, chosen, strict=True)):
        verdicts = [judge_sample(p, res, rel_tol, abs_tol) for res in outcomes[pos : pos + len(r.candidates)]]
        pos += len(r.candidates)
        by_code = dict(zip(r.candidates, verdicts, strict=True))
        per_sample = [by_code[c].plus for c in codes[i]]
        chosen_ok.append(r.chosen >= 0 and verdicts[r.chosen].plus)  # -1: no candidate parsed
        base_ok.append(r.chosen >= 0 and verdicts[r.chosen].base)
        mean_ok.append(sum(per_sample) / len(per_sample) if per_sample else 0.0)
        any_ok.append(any(v.plus for v in verdicts))
    n = max(len(problems), 1)
    prefix = f"solve/{bench}"
    return {
        f"{prefix}/pass@1": 100.0 * sum(chosen_ok) / n,
        f"{prefix}/base/pass@1": 100.0 * sum(base_ok) / n,
        f"{prefix}/candidates/pass@1": 100.0 * sum(mean_ok) / n,
        f"{prefix}/candidates/best_of_n": 100.0 * sum(any_ok) / n,
    }
