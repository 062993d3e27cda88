"""SIGKILL of ``make run``'s runner leaves no stage behind.

Before: the runner forwarded Ctrl-C and SIGTERM to ``dvc repro``'s process group, but a runner killed outright
(SIGKILL, the OOM killer) could forward nothing: its warm-start stage lived on for 15 minutes and wrote into a
recreated workspace. Now :func:`flows.pipeline.run_child` starts a guard process that the kernel signals when the
runner dies, and the guard stops the group (SIGTERM, then SIGKILL after the stop timeout). Here the real
``run_child`` runs a process group of shell and ``sleep`` processes in a runner that is then SIGKILLed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

RUNNER = """
import sys
sys.path.insert(0, sys.argv[1])
from flows.pipeline import run_child
run_child(["sh", "-c", sys.argv[2]], stop_timeout_s=float(sys.argv[3]))
"""


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes whose process group is ``pgid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(entry.name))
    return out


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _start(repo_root: Path, script: str, stop_timeout_s: float, log: Path) -> tuple[subprocess.Popen, int]:
    """The runner and the process group it runs (the group's leader is the runner's ``sh`` child); stderr of
    both (and of the guard) goes to ``log`` (a pipe would stay open as long as the group lives)."""
    with log.open("w") as fh:
        runner = subprocess.Popen(
            [sys.executable, "-c", RUNNER, str(repo_root), script, str(stop_timeout_s)], stderr=fh
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for pid in _children(runner.pid):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd[0] == b"sh" and len(_group_members(pid)) >= 2 and len(_children(runner.pid)) == 2:
                return runner, pid  # the group is up, and so is the guard
        time.sleep(0.1)
    runner.kill()
    runner.wait()
    raise AssertionError(f"the runner did not start its group: {log.read_text()[-2000:]}")


def _wait_gone(pgid: int, within_s: float) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        left = _group_members(pgid)
        if not left:
            return []
        time.sleep(0.2)
    left = _group_members(pgid)
    for pid in left:  # leave nothing running on
        os.kill(pid, signal.SIGKILL)
    return left


@pytest.mark.e2e
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_sigkill_of_the_runner_stops_the_stage_group(repo_root: Path, tmp_path: Path) -> None:
    runner, pgid = _start(repo_root, "sleep 300 & sleep 300", 30, tmp_path / "log")
    runner.kill()
    runner.wait(timeout=30)
    left = _wait_gone(pgid, within_s=15)
    log = (tmp_path / "log").read_text()
    assert left == [], f"processes of the stage group outlived the runner: {left}\n{log[-2000:]}"
    assert "the pipeline process died; stopping its stage" in log, log[-2000:]


@pytest.mark.e2e
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_stage_that_ignores_sigterm_is_killed_after_the_stop_timeout(
    repo_root: Path, tmp_path: Path
) -> None:
    """A stage that does not stop on SIGTERM (stuck in a C call, or ignoring it) is SIGKILLed once the timeout
    passes — and not before: graceful stops keep their time to checkpoint."""
    runner, pgid = _start(repo_root, "trap '' TERM; sleep 300 & sleep 300", 3, tmp_path / "log")
    t0 = time.monotonic()
    runner.kill()
    runner.wait(timeout=30)
    time.sleep(1.0)
    assert _group_members(pgid), "the group was killed before its stop timeout"
    left = _wait_gone(pgid, within_s=20)
    assert left == [], f"a SIGTERM-ignoring group outlived its stop timeout: {left}"
    assert time.monotonic() - t0 >= 2.5


def test_prune_rwlock_removes_only_the_entries_of_dead_processes(tmp_path: Path) -> None:
    """Regression: a killed ``dvc`` left its entries in ``.dvc/tmp/rwlock`` (DVC warns about them next time)."""
    import json

    from flows.guard import prune_rwlock

    dead = subprocess.Popen(["true"])
    dead.wait()
    me = {"pid": os.getpid(), "cmd": "dvc repro"}
    gone = {"pid": dead.pid, "cmd": "dvc repro"}
    (tmp_path / ".dvc" / "tmp").mkdir(parents=True)
    rwlock = tmp_path / ".dvc" / "tmp" / "rwlock"
    rwlock.write_text(json.dumps({"write": {"a": gone, "b": me}, "read": {"c": [gone, me], "d": [gone]}}))
    assert prune_rwlock(tmp_path) == [dead.pid]
    assert json.loads(rwlock.read_text()) == {"write": {"b": me}, "read": {"c": [me]}}
    assert prune_rwlock(tmp_path) == [] and prune_rwlock(tmp_path / "nothing") == []


@pytest.mark.e2e
def test_the_guard_marks_the_runs_a_killed_stage_left_running_crashed(prefect_harness) -> None:
    """A stage killed after the stop timeout cannot end its runs: the guard sets those that started on its
    server's watch CRASHED (and their task runs) before it stops the server; older runs are left alone."""
    from prefect import flow, task
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL
    from prefect.states import Completed, Running

    from flows.guard import crash_orphans

    @flow(name="guard-orphan")
    def orphan() -> None:
        pass

    @task(name="guard-orphan-step")
    def step() -> None:
        pass

    with get_client(sync_client=True) as client:
        older = client.create_flow_run(orphan)
        client.set_flow_run_state(older.id, Running(), force=True)
        time.sleep(1.0)
        since = time.time()
        left = client.create_flow_run(orphan)
        client.set_flow_run_state(left.id, Running(), force=True)
        stuck = client.create_task_run(step, left.id, "step-0", state=Running())  # a task run of the orphan
        crashed = crash_orphans(str(PREFECT_API_URL.value()), since)
        assert crashed == [str(left.id)]
        assert client.read_flow_run(left.id).state.type.value == "CRASHED"
        assert client.read_task_run(stuck.id).state.type.value == "CRASHED"
        assert client.read_flow_run(older.id).state.type.value == "RUNNING"
        client.set_flow_run_state(older.id, Completed(), force=True)
    assert crash_orphans("http://127.0.0.1:9/api", since, timeout_s=1.0) == []  # no API: nothing, quietly
