"""Evaluation metrics of both roles (docs/method.md §13): pass@k, avg@k, validity, attack rate, mut@k, Mul.

What: pure arithmetic over outcome flags and counts that the sandbox and the evaluation task produce.
Rates are fractions in [0, 1]; only :func:`mul` works in points (percent), as the paper reports it.
A rate over an empty population is ``nan`` (nothing was measured), never 0.

What not: it runs nothing — generating mutants is :mod:`codea1_core.evaluation.mutants`, executing them is the
sandbox's job; it does not log (the tracking task does).

How to run: ``python -c "from codea1_core.evaluation.metrics import pass_at_k; print(pass_at_k(32, 8, 8))"``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

NAN = float("nan")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem: 1 − C(n−c, k)/C(n, k) (§13.1; Chen et al., 2021).

    Uses the numerically stable product form 1 − Π_{i=n−c+1..n} (1 − k/i), which never forms the
    (huge) binomial coefficients.

    Args:
        n: Samples drawn for the problem (≥ 1).
        c: Correct samples among them (0 ≤ c ≤ n).
        k: The k of pass@k (1 ≤ k ≤ n).

    Raises:
        ValueError: Arguments out of range.
    """
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs n >= 1, 0 <= c <= n, 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """Mean of :func:`pass_at_k` over problems given as ``(n, c)`` pairs; ``nan`` for no problems."""
    if not counts:
        return NAN
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


def avg_at_k(per_sample_pass: Sequence[Sequence[bool]], k: int) -> float:
    """avg@k: mean pass rate of the first ``k`` samples of each problem, averaged over problems (§13.1).

    Args:
        per_sample_pass: One list of per-sample pass flags per problem, in sampling order.
        k: Samples taken per problem; every problem must have at least ``k``.

    Raises:
        ValueError: ``k < 1`` or a problem has fewer than ``k`` samples (names the row).
    """
    if k < 1:
        raise ValueError(f"avg_at_k needs k >= 1, got {k}")
    if not per_sample_pass:
        return NAN
    total = 0.0
    for row, flags in enumerate(per_sample_pass):
        if len(flags) < k:
            raise ValueError(f"avg_at_k: problem row {row} has {len(flags)} samples, fewer than k={k}")
        total += sum(bool(f) for f in flags[:k]) / k
    return total / len(per_sample_pass)


def validity_rate(valid_flags: Sequence[Sequence[bool]], tests_per_suite: int | None = None) -> float:
    """Share of generated tests that are valid (correct on the reference).

    With ``tests_per_suite`` (e.g. 5) this is UnLeakedTestBench's pass@5 (§13.2):
    Σ correct / (tests_per_suite · #suites), where only the first ``tests_per_suite`` tests of a suite
    count and missing tests count as incorrect. Without it, it is pooled valid / total tests.

    Args:
        valid_flags: One list of per-test validity flags per suite (one suite per function for ULT).
        tests_per_suite: Fixed per-suite denominator, or None for the pooled rate.
    """
    if tests_per_suite is not None:
        if tests_per_suite < 1:
            raise ValueError(f"tests_per_suite must be >= 1, got {tests_per_suite}")
        if not valid_flags:
            return NAN
        correct = sum(sum(bool(f) for f in flags[:tests_per_suite]) for flags in valid_flags)
        return correct / (tests_per_suite * len(valid_flags))
    total = sum(len(flags) for flags in valid_flags)
    return sum(sum(bool(f) for f in flags) for flags in valid_flags) / total if total else NAN


def attack_rate(fail_flags: Sequence[Sequence[bool]]) -> float:
    """Share of valid generated tests that make their candidate code fail, pooled over suites.

    Args:
        fail_flags: One list per (code, suite) with the fail flag of each valid test (g(m,n), §6.3).
            Infrastructure-failed calls must be left out by the caller (D4), not passed as failures.
    """
    total = sum(len(flags) for flags in fail_flags)
    return sum(sum(bool(f) for f in flags) for flags in fail_flags) / total if total else NAN


def mutation_score(killed: Sequence[bool | None]) -> float:
    """1 − surviving/completed for one function: killed / completed mutants; ``nan`` if none completed.

    ``None`` marks a mutant whose run did not complete (e.g. an infrastructure error); it is excluded.
    """
    done = [bool(k) for k in killed if k is not None]
    return sum(done) / len(done) if done else NAN


def mut_score(kill_matrix: Sequence[Sequence[bool | None]], suite_passes_reference: Sequence[bool]) -> float:
    """mut@k (§13.2): mean per-function mutation score over functions whose suite passes the reference.

    Args:
        kill_matrix: Per function, per mutant: True killed, False survived, None not completed.
        suite_passes_reference: Per function, whether its whole k-test suite passes on the unmutated
            reference (functions whose suite fails are left out, as in UnLeakedTestBench).

    Returns:
        A fraction in [0, 1]; ``nan`` when no function is kept. Functions with no completed mutant are
        left out as well (their score is undefined).

    Raises:
        ValueError: The two arguments have different lengths.
    """
    if len(kill_matrix) != len(suite_passes_reference):
        raise ValueError(
            f"mut_score: kill_matrix has {len(kill_matrix)} rows but suite_passes_reference has "
            f"{len(suite_passes_reference)}"
        )
    scores = [
        s
        for row, keep in zip(kill_matrix, suite_passes_reference, strict=True)
        if keep and not math.isnan(s := mutation_score(row))
    ]
    return sum(scores) / len(scores) if scores else NAN


def mul(pass5_pct: float, mut5_pct: float) -> float:
    """Mul = pass@5 × mut@5 / 100, inputs and result in points (§13.2; e.g. 27.05 × 26.41 / 100 = 7.14)."""
    return pass5_pct * mut5_pct / 100.0
