"""Rewards (docs/method.md §7, D4, D7) on hand-built outcome matrices: worked examples and edge cases."""

from __future__ import annotations

import pytest

from codea1_core.config import RewardConfig
from codea1_core.method.rewards import aggregate_metrics, golden_scores, pair_terms, score_problem
from codea1_core.types import GoldenOutcome, OutcomeMatrix, SuiteOutcome, TestCase

OFFICIAL = RewardConfig()
FIGURE = RewardConfig(adv_mode="per_suite", validity_mode="fraction")


def so(fails: str, invalid: int = 0, nonprintable: float = 0.0) -> SuiteOutcome:
    """A suite from a failure string: '.' = pass, 'F' = fail (one valid test per character)."""
    tests = tuple(TestCase(f"f({i})", i) for i in range(len(fails)))
    return SuiteOutcome(tests, tuple(c == "F" for c in fails), invalid, ("x",) * invalid, nonprintable)


def matrix(rows, *, valid=None, infra=None, replay=0, replay_pass=None, problem_infra=False) -> OutcomeMatrix:
    m = len(rows)
    replay_tests = tuple(TestCase(f"f({100 + i})", i) for i in range(replay))
    return OutcomeMatrix(
        problem_id="p",
        code_valid=tuple(valid if valid is not None else [True] * m),
        code_infra=tuple(infra if infra is not None else [False] * m),
        problem_infra=problem_infra,
        suites=tuple(tuple(r) for r in rows),
        replay=replay_tests,
        replay_passed=tuple(tuple(p) for p in (replay_pass or [[False] * replay] * m)),
    )


# The §7.5 figure: three suites; the code fails 1 of 2 replayed tests (fail_hist = 0.5).
# Row 2 has 2 valid tests, no failure, and one invalid test.
FIGURE_ROWS = [[so(".F."), so("..", invalid=1), so("FF.")]]


def test_section_7_5_official_column():
    scores = score_problem(matrix(FIGURE_ROWS, replay=2, replay_pass=[[True, False]]), OFFICIAL)
    assert scores.test_rewards[0] == pytest.approx([0.34375, 0.25, 0.375])
    terms = [pair_terms(s, 2, 1, True, OFFICIAL) for s in FIGURE_ROWS[0]]
    assert [t.val for t in terms] == pytest.approx([0.375, 0.25, 0.375])
    assert [t.adv for t in terms] == pytest.approx([0.3125, 0.25, 0.375])
    assert scores.code_rewards == pytest.approx([0.5 * (0.5 + (2 / 3 + 1 + 1 / 3) / 3)])
    assert scores.code_rewards[0] == pytest.approx(0.583, abs=5e-4)


def test_section_7_5_figure_rows_under_per_suite_and_fraction():
    """Rows 1 and 3 reproduce the figure (0.708 / 0.792). Row 2 is 0.458, not the figure's 0.333:
    the formula gives adv = (0 − 0.5 + 1)/2 = 0.25 there, as §7.5 notes; validity 2/3 matches."""
    scores = score_problem(matrix(FIGURE_ROWS, replay=2, replay_pass=[[True, False]]), FIGURE)
    terms = [pair_terms(s, 2, 1, True, FIGURE) for s in FIGURE_ROWS[0]]
    assert [t.val for t in terms] == pytest.approx([1.0, 2 / 3, 1.0])
    assert [t.adv for t in terms] == pytest.approx([5 / 12, 0.25, 7 / 12])
    assert scores.test_rewards[0][0] == pytest.approx(0.708, abs=5e-4)
    assert scores.test_rewards[0][2] == pytest.approx(0.792, abs=5e-4)
    assert scores.test_rewards[0][1] == pytest.approx(0.5 * 2 / 3 + 0.5 * 0.25)
    assert scores.code_rewards[0] == pytest.approx(0.583, abs=5e-4)  # the same under either reading


