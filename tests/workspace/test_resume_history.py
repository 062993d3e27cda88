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


def test_wall_clock_values_stay_out_of_the_dvc_outputs(tmp_path: Path) -> None:
    """history.csv and metrics.json (DVC outputs) hold what the run decides; timings.csv the wall-clock values."""
    history = [
        {"iteration": 1, "code/reward_mean": 0.5, "time/iteration_s": 4.2, "grpo/code/seconds": 1.5},
        {"iteration": 2, "code/reward_mean": 0.75, "sandbox/calls_per_s": 900.0, "sandbox/timeouts": 1},
    ]
    assert resume.write_history(tmp_path, history) == history[-1]  # the console's row keeps them
    assert (tmp_path / "history.csv").read_text().splitlines() == [
        "iteration,code/reward_mean,sandbox/timeouts",
        "1,0.5,",
        "2,0.75,1",
    ]
    assert json.loads((tmp_path / "metrics.json").read_text()) == {
        "iteration": 2,
        "code/reward_mean": 0.75,
        "sandbox/timeouts": 1,
    }
    assert (tmp_path / "timings.csv").read_text().splitlines() == [
        "iteration,grpo/code/seconds,sandbox/calls_per_s,time/iteration_s",
        "1,1.5,,4.2",
        "2,,900.0,",
    ]


def test_a_resumed_history_gets_its_timings_back(tmp_path: Path) -> None:
    measured = [
        {"iteration": 1, "x": 1, "time/iteration_s": 4.0},
        {"iteration": 2, "x": 2, "time/score_s": 0.5},
    ]
    resume.write_timings(tmp_path, measured)
    checkpointed = [resume.without_timings(r) for r in measured] + [{"iteration": 3, "x": 3}]
    assert checkpointed[0] == {"iteration": 1, "x": 1}
    assert resume.with_timings(tmp_path, checkpointed) == measured + [{"iteration": 3, "x": 3}]
    assert resume.with_timings(tmp_path / "none", checkpointed) == checkpointed  # no file: as checkpointed
    (tmp_path / "timings.csv").write_text("iteration,time/score_s\n1,fast\n")  # hand-edited: ignored
    assert resume.with_timings(tmp_path, checkpointed[:1]) == checkpointed[:1]


def test_timing_keys() -> None:
    timings = [
        "time/iteration_s",
        "time/sync_code_s",
        "grpo/test/seconds",
        "sandbox/calls_per_s",
        "code/runtime_s",
    ]
    decided = ["sandbox/timeouts", "sandbox/timeout_rate", "code/reward_mean", "grpo/code/lr", "iteration"]
    assert all(resume.is_timing(k) for k in timings) and not any(resume.is_timing(k) for k in decided)
