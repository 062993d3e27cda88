"""One training run per workspace: a second run is refused in one line, a stale lock is taken over, and
processes racing for the lock (a fresh one or a stale one) never both hold it.

Guards: two trainings in one workspace both ran; a lock file seen between its creation and its owner's write
was judged stale and removed under its holder.
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


RACE = """
import os, sys, time
from pathlib import Path
from workspace.lock import WorkspaceLock, WorkspaceLockedError
folder, n = Path(sys.argv[1]), int(sys.argv[2])
holds = doubles = 0
while holds < n:
    lock = WorkspaceLock(folder)
    try:
        lock.acquire()
    except WorkspaceLockedError:
        continue
    holds += 1
    try:
        os.mkdir(folder / "inside")  # exists: another process believes it holds the lock too
    except FileExistsError:
        doubles += 1
    else:
        os.rmdir(folder / "inside")
    lock.release()
print(holds, doubles)
"""


def test_processes_racing_for_the_lock_never_hold_it_together(tmp_path, repo_root):
    """4 processes x 1,000 acquires of one lock: zero double holds (an empty lock file, between its creation and
    its owner's write, was judged stale and removed: hundreds of double holds)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACE, str(tmp_path), "1000"],
            cwd=repo_root,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(4)
    ]
    counts = [tuple(map(int, p.communicate(timeout=300)[0].split())) for p in procs]
    assert [holds for holds, _ in counts] == [1000] * 4
    assert sum(doubles for _, doubles in counts) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no lock, no temporary file left


TAKE_OVER = """
import os, sys, time
from pathlib import Path
from workspace.lock import WorkspaceLock, WorkspaceLockedError
folder, rounds = Path(sys.argv[1]), int(sys.argv[2])
for r in range(rounds):
    while not (folder / f"go{r}").exists():
        time.sleep(0.001)
    try:
        lock = WorkspaceLock(folder / "ws").acquire()
    except WorkspaceLockedError:
        pass
    else:
        (folder / f"won{r}.{os.getpid()}").touch()
        while not (folder / f"release{r}").exists():  # held until every process has tried
            time.sleep(0.001)
        lock.release()
        continue
    (folder / f"done{r}.{os.getpid()}").touch()
"""


def test_processes_taking_over_one_stale_lock_never_both_win(tmp_path, repo_root):
    """A stale lock found by 4 processes at once, 15 times: exactly one takes it over each time (two removers
    of one stale lock: the second removed the first's fresh lock and took it too)."""
    import socket

    rounds, n = 15, 4
    (tmp_path / "ws").mkdir()
    stale = json.dumps({"pid": 1, "host": socket.gethostname(), "proc_start": "0", "started": "then"})
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TAKE_OVER, str(tmp_path), str(rounds)],
            cwd=repo_root,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(n)
    ]
    try:
        for r in range(rounds):
            (tmp_path / "ws" / LOCK_NAME).write_text(stale)  # pid 1 did not take it: stale
            (tmp_path / f"go{r}").touch()
            deadline = time.monotonic() + 60
            tried = 0
            while tried < n and time.monotonic() < deadline:
                time.sleep(0.01)
                tried = len(list(tmp_path.glob(f"done{r}.*"))) + len(list(tmp_path.glob(f"won{r}.*")))
            assert len(list(tmp_path.glob(f"won{r}.*"))) == 1, f"round {r}"
            (tmp_path / f"release{r}").touch()
            while (tmp_path / "ws" / LOCK_NAME).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
    finally:
        for p in procs:
            p.kill()
            p.wait()


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
