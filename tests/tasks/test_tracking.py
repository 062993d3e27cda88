"""The log_iteration task: the sample table and the step's files are logged once per step."""

from __future__ import annotations

from pathlib import Path

import pytest

from codea1_core.config import Config
from tasks import tracking
from tracking.runs import MlflowTracker


@pytest.fixture()
def cfg(mlflow_cfg: Config) -> Config:
    return mlflow_cfg


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
