"""SIGKILL of ``make run``'s runner during train: the stage ends cleanly while its API still answers.

Regression: the temporary Prefect server died with the runner at once (``PR_SET_PDEATHSIG``) while the guard was
only starting to stop the stage, so the stage retried the vanished API for ~70 s holding the workspace lock,
printed ~150 lines of httpx tracebacks, and its flow and task runs stayed RUNNING forever; the server's log stayed
in ``$TMPDIR`` and the killed ``dvc`` left its entries in ``.dvc/tmp/rwlock``. Here the real runner
(``python -m flows.pipeline``, with its own temporary server: no ``PREFECT_API_URL``) runs ``dvc repro`` of the
real train stage on a tiny config and is SIGKILLed once the first checkpoint is written.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from support import build_tiny, make_repo


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _answers(api: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_sigkill_of_the_runner_during_train_ends_the_stage_and_its_runs(
    prefect_harness, tmp_path: Path, repo_root: Path
) -> None:
    repo = tmp_path / "repo"
    env = make_repo(repo, build_tiny(tmp_path / "model"), repo_root)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["orchestration"]["max_steps"], params["data"]["epochs"] = 50, 50
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    home, tmp = tmp_path / "prefect_home", tmp_path / "tmp"
    tmp.mkdir()
    env = dict(env, PREFECT_HOME=str(home), TMPDIR=str(tmp))
    env.pop("PREFECT_API_URL")  # the runner starts its own temporary server, as `make run` does
    runner = subprocess.Popen(
        [sys.executable, "-m", "flows.pipeline"],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    first = runner.stdout.readline()
    api = re.search(r"Prefect API (\S+)", first)
    assert api, first
    api = api.group(1)
    out = repo / "outputs" / "train"
    deadline = time.monotonic() + 400
    while not (out / "checkpoints" / "LATEST").is_file() and runner.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint within 400 s"
        time.sleep(0.1)
    assert runner.poll() is None, runner.communicate()[0][-3000:]
    stage_pid = json.loads((out / "train.lock").read_text())["pid"]

    runner.send_signal(signal.SIGKILL)
    t0 = time.monotonic()
    try:
        log, _ = runner.communicate(timeout=200)  # EOF: the stage, dvc and the guard all closed the pipe
    finally:
        if _alive(stage_pid):
            os.kill(stage_pid, signal.SIGKILL)
    took = time.monotonic() - t0
    assert not _alive(stage_pid), log[-3000:]
    assert took < 60, (took, log[-3000:])
    assert "Traceback" not in log and "httpx" not in log, log[-5000:]
    assert "stopped by SIGTERM after iteration" in log, log[-3000:]
    assert not (out / "train.lock").exists()
    assert not _answers(api), "the temporary Prefect server outlived its owner"
    assert not list(tmp.glob("codea1-prefect-server-*.log"))
    rwlock = repo / ".dvc" / "tmp" / "rwlock"
    if rwlock.is_file():  # no entry of the killed dvc (nor any other dead process)
        lock = json.loads(rwlock.read_text())
        pids = [i["pid"] for i in lock.get("write", {}).values()]
        pids += [i["pid"] for infos in lock.get("read", {}).values() for i in infos]
        assert not [p for p in pids if not _alive(p)], lock
    with sqlite3.connect(home / "prefect.db") as db:
        flow_runs = db.execute("SELECT name, state_type FROM flow_run").fetchall()
        task_runs = db.execute("SELECT name, state_type FROM task_run").fetchall()
    assert [state for name, state in flow_runs if name.startswith("train-")] == ["CANCELLED"], flow_runs
    assert task_runs and not [t for t in task_runs if t[1] in ("RUNNING", "PENDING")], task_runs
