"""Rewards of both roles as pure functions of an :class:`OutcomeMatrix` (docs/method.md §7).

What it does: :func:`score_problem` computes the code reward R_code(m) (§7.2), the test reward
R_test(m, n) (§7.3) with gating on valid(m) and the non-printable penalty, infra masks (D4) and
per-problem metrics; :func:`golden_scores` is the Golden-Tests reward (§7.4);
:func:`aggregate_metrics` averages per-problem metrics over a step.

What it does not do: run code, build advantages (``codea1_core.method.grpo``) or update the Mistake Book.
Self-Play (D10) uses :func:`score_problem` unchanged; only its prompts differ.

Switches (``RewardConfig``, D7): ``adv_mode`` ``official`` (fail_new over the first K valid tests / K)
or ``per_suite`` (/ V, the paper figure); ``validity_mode`` ``official`` (clip(min(V/K, 1 − I/K), 0, 1))
or ``fraction`` (V / (V + I), the figure's "Valid"); ``nonprintable_penalty`` (official: on).

Masked samples (infra errors) get reward 0.0 and mask False: callers must drop them from advantages.
Rewards are float64 here (the official code rounds to bfloat16 first, quirk 14).

How to run: ``tests/core/method/test_rewards.py`` (reproduces the §7.5 worked example and the §17 quirk-11 case).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from codea1_core.config import RewardConfig
from codea1_core.types import GoldenOutcome, OutcomeMatrix, SuiteOutcome

NAN = float("nan")
"""Marks an undefined per-problem metric; :func:`_defined` drops such keys before they leave this module."""


@dataclass(frozen=True)
class ProblemScores:
    """Rewards, masks and metrics of one problem. Masked entries (False) are infra failures, never scored."""

    problem_id: str
    code_rewards: list[float]
    """R_code(m), [M]."""
    test_rewards: list[list[float]]
    """R_test(m, n), [M][N] (empty rows for the Golden-Tests baseline)."""
    code_mask: list[bool]
    """True = scored; False = masked by an infra failure (D4)."""
    test_mask: list[list[bool]]
    """[M][N], same meaning as ``code_mask``."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Per-problem means over the scored samples; a key is absent where it is undefined (e.g. no replay)."""


@dataclass(frozen=True)
class PairTerms:
    """The §7.1/§7.3 quantities of one (code m, suite n) pair."""

    pass_new: float
    pass_hist: float
    fail_new: float
    fail_hist: float
    code_score: float  # r_A(m, n)
    val: float
    adv: float
    test_reward: float


def _clip01(x: float) -> float:
    return min(1.0, max(0.0, x))


def validity(v: int, i: int, cfg: RewardConfig) -> float:
    """val (§7.3, D7): official clip(min(V/K, 1 − I/K), 0, 1), or fraction V/(V+I) (0 when V+I = 0)."""
    if cfg.validity_mode == "fraction":
        return v / (v + i) if v + i else 0.0
    return _clip01(min(v / cfg.k, 1.0 - i / cfg.k))


def pair_terms(suite: SuiteOutcome, h: int, h_pass: int, code_valid: bool, cfg: RewardConfig) -> PairTerms:
    """r_A(m, n) and R_test(m, n) of one pair (§7.1-§7.3, D7).

    Args:
        suite: the suite outcome (V, I, failure flags, np).
        h: H, number of replayed tests.
        h_pass: How many of them code m passed.
        code_valid: valid(m) — gates the test reward (§7.3 "Gating").
        cfg: the reward section of the config.
    """
    v, fails = suite.valid, suite.fails
    pass_new = (v - sum(fails)) / v if v else 0.0  # all valid tests (quirk 6)
    pass_hist = h_pass / h if h else 0.0
    fail_hist = (h - h_pass) / h if h else 0.0
    if cfg.adv_mode == "per_suite":  # the paper figure's reading (§7.5, §18.1 item 1)
        fail_new = sum(fails) / v if v else 0.0
    else:  # official: failures among the first K valid tests over the fixed K
        fail_new = sum(fails[: cfg.k]) / cfg.k
    # §7.2: r_A
    if h and v:
        code_score = 0.5 * (pass_hist + pass_new)
    elif h:
        code_score = pass_hist
    else:
        code_score = pass_new  # 0 when V = 0 too (quirk 5)
    # §7.3: validity and adversarial terms, gated on valid(m), minus np
    val = validity(v, suite.invalid, cfg)
    if h and v:
        adv = (fail_new - fail_hist + 1.0) / 2.0
    elif v:
        adv = fail_new
    else:
        adv = 0.0
    penalty = suite.nonprintable if cfg.nonprintable_penalty else 0.0
    reward = -penalty + (cfg.alpha * val + (1.0 - cfg.alpha) * adv if code_valid else 0.0)
    return PairTerms(pass_new, pass_hist, fail_new, fail_hist, code_score, val, adv, reward)


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else NAN


