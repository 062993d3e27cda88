"""One training run per workspace: a second run is refused in one line, a stale lock is taken over.

Before: two trainings in one workspace both ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from workspace.lock import LOCK_NAME, WorkspaceLock, WorkspaceLockedError

HOLD = (
    "import sys, time; from workspace.lock import WorkspaceLock; WorkspaceLock(sys.argv[1]).acquire(); "
    "print('held', flush=True); time.sleep(60)"
)


def test_a_second_run_in_the_same_workspace_is_refused_in_one_line(tmp_path, repo_root):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], cwd=repo_root, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(WorkspaceLockedError) as err:
            WorkspaceLock(tmp_path).acquire()
        assert (
            f"pid {holder.pid}" in str(err.value)
            and "started" in str(err.value)
            and "\n" not in str(err.value)
        )
    finally:
        holder.kill()
        holder.wait()
    with WorkspaceLock(tmp_path) as lock:  # the holder died without releasing: a stale lock is taken over
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    assert not lock.path.exists()


def test_a_lock_of_a_pid_reused_by_another_process_is_stale(tmp_path):
    path = tmp_path / LOCK_NAME
    import socket

    path.write_text(
        json.dumps({"pid": 1, "host": socket.gethostname(), "proc_start": "0", "started": "then"})
    )
    with WorkspaceLock(tmp_path):  # pid 1 is alive, but it is not the process that took the lock
        assert json.loads(path.read_text())["pid"] == os.getpid()


@pytest.mark.e2e
def test_the_train_stage_refuses_a_second_start_in_one_line_before_any_work(tmp_path, repo_root):
    params = tmp_path / "params.yaml"
    out = tmp_path / "train"
    params.write_text(
        f"orchestration:\n  checkpoint_dir: {out}\ntracking:\n  backend: 'null'\n"
        "rollout:\n  max_new_tokens_code: 96\n  max_new_tokens_test: 128\n"  # the lab's 1,024-token context
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out)], cwd=repo_root, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        second = subprocess.run(
            [sys.executable, "-m", "flows.train", "--params", str(params)],
            cwd=repo_root,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert time.monotonic() - t0 < 60
    finally:
        holder.kill()
        holder.wait()
    assert second.returncode == 2, second.stderr[-2000:]
    assert (
        second.stderr.strip().count("\n") == 0
        and "another training run holds this workspace" in second.stderr
    )
