"""``bench/overlap_bench.py`` cannot rot: two iterations of a tiny run, serial against overlapped, through the real
step (a tiny model, the lab's problems, the real sandbox), each test-rollout prompt its own chunk."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import overlap_bench  # noqa: E402

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the process sandbox is Linux-only"
)


@pytest.mark.e2e
def test_both_runs_train_the_same_and_the_overlap_is_measured(
    prefect_harness, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = {
        "model.code_path": tiny_model_dir,
        "model.test_path": tiny_model_dir,
        "data.train_batch_size": 2,
        "data.prepared_dir": tmp_path / "no_prepared",
        "model.lora_rank": 4,
        "model.lora_alpha": 8,
        "rollout.n_code": 2,
        "rollout.n_tests": 2,
        "rollout.max_new_tokens_code": 16,
        "rollout.max_new_tokens_test": 16,
        "rollout.batch_size": 1,
        "grpo.mini_batches": 1,
        "lab.train_per_family": 1,
        "lab.heldout_per_family": 1,
    }
    argv = ["--iterations", "2", *(f"{k}={v}" for k, v in overrides.items())]
    assert overlap_bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "rollout.batch_size=1: 4 test-rollout chunk(s) per step" in out
    assert "every non-timing value of 2 iterations equal in both runs" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert len(rows) == 2 and all(len(r) == 8 for r in rows)
    assert all(float(r[6]) >= 0 for r in rows)  # the overlap column


def test_a_difference_between_the_runs_is_named() -> None:
    assert (
        overlap_bench._same({"code/reward_mean": 0.5, "time/iteration_s": 1.0}, {"code/reward_mean": 0.5})
        == []
    )
    assert overlap_bench._same({"code/reward_mean": float("nan")}, {"code/reward_mean": float("nan")}) == []
    assert overlap_bench._same({"code/reward_mean": 0.5}, {"code/reward_mean": 0.25}) == ["code/reward_mean"]