def score_problem(matrix: OutcomeMatrix, reward_cfg: RewardConfig) -> ProblemScores:
    """Code and test rewards of one problem (§7.2, §7.3) with infra masks (D4) and metrics.

    R_code(m) = mean over n of r_A(m, n); R_test(m, n) = −np + valid(m)·(α·val + (1−α)·adv).
    A code masked by infra (or a masked problem) gets 0.0 and mask False on both sides.
    """
    cfg = reward_cfg
    if cfg.k < 1:
        raise ValueError(f"reward.k must be >= 1, got {cfg.k}")
    h = len(matrix.replay)
    code_rewards, test_rewards, code_mask, test_mask = [], [], [], []
    scored: list[tuple[int, PairTerms, SuiteOutcome]] = []
    for m, row in enumerate(matrix.suites):
        scored_m = not (matrix.problem_infra or matrix.code_infra[m])
        n_suites = len(row)
        code_mask.append(scored_m)
        test_mask.append([scored_m] * n_suites)
        if not scored_m:
            code_rewards.append(0.0)
            test_rewards.append([0.0] * n_suites)
            continue
        h_pass = sum(matrix.replay_passed[m]) if h else 0
        terms = [pair_terms(s, h, h_pass, matrix.code_valid[m], cfg) for s in row]
        scored.extend((m, t, s) for t, s in zip(terms, row, strict=True))
        code_rewards.append(_mean([t.code_score for t in terms]) if terms else 0.0)
        test_rewards.append([t.test_reward for t in terms])
    metrics = _problem_metrics(matrix, code_rewards, code_mask, scored)
    return ProblemScores(matrix.problem_id, code_rewards, test_rewards, code_mask, test_mask, metrics)


def _problem_metrics(
    matrix: OutcomeMatrix,
    code_rewards: list[float],
    code_mask: list[bool],
    scored: list[tuple[int, PairTerms, SuiteOutcome]],
) -> dict[str, float]:
    """Per-problem means over scored samples (undefined ones omitted); see :func:`aggregate_metrics`."""
    codes = [m for m, ok in enumerate(code_mask) if ok]
    valid_codes = [m for m in codes if matrix.code_valid[m]]
    valid_pairs = [(t, s) for m, t, s in scored if matrix.code_valid[m]]
    h = len(matrix.replay)
    return _defined(
        {
            "problem/masked": float(matrix.problem_infra),
            "code/masked_frac": 1.0 - len(codes) / len(code_mask) if code_mask else NAN,
            "code/reward_mean": _mean([code_rewards[m] for m in codes]),
            "code/valid_rate": _mean([float(matrix.code_valid[m]) for m in codes]),
            "code/pass_new": _mean([t.pass_new for t, s in valid_pairs if s.valid]),
            "code/pass_hist": _mean([sum(matrix.replay_passed[m]) / h for m in valid_codes]) if h else NAN,
            "test/reward_mean": _mean([t.test_reward for _, t, _ in scored]),
            "test/validity": _mean([t.val for _, t, _ in scored]),
            "test/adv": _mean([t.adv for t, _ in valid_pairs]),
            "test/valid_tests_mean": _mean([float(s.valid) for _, _, s in scored]),
            "test/invalid_mean": _mean([float(s.invalid) for _, _, s in scored]),
            "test/attack_rate": _mean([float(any(s.fails)) for _, s in valid_pairs]),
            "test/nonprintable": _mean([s.nonprintable for _, _, s in scored]),
        }
    )


def _defined(metrics: dict[str, float]) -> dict[str, float]:
    """Drop undefined (NaN) metrics, so step means average over the problems that define them."""
    return {k: v for k, v in metrics.items() if not math.isnan(v)}


def golden_scores(golden: GoldenOutcome) -> ProblemScores:
    """Golden-Tests baseline (§7.4): R_code(m) = pass rate on the golden tests if valid(m), else 0.

    A problem without golden tests, and any infra-failed code, is masked (never a score, D4).
    """
    n_tests = len(golden.tests)
    code_rewards, code_mask = [], []
    for m, flags in enumerate(golden.passed):
        scored = n_tests > 0 and not golden.code_infra[m]
        code_mask.append(scored)
        code_rewards.append(sum(flags) / n_tests if scored and golden.code_valid[m] else 0.0)
    codes = [m for m, ok in enumerate(code_mask) if ok]
    metrics = _defined(
        {
            "problem/masked": float(not codes),
            "code/masked_frac": 1.0 - len(codes) / len(code_mask) if code_mask else NAN,
            "code/reward_mean": _mean([code_rewards[m] for m in codes]),
            "code/valid_rate": _mean([float(golden.code_valid[m]) for m in codes]),
            "code/pass_golden": _mean([code_rewards[m] for m in codes if golden.code_valid[m]]),
        }
    )
    return ProblemScores(
        golden.problem_id,
        code_rewards,
        [[] for _ in code_rewards],
        code_mask,
        [[] for _ in code_rewards],
        metrics,
    )


def aggregate_metrics(scores: Sequence[ProblemScores]) -> dict[str, float]:
    """Step-level metrics: the mean of each metric over the problems that define it, plus ``problem/count``.

    Problems weigh equally; a metric no problem defines is absent.
    """
    keys = sorted({k for s in scores for k in s.metrics})
    out = {"problem/count": float(len(scores))}
    for key in keys:
        out[key] = _mean([s.metrics[key] for s in scores if key in s.metrics])
    return out