def test_quirk_11_case_under_our_outcomes():
    """§17 quirk 11 gives r_A = 0.25 and R_test = 0.3125 because the official code misaligns expected
    values (reported pass, pass, FAIL, fail). With D1 our outcome is pass, pass, pass, fail
    (tests/core/method/test_outcomes.py::test_quirk_11_worked_case_has_no_misalignment), V = 4, I = 2, one failing
    replay, so: r_A = ½·(0 + 3/4) = 0.375; val = min(4/8, 1 − 2/8) = 0.5; adv = (1/8 − 1 + 1)/2 = 0.0625;
    R_test = ½·0.5 + ½·0.0625 = 0.28125. The official misaligned flags (..FF) reproduce 0.25 / 0.3125."""
    ours = score_problem(matrix([[so("...F", invalid=2)]], replay=1), OFFICIAL)
    assert ours.code_rewards == pytest.approx([0.375])
    assert ours.test_rewards == [pytest.approx([0.28125])]
    official = score_problem(matrix([[so("..FF", invalid=2)]], replay=1), OFFICIAL)
    assert official.code_rewards == pytest.approx([0.25])
    assert official.test_rewards == [pytest.approx([0.3125])]


def test_official_fail_new_counts_only_the_first_k_tests_over_k():
    cfg = RewardConfig(k=4)
    t = pair_terms(so("...." + "FFFF"), 0, 0, True, cfg)  # failures beyond the first K are ignored
    assert (t.fail_new, t.adv, t.pass_new) == (0.0, 0.0, 0.5)
    t = pair_terms(so("F..." + "FF"), 0, 0, True, cfg)
    assert t.fail_new == 0.25 and t.val == 1.0  # min(6/4, 1) clipped to 1
    per_suite = pair_terms(so("F..." + "FF"), 0, 0, True, RewardConfig(k=4, adv_mode="per_suite"))
    assert per_suite.fail_new == 0.5


def test_validity_modes_clip_and_fraction():
    assert pair_terms(so(""), 0, 0, True, OFFICIAL).val == 0.0
    assert pair_terms(so("...", invalid=9), 0, 0, True, OFFICIAL).val == 0.0  # 1 − 9/8 < 0 → clipped
    assert pair_terms(so(""), 0, 0, True, FIGURE).val == 0.0  # V + I = 0
    assert pair_terms(so("", invalid=3), 0, 0, True, FIGURE).val == 0.0
    assert pair_terms(so("..", invalid=2), 0, 0, True, FIGURE).val == 0.5


def test_no_valid_tests():
    """Quirk 5: V = 0 and H = 0 gives the code 0; with replay the code gets pass_hist and adv = 0."""
    no_replay = score_problem(matrix([[so(""), so("..")]]), OFFICIAL)
    assert no_replay.code_rewards == [0.5]  # mean(0, 1)
    assert no_replay.test_rewards[0] == pytest.approx([0.0, 0.5 * 2 / 8])
    with_replay = score_problem(matrix([[so("")]], replay=2, replay_pass=[[True, False]]), OFFICIAL)
    assert with_replay.code_rewards == [0.5] and with_replay.test_rewards == [[0.0]]


def test_invalid_code_gates_the_test_reward_but_not_the_penalty():
    rows = [[so("FF", nonprintable=0.1), so("FF")]] * 2
    scores = score_problem(matrix(rows, valid=[False, True]), OFFICIAL)
    assert scores.code_rewards == [0.0, 0.0]
    assert scores.test_rewards[0] == pytest.approx([-0.1, 0.0])
    assert scores.test_rewards[1] == pytest.approx([-0.1 + 0.5 * 0.25 + 0.5 * 0.25, 0.25])
    no_penalty = score_problem(matrix(rows, valid=[False, True]), RewardConfig(nonprintable_penalty=False))
    assert no_penalty.test_rewards[0] == [0.0, 0.0]
    assert scores.metrics["code/valid_rate"] == 0.5
    assert scores.metrics["test/attack_rate"] == 1.0  # only the valid code's pairs count


