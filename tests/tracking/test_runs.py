"""The training run's tracker: MLflow never logs a step twice (resume), a missing run is not a store error."""

from __future__ import annotations

import pytest

from codea1_core.config import Config
from tracking.runs import STEP_KEY, MlflowTracker, NullTracker


def test_null_tracker_skips_logged_steps() -> None:
    tr = NullTracker()
    assert tr.log_iteration(1, {"code/reward_mean": 0.5})
    assert not tr.log_iteration(1, {"code/reward_mean": 0.9})
    assert tr.metrics[1]["code/reward_mean"] == 0.5
    assert tr.logged_steps() == {1}


def test_mlflow_resume_never_duplicates_a_step(cfg: Config) -> None:
    """Regression guard: MLflow appends duplicate points, so a resumed run must skip logged steps."""
    first = MlflowTracker(cfg, run_name="t")
    assert first.log_iteration(1, {"code/reward_mean": 0.25, "test/validity": 0.5, "bad": float("nan")})
    assert first.log_iteration(2, {"code/reward_mean": 0.5})
    again = MlflowTracker(cfg, run_id=first.run_id)
    assert again.run_id == first.run_id
    assert again.logged_steps() == {1, 2}
    assert not again.log_iteration(2, {"code/reward_mean": 0.75})
    assert again.log_iteration(3, {"code/reward_mean": 1.0})
    hist = again.client.get_metric_history(first.run_id, "code/reward_mean")
    assert sorted((m.step, m.value) for m in hist) == [(1, 0.25), (2, 0.5), (3, 1.0)]
    assert [m.step for m in again.client.get_metric_history(first.run_id, STEP_KEY)] == [1, 2, 3]
    run = again.client.get_run(first.run_id)
    assert run.data.params["reward.alpha"] == "0.5"
    assert "git.commit" in run.data.tags
    again.end()
    assert again.client.get_run(first.run_id).info.status == "FINISHED"


def test_resume_of_a_missing_run_starts_a_new_one_but_a_store_error_is_not_missing(
    cfg: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only "not found" starts a new run on resume; a transient store error must not fork the training run
    (a second MLflow run would register every model again)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    first = MlflowTracker(cfg, run_name="t")
    fresh = MlflowTracker(cfg, run_id="0" * 32)  # an id the store never had: a new run
    assert fresh.run_id not in {first.run_id, "0" * 32}

    def locked(self, run_id):
        raise MlflowException("(sqlite3.OperationalError) database is locked", error_code="INTERNAL_ERROR")

    monkeypatch.setattr(MlflowClient, "get_run", locked)
    with pytest.raises(MlflowException, match="database is locked"):
        MlflowTracker(cfg, run_id=first.run_id)
    monkeypatch.undo()
    runs = first.client.search_runs([first.client.get_run(first.run_id).info.experiment_id])
    assert sorted(r.info.run_id for r in runs) == sorted([first.run_id, fresh.run_id])
