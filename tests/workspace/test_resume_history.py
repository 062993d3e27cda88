"""The history files derived from the checkpointed history: history.csv and metrics.json."""

from __future__ import annotations

import json
from pathlib import Path

from workspace import resume


def test_history_files(tmp_path: Path) -> None:
    from codea1_core.evaluation.comparison import parse_history

    history = [{"iteration": 1, "code/reward_mean": 0.5}, {"iteration": 2, "x": 1}]
    assert resume.write_history(tmp_path, history) == {"iteration": 2, "x": 1}
    lines = (tmp_path / "history.csv").read_text().splitlines()
    assert lines[0] == "iteration,code/reward_mean,x"
    assert lines[1:] == ["1,0.5,", "2,,1"]
    assert parse_history((tmp_path / "history.csv").read_text()) == history  # what the evaluate report reads
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"iteration": 2, "x": 1}
    assert resume.write_history(tmp_path / "none", []) == {"iteration": 0}
