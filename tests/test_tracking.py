"""Tracking: the MLflow tracker never logs a step twice (resume), registers checkpoints, sets aliases."""

from __future__ import annotations

from pathlib import Path

import pytest

from codea1_core.config import Config
from tasks import tracking
from tasks.tracking import STEP_KEY, MlflowTracker, NullTracker


@pytest.fixture()
def cfg(mlflow_cfg: Config) -> Config:
    return mlflow_cfg


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


def test_log_iteration_task_logs_table_and_files(cfg: Config, tmp_path: Path) -> None:
    tr = MlflowTracker(cfg)
    book = tmp_path / "mistake_book.json"
    book.write_text('{"schema": "x"}')
    rows = [{"problem": "lab/a/0", "code": "def f(): pass", "code_reward": 0.5}]
    assert tracking.log_iteration.fn(tr, 1, {"code/reward_mean": 0.5}, rows, {"mistake_book": str(book)})
    assert not tracking.log_iteration.fn(tr, 1, {"code/reward_mean": 0.5}, rows, {"mistake_book": str(book)})
    names = {a.path for a in tr.client.list_artifacts(tr.run_id, "samples")}
    assert names == {"samples/it_000001.json"}
    assert [a.path for a in tr.client.list_artifacts(tr.run_id, "mistake_book")] == [
        "mistake_book/mistake_book.json"
    ]


def test_register_and_aliases(cfg: Config, tmp_path: Path) -> None:
    model = tmp_path / "export"
    model.mkdir()
    (model / "config.json").write_text("{}")
    tr = MlflowTracker(cfg)
    v1 = tr.register("code", model, 3)
    v2 = tr.register("code", model, 4)
    assert (v1, v2) == ("1", "2")
    assert tracking.latest_version(cfg, "codea1-code")["version"] == "2"
    assert tracking.alias_info(cfg, "codea1-code", "champion") is None
    tracking.set_alias(cfg, "codea1-code", "2", "champion", {"eval.metric": "0.4"})
    info = tracking.alias_info(cfg, "codea1-code", "champion")
    assert info["version"] == "2" and info["tags"]["eval.metric"] == "0.4"
    src = tr.client.get_model_version("codea1-code", "2").source
    assert src.endswith("checkpoints/code/it_000004")
