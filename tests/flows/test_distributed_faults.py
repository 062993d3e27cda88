"""A rank killed or hung mid-step stops the whole run within the collective timeout, with one line; resume at
world size 1.

Real processes end to end: ``python -m flows.train distributed.nproc_per_node=2`` re-executes itself under
``torchrun`` (gloo, CPU), rank 1 is SIGKILLed (dies: torchrun sees it) or SIGSTOPped (hangs: only the collective
timeout can see it) once iteration 1 is checkpointed, and the run must end (not hang) within
``distributed.timeout_s`` + slack, its last stderr line naming the checkpoint to resume from.
The same workspace then resumes on ONE rank (the checkpoint format does not depend on the world size) and
completes every iteration exactly once. Slow (two start-ups of torch + Prefect): ``pytest -m slow``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support import build_tiny, tiny_config, write_params

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 30.0


def _rank_pid(launcher: subprocess.Popen, rank: int) -> int | None:
    for child in psutil.Process(launcher.pid).children(recursive=True):
        try:
            env = child.environ()
        except (psutil.Error, OSError):
            continue
        if env.get("RANK") == str(rank) and "LOCAL_RANK" in env:
            return child.pid
    return None


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
def test_failed_rank_stops_the_run_then_resume_on_one_rank(tmp_path: Path, fault: signal.Signals) -> None:
    model = build_tiny(tmp_path / "model")
    cfg = tiny_config(
        tmp_path,
        model,
        **{
            "data.train_batch_size": 4,
            "data.epochs": 20,
            "orchestration.max_steps": 4,
            "rollout.batch_size": 2,
            "lab.train_per_family": 2,
            "model.cpu_threads": 1,
            "sandbox.workers": 1,
            "distributed.nproc_per_node": 2,
            "distributed.timeout_s": TIMEOUT_S,
        },
    )
    params = write_params(cfg, tmp_path / "params.yaml")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "PREFECT_HOME": str(tmp_path / "pf"),
    }
    cmd = [sys.executable, "-m", "flows.train", "--params", params]
    run_log = tmp_path / "run.log"  # a file, not a pipe: nothing left behind can block the reading of it
    launcher = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=run_log.open("w"), stderr=subprocess.STDOUT)
    latest = tmp_path / "train" / "checkpoints" / "LATEST"
    deadline = time.monotonic() + 600
    while not latest.exists() and launcher.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert latest.exists(), run_log.read_text()[-3000:]
    pid = _rank_pid(launcher, 1)
    assert pid is not None
    family = psutil.Process(launcher.pid).children(recursive=True)
    os.kill(pid, fault)  # mid-step: iteration 2 is under way
    killed = time.monotonic()
    try:  # hung: rank 0 fails its next collective after TIMEOUT_S, then torchrun stops the stopped rank
        launcher.wait(timeout=TIMEOUT_S + 120)
        took = time.monotonic() - killed
        left = [proc for proc in family if _alive(proc)]  # both ranks and their sandbox workers
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for proc in family:
            with contextlib.suppress(psutil.Error):
                proc.kill()  # nothing left behind, whatever happened
    assert took < TIMEOUT_S + 120
    assert not left, [(proc.pid, proc.status(), proc.cmdline()[:4]) for proc in left]
    err = run_log.read_text()
    assert launcher.returncode not in (0, None)
    last = err.strip().splitlines()[-1]
    assert last.startswith("train: stopped (torchrun exit") and "the last checkpoint is" in last, last
    done = json.loads(
        (tmp_path / "train" / "checkpoints" / latest.read_text().strip() / "state.json").read_text()
    )
    assert done["history"] and done["history"][-1]["iteration"] < 4  # it stopped before the end

    resume = subprocess.run(
        [*cmd, "distributed.nproc_per_node=1"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert resume.returncode == 0, resume.stderr[-3000:]
    rows = json.loads((tmp_path / "train" / "metrics.json").read_text())
    assert rows["iteration"] == 4
    history = (tmp_path / "train" / "history.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in history[1:]] == ["1", "2", "3", "4"]
