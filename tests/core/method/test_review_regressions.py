"""Regression tests for the bugs found in the correctness review of the training numbers.

Each test's docstring names the bug it pins down; every test fails on the code before its fix.
Run: ``.venv/bin/python -m pytest tests/core/method/test_review_regressions.py -q``.
"""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

from codea1_core.config import Config, RewardConfig  # noqa: E402
from codea1_core.method.batches import build_group_batch, code_groups  # noqa: E402
from codea1_core.method.mistake_book import MistakeBook  # noqa: E402
from codea1_core.method.rewards import ProblemScores, score_problem  # noqa: E402
from codea1_core.types import OutcomeMatrix, SuiteOutcome, TestCase  # noqa: E402


def _matrix(pid: str = "p/0", infra_code_1: bool = False) -> OutcomeMatrix:
    """Two codes, one suite each, one replayed test; code 1 optionally masked by an infra error."""
    return OutcomeMatrix(
        problem_id=pid,
        code_valid=(True, not infra_code_1),
        code_infra=(False, infra_code_1),
        problem_infra=False,
        suites=(
            (
                SuiteOutcome(
                    (TestCase("f(1)", 2), TestCase("f('nan')", math.nan)), (False, True), 1, ("duplicate",)
                ),
            ),
            (SuiteOutcome((TestCase("f(1)", 2),), (not infra_code_1,), 0, (), 0.25),),
        ),
        replay=(TestCase("f(3)", frozenset({4})),),
        replay_passed=((True,), (False,)),
    )


def _masked_matrix() -> OutcomeMatrix:
    return OutcomeMatrix(
        problem_id="p/1",
        code_valid=(False, False),
        code_infra=(False, False),
        problem_infra=True,
        suites=((SuiteOutcome(),), (SuiteOutcome(nonprintable=0.5),)),
        replay_passed=((), ()),
        problem_error="infra_error on the reference job: boom",
    )


def test_outcome_parquet_rederives_the_rewards(tmp_path):
    """Bug: ``tasks/score.write_outcomes`` JSON-encoded every list column (``fails``, ``calls``,
    ``expected``, ``reasons``), so the per-iteration ``outcomes/it_N.parquet`` could not be read back by
    ``OutcomeMatrix.from_rows`` (it iterated the characters of ``"[false, true]"``) and no reward could be
    re-derived from it (docs/method.md §3 step 9: rewards are a pure function of the outcomes)."""
    pq = pytest.importorskip("pyarrow.parquet")
    from tasks.score import write_outcomes

    matrices = [_matrix(), _masked_matrix()]
    path = write_outcomes(tmp_path / "outcomes" / "it_000001.parquet", matrices)
    rows = pq.read_table(path).to_pylist()
    for original in matrices:
        rebuilt = OutcomeMatrix.from_rows([r for r in rows if r["problem_id"] == original.problem_id])
        assert score_problem(rebuilt, RewardConfig()) == score_problem(original, RewardConfig())
        assert rebuilt.replay == original.replay and rebuilt.problem_infra == original.problem_infra
    assert not list(tmp_path.joinpath("outcomes").glob(".*tmp*"))  # temp file replaced, not left behind


def test_replay_pass_rate_ignores_infra_masked_codes():
    """Bug: ``tasks/mistake_book.merge_mistake_book`` counted the replay flags of codes masked by a
    sandbox infrastructure error (D4) as failed replays, so ``mistake_book/replay_pass_rate`` dropped
    whenever the executor failed — an infrastructure failure turned into a score-like number."""
    from tasks.mistake_book import merge_mistake_book

    book = MistakeBook(top_k=8, max_per_problem=0)
    book.update("p/0", [TestCase("f(3)", frozenset({4}))] * 2, [], 0)
    metrics = merge_mistake_book.fn(book, [_matrix(infra_code_1=True)], 1)
    assert metrics["mistake_book/replay_pass_rate"] == 1.0  # code 0 passed; code 1 is masked, not failed
    metrics = merge_mistake_book.fn(book, [_matrix(infra_code_1=False)], 2)
    assert metrics["mistake_book/replay_pass_rate"] == 0.5  # a real failure still counts


def _comp(i: int) -> SimpleNamespace:
    return SimpleNamespace(prompt_ids=[1, 2, 3], token_ids=[4 + i, 5 + i][: 1 + i % 2])


def _group_batch():
    """Problem 0: rewards 0, 0.5, 1 (a spread group whose middle member has advantage exactly 0);
    problem 1: rewards 0.5 x 3 (a zero-variance group)."""
    scores = [
        ProblemScores("a", [0.0, 0.5, 1.0], [], [True] * 3, []),
        ProblemScores("b", [0.5, 0.5, 0.5], [], [True] * 3, []),
    ]
    comps = [[_comp(i) for i in range(3)], [_comp(i) for i in range(3, 6)]]
    return build_group_batch(code_groups(comps, scores), Config().grpo)


def test_zero_variance_flags_are_per_group_not_per_zero_advantage():
    """Bug: with ``grpo.skip_zero_variance_groups`` (D9), ``Policy.step`` skipped every sample whose
    advantage was exactly 0 — including the member of a spread group that sits at the group mean
    (rewards 0, 0.5, 1), which D9 keeps (it feeds the KL term and the token-mean denominator). The GRPO
    batch now carries which samples belong to a zero-variance GROUP, through ``update_code`` to the policy."""
    from tasks.update import update_code

    batch = _group_batch()
    assert batch.advantages[1] == 0.0 and batch.zero_variance_groups == 1
    assert batch.in_zero_variance_group == [False, False, False, True, True, True]
    assert batch.concat(batch).in_zero_variance_group == batch.in_zero_variance_group * 2
    seen = []

    class FakePolicy:
        def step(self, train_batch):
            seen.append(train_batch)
            return {}

    update_code.fn(FakePolicy(), batch, 1)
    assert seen[0].in_zero_variance_group == batch.in_zero_variance_group


def test_policy_step_skips_only_zero_variance_groups(tmp_path):
    """Bug (same as above, at the policy): the token count of a step with the D9 skip switch on must
    include the mean member of a spread group and exclude only the zero-variance group."""
    import torch

    from codea1_core.models.policy import Policy, TrainBatch
    from codea1_core.models.tiny_model import build_tiny_model

    torch.set_num_threads(1)
    corpus = ["def add(a, b):\n    return a + b\n", "assert add(1, 2) == 3\n"] * 10
    model_dir = build_tiny_model(tmp_path / "tiny", corpus, vocab_size=300, seed=0)
    cfg = Config().replace(**{"model.device": "cpu", "grpo.skip_zero_variance_groups": True})
    torch.manual_seed(0)
    pol = Policy(str(model_dir), cfg, role="code", total_steps=5)
    b = _group_batch()
    flags = b.in_zero_variance_group
    metrics = pol.step(TrainBatch(b.prompt_ids, b.completion_ids, b.advantages, None, flags))
    kept = sum(len(c) for c, z in zip(b.completion_ids, flags, strict=True) if not z)
    assert metrics["tokens"] == float(kept)  # 1 + 2 + 1 tokens: the mean member (advantage 0) is trained on