def test_all_codes_invalid():
    scores = score_problem(matrix([[so("F")], [so("F")]], valid=[False, False]), OFFICIAL)
    assert scores.code_rewards == [0.0, 0.0] and scores.test_rewards == [[0.0], [0.0]]
    assert all(scores.code_mask) and scores.metrics["code/valid_rate"] == 0.0
    assert "test/adv" not in scores.metrics  # undefined without a valid code


def test_infra_errors_are_masked_never_scored():
    rows = [[so("F"), so(".")], [so("FF"), so("F.")]]
    scores = score_problem(matrix(rows, valid=[True, False], infra=[False, True]), OFFICIAL)
    assert scores.code_mask == [True, False]
    assert scores.test_mask == [[True, True], [False, False]]
    assert scores.code_rewards[1] == 0.0 and scores.test_rewards[1] == [0.0, 0.0]
    assert scores.metrics["code/masked_frac"] == 0.5 and scores.metrics["code/valid_rate"] == 1.0
    whole = score_problem(matrix(rows, problem_infra=True), OFFICIAL)
    assert whole.code_mask == [False, False] and whole.test_mask == [[False, False]] * 2
    assert whole.metrics["problem/masked"] == 1.0 and "code/reward_mean" not in whole.metrics


def test_zero_variance_groups_get_identical_rewards():
    scores = score_problem(matrix([[so(".."), so("..")]] * 3), OFFICIAL)
    assert len(set(scores.code_rewards)) == 1 and scores.code_rewards[0] == 1.0
    assert all(len(set(row)) == 1 for row in scores.test_rewards)


def test_alpha_extremes():
    s = [[so("F...", invalid=1)]]
    assert score_problem(matrix(s), RewardConfig(alpha=1.0)).test_rewards == [[0.5]]  # min(4/8, 7/8)
    assert score_problem(matrix(s), RewardConfig(alpha=0.0)).test_rewards == [[0.125]]  # 1/8


def test_metrics_and_aggregation():
    a = score_problem(matrix([[so("F."), so("..", invalid=2)]], replay=1, replay_pass=[[True]]), OFFICIAL)
    assert a.metrics["code/pass_new"] == pytest.approx(0.75)
    assert a.metrics["code/pass_hist"] == 1.0
    assert a.metrics["test/valid_tests_mean"] == 2.0 and a.metrics["test/invalid_mean"] == 1.0
    assert a.metrics["test/attack_rate"] == 0.5
    b = score_problem(matrix([[so("")]]), OFFICIAL)
    assert "code/pass_hist" not in b.metrics and "code/pass_new" not in b.metrics
    agg = aggregate_metrics([a, b])
    assert agg["problem/count"] == 2.0
    assert agg["code/pass_hist"] == 1.0  # NaN skipped
    assert agg["test/valid_tests_mean"] == pytest.approx(1.0)


def test_golden_scores():
    golden = GoldenOutcome(
        problem_id="g",
        tests=(TestCase("f(1)", 2), TestCase("f(2)", 3)),
        code_valid=(True, True, False, False),
        code_infra=(False, False, False, True),
        passed=((True, True), (True, False), (False, False), (False, False)),
    )
    scores = golden_scores(golden)
    assert scores.code_rewards == [1.0, 0.5, 0.0, 0.0]
    assert scores.code_mask == [True, True, True, False]
    assert scores.metrics["code/valid_rate"] == pytest.approx(2 / 3)
    assert scores.metrics["code/pass_golden"] == 0.75
    empty = golden_scores(GoldenOutcome("e", (), (True,), (False,), ((),)))
    assert empty.code_mask == [False] and empty.metrics["problem/masked"] == 1.0


def test_bad_k_is_rejected():
    with pytest.raises(ValueError, match="reward.k"):
        score_problem(matrix([[so(".")]]), RewardConfig(k=0))
