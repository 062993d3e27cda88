"""A rank killed mid-step stops the whole run within the collective timeout, with one line; resume at world size 1.

Real processes end to end: ``python -m flows.train distributed.nproc_per_node=2`` re-executes itself under
``torchrun`` (gloo, CPU), rank 1 is SIGKILLed once iteration 1 is checkpointed, and the run must end (not hang)
within ``distributed.timeout_s`` + start-up slack, its last stderr line naming the checkpoint to resume from.
The same workspace then resumes on ONE rank (the checkpoint format does not depend on the world size) and
completes every iteration exactly once. Slow (two start-ups of torch + Prefect): ``pytest -m slow``.
"""

from __future__ import annotations

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


@pytest.mark.slow
def test_killed_rank_stops_the_run_then_resume_on_one_rank(tmp_path: Path) -> None:
    model = build_tiny(tmp_path / "model")
    cfg = tiny_config(tmp_path, model, **{
        "data.train_batch_size": 4, "data.epochs": 20, "orchestration.max_steps": 4, "rollout.batch_size": 2,
        "lab.train_per_family": 2, "model.cpu_threads": 1, "sandbox.workers": 1,
        "distributed.nproc_per_node": 2, "distributed.timeout_s": TIMEOUT_S,
    })  # fmt: skip
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
    os.kill(pid, signal.SIGKILL)  # mid-step: iteration 2 is under way
    killed = time.monotonic()
    launcher.wait(timeout=TIMEOUT_S + 60)
    assert time.monotonic() - killed < TIMEOUT_S + 60
    err = run_log.read_text()
    assert launcher.returncode not in (0, None)
    last = err.strip().splitlines()[-1]
    assert last.startswith("train: stopped (torchrun exit") and "the last checkpoint is" in last, last
    done = json.loads(
        (tmp_path / "train" / "checkpoints" / latest.read_text().strip() / "state.json").read_text()
    )
    assert done["history"] and done["history"][-1]["iteration"] < 4  # it stopped before the end

    resume = subprocess.run([*cmd, "distributed.nproc_per_node=1"], env=env, cwd=ROOT, capture_output=True,
                            text=True, timeout=900)  # fmt: skip
    assert resume.returncode == 0, resume.stderr[-3000:]
    rows = json.loads((tmp_path / "train" / "metrics.json").read_text())
    assert rows["iteration"] == 4
    history = (tmp_path / "train" / "history.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in history[1:]] == ["1", "2", "3", "4"]
