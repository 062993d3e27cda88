"""``tools/ui_check.py``: the pass/fail decisions on what the pages showed (always run), and one real check in
headless Chromium (e2e: skipped where no Chromium is installed, as in CI)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools import ui_check as uc

RUN = "train-codea1-seed1-alpha0.5"
HEADING = {"crumbs": RUN, "flow": "Flow train", "state": "Completed"}
LOGS = "Beginning flow run ... it 1/2  code_r .00 ... it 2/2  code_r .00 ... Finished in state Completed()"


def _rows(*names: str) -> list[dict]:
    """Task Runs rows as the page gives them."""
    return [{"name": n} for n in names]


ITERATION = ["rollout_code", "rollout_tests", "gate_tests", "execute", "score", "checkpoint", "log_iteration"]


def test_flow_run_page_passes_on_the_run_its_flow_and_state() -> None:
    checks = uc.check_flow_run_page(HEADING, LOGS, RUN, 2)
    assert [c.ok for c in checks] == [True, True]


@pytest.mark.parametrize(
    "heading",
    [
        {**HEADING, "state": "Failed"},
        {**HEADING, "flow": "Flow evaluate"},
        {**HEADING, "crumbs": "train-codea1-seed2-alpha0.5"},
        {},  # the heading did not render
    ],
)
def test_flow_run_page_fails_on_another_state_flow_or_run(heading: dict[str, str]) -> None:
    page, _ = uc.check_flow_run_page(heading, LOGS, RUN, 2)
    assert not page.ok and "expected" in page.detail


def test_flow_run_page_needs_the_first_and_last_iteration_line() -> None:
    _, lines = uc.check_flow_run_page(HEADING, "it 1/3  code_r .00", RUN, 3)
    assert (
        not lines.ok and "it 3/3" not in lines.detail.split(" of ")[0] and "the API has them" in lines.detail
    )
    _, lines = uc.check_flow_run_page(HEADING, "", RUN, 3, in_api=False)
    assert not lines.ok and "not in the API's logs either" in lines.detail


def test_an_iteration_line_is_whole_words() -> None:
    assert uc.shows_line("Info it 1/2  code_r .00", "it 1/2")
    assert uc.shows_line("it 2/2", "it 2/2")
    assert not uc.shows_line("it 1/20  code_r .00", "it 1/2")
    assert not uc.shows_line("split 1/2", "it 1/2")
    assert uc.iteration_lines(1) == ["it 1/1"] and uc.iteration_lines(95) == ["it 1/95", "it 95/95"]


def test_task_runs_named_by_iteration_pass() -> None:
    rows = _rows(*(f"{t}[it={i}]" for i in (1, 2) for t in ITERATION))
    [named] = uc.check_task_runs(rows, total=14)
    assert named.ok and "14 rows listed of 14" in named.detail


def test_a_task_run_not_named_by_its_iteration_fails() -> None:
    [named] = uc.check_task_runs(_rows("rollout_code[it=1]", "rollout_code-0"), total=2)
    assert not named.ok and "rollout_code-0" in named.detail


def test_no_task_run_listed_fails() -> None:
    [named] = uc.check_task_runs([], total=None)
    assert not named.ok and named.detail == "no task run listed"


def test_the_iteration_search_does_not_match_a_longer_number() -> None:
    search = uc.iteration_search(1)
    assert search == "[it=1]" and search in "score[it=1]" and search not in "score[it=10]"


def test_filtered_list_is_one_whole_iteration() -> None:
    assert uc.check_filtered([f"{t}[it=1]" for t in ITERATION], 1).ok
    mixed = uc.check_filtered([*(f"{t}[it=1]" for t in ITERATION), "score[it=2]"], 1)
    assert not mixed.ok and "score[it=2]" in mixed.detail
    partial = uc.check_filtered(["rollout_code[it=1]", "score[it=1]"], 1)
    assert not partial.ok and "checkpoint[it=1]" in partial.detail
    assert not uc.check_filtered([], 1).ok


def test_mlflow_page_needs_experiment_run_and_rewards() -> None:
    body = f"codea1 Runs {RUN} Overview ... Metrics (63) code/reward_mean 0 test/reward_mean -0.14"
    metrics = ("code/reward_mean", "test/reward_mean")
    assert all(c.ok for c in uc.check_mlflow_page(body, "codea1", RUN, metrics))
    named, rewards = uc.check_mlflow_page(body.replace("test/reward_mean", ""), "other", RUN, metrics)
    assert not named.ok and not rewards.ok


def test_the_flow_run_is_the_latest_train_run_started_before_the_mlflow_run_ended() -> None:
    """Not by name: ``train-codea1-seed1-alpha0.5-grpo.lr=1e-6`` (an override) finishes the MLflow run
    ``train-codea1-seed1-alpha0.5``."""
    body = uc.flow_run_filter(1796505344501)
    assert body["flows"] == {"name": {"any_": ["train"]}} and "name" not in body.get("flow_runs", {})
    assert body["flow_runs"]["start_time"] == {"before_": "2026-12-05T21:15:44.501000+00:00"}
    assert body["sort"] == "START_TIME_DESC" and body["limit"] == 1
    assert "flow_runs" not in uc.flow_run_filter(None)  # still running: the latest train flow run


def test_task_run_total_reads_the_tab_count() -> None:
    assert uc.task_run_total("Logs Task Runs 20 Task runs (20 completed) Search") == 20
    assert uc.task_run_total("1 Task run") == 1
    assert uc.task_run_total("Logs") is None


def test_report_has_a_line_per_item_and_the_count() -> None:
    text = uc.report([uc.Check("a", True, "seen"), uc.Check("longer item", False, "not seen")])
    lines = text.splitlines()
    assert lines[0].startswith("PASS  a ") and lines[1].startswith("FAIL  longer item  not seen")
    assert lines[-1] == "1 of 2 items pass"


def _executable(folder: Path, name: str) -> Path:
    path = folder / name
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_find_chromium_looks_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert uc.find_chromium() is None
    shell = _executable(tmp_path, "chromium-headless-shell")
    assert uc.find_chromium() == str(shell)
    assert uc.find_chromium(str(_executable(tmp_path, "my-chrome"))) == str(tmp_path / "my-chrome")
    assert uc.find_chromium("absent-browser") is None


def test_without_chromium_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing is started (no server, no training) when there is no browser to look with."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert uc.main(["--out", str(tmp_path / "shots")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no Chromium") and "--chromium" in err[0]
    assert not (tmp_path / "shots").exists()


def test_urls_go_together(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        uc.main(["--prefect-url", "http://127.0.0.1:4200"])
    assert exc.value.code == 2 and "--mlflow-url" in capsys.readouterr().err


def test_existing_servers_without_a_finished_run_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    browser = _executable(tmp_path, "chromium")
    urls = ["--prefect-url", "http://127.0.0.1:9", "--mlflow-url", "http://127.0.0.1:9"]
    args = [*urls, "--chromium", str(browser), "--workspace", str(tmp_path / "train")]
    assert uc.main([*args, "--out", str(tmp_path / "shots")]) == 2
    err = capsys.readouterr().err.strip()
    assert "DONE.json" in err and "make run" in err and "\n" not in err


@pytest.mark.e2e
@pytest.mark.timeout(900)
@pytest.mark.skipif(uc.find_chromium() is None, reason="no Chromium on PATH (apt-get install chromium)")
def test_ui_check_passes_on_a_real_run(tmp_path: Path, repo_root: Path) -> None:
    """Servers, a 2-step training run and four pages in headless Chromium: every item passes."""
    # the product's settings, not the suite's (conftest's PREFECT_LOGGING_LEVEL=WARNING drops the INFO lines)
    dropped = ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "PREFECT_LOGGING_LEVEL")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env |= {"PYTHONPATH": str(repo_root), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "shots"
    done = subprocess.run(
        [sys.executable, "-m", "tools.ui_check", "--out", str(out)],
        cwd=repo_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAIL" not in done.stdout and "6 of 6 items pass" in done.stdout
    shots = sorted(p.stem for p in out.glob("*.png"))
    assert shots == ["mlflow_run", "prefect_flow_run", "prefect_task_runs", "prefect_task_runs_it1"]
    assert all((out / f"{s}.png").stat().st_size > 10_000 for s in shots)


def test_the_workspace_run_is_the_one_recorded_for_the_finished_config(tmp_path: Path) -> None:
    from tracking.results import record_run_id

    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "DONE.json").write_text('{"iteration": 2, "fingerprint": "fp-a"}')
    with pytest.raises(uc.CannotCheck, match="no MLflow run recorded"):
        uc.workspace_run_id(tmp_path)
    record_run_id(tmp_path, "fp-b", "run-b")
    record_run_id(tmp_path, "fp-a", "run-a")
    assert uc.workspace_run_id(tmp_path) == "run-a"
