"""The MLflow store is probed with a real write, by every stage that talks to MLflow, before any work.

Before: a read-only store passed the probe (``BEGIN IMMEDIATE`` succeeds on a read-only database) and the first
real write died in 407 lines; ``evaluate`` and ``register`` had no probe at all: with the store unreachable,
evaluate worked and then retried for ~4 min, register took 537 s and named the wrong cause. Now each says
"MLflow store <uri> ..." in one line, within seconds.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import mounted_tmpfs


@pytest.fixture()
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A real read-only filesystem (a tmpfs remounted ``ro``) holding an sqlite MLflow store; root ignores file
    modes, so a mount is the honest way to get one."""
    with mounted_tmpfs(tmp_path / "ro", "1m", "no real read-only store") as mnt:
        con = sqlite3.connect(mnt / "mlflow.db")
        con.execute("CREATE TABLE experiments (x)")
        con.commit()
        con.close()
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        yield mnt


def test_a_read_only_store_fails_the_probe_in_one_line(read_only_dir: Path, mlflow_cfg) -> None:
    from tracking.store import TrackingUnavailable, probe_store

    cfg = mlflow_cfg.replace(**{"tracking.tracking_uri": f"sqlite:///{read_only_dir}/mlflow.db"})
    with pytest.raises(TrackingUnavailable, match=rf"MLflow store {read_only_dir}/mlflow.db: .*readonly"):
        probe_store(cfg)


def test_a_read_only_artifact_folder_fails_the_probe(read_only_dir: Path, mlflow_cfg, tmp_path: Path) -> None:
    from tracking.store import TrackingUnavailable, probe_store

    cfg = mlflow_cfg.replace(**{"tracking.artifact_location": str(read_only_dir / "artifacts")})
    with pytest.raises(TrackingUnavailable, match=rf"MLflow artifacts {read_only_dir}/artifacts: "):
        probe_store(cfg)


@pytest.fixture()
def silent_server() -> Iterator[str]:
    """Accepts connections (backlog) but never answers: MLflow's client retries such a store for minutes."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


@pytest.mark.e2e  # a stage in a subprocess
@pytest.mark.parametrize("stage", ["evaluate", "register"])
def test_evaluate_and_register_probe_the_store_first(stage, silent_server, tmp_path, repo_root) -> None:
    params = tmp_path / "params.yaml"
    params.write_text(
        f"orchestration:\n  checkpoint_dir: {tmp_path / 'train'}\neval:\n  out_dir: {tmp_path / 'eval'}\n"
        "rollout:\n  max_new_tokens_code: 96\n  max_new_tokens_test: 128\n"  # the lab's 1,024-token context
    )
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "metrics.json").write_text('{"code/humanevalplus/pass@1": 0.5}')
    env = dict(os.environ, MLFLOW_TRACKING_URI=silent_server, PYTHONPATH=str(repo_root), OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", f"flows.{stage}", "--params", str(params)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{stage} still talking to an unreachable store after 90 s") from None
    elapsed = time.monotonic() - t0
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert last.startswith(f"error: MLflow store {silent_server} unreachable"), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert elapsed < 60, (
        elapsed
    )  # the probe is bounded (5 s); the rest is the interpreter's imports under load


def _sqlite_error(db: Path) -> BaseException:
    """The error sqlite raises on ``db``, wrapped as MLflow wraps it (an exception raised from it)."""
    try:
        try:
            sqlite3.connect(db).execute("SELECT * FROM runs")
        except sqlite3.Error as exc:
            raise RuntimeError("MLflow wrapped it") from exc
    except RuntimeError as wrapped:
        return wrapped
    raise AssertionError("no sqlite error")


def test_a_store_failing_mid_run_is_named_with_its_cause_and_the_fix(mlflow_cfg, tmp_path: Path) -> None:
    from tracking.store import store_failure

    db = Path(mlflow_cfg.tracking.tracking_uri.removeprefix("sqlite:///"))
    db.write_bytes(b"not a database, " * 512)
    line = store_failure(_sqlite_error(db), mlflow_cfg)
    assert line == (
        f"the MLflow store ({mlflow_cfg.tracking.tracking_uri}) is corrupt (sqlite: file is not a database); "
        "restore it from a backup or point tracking.tracking_uri at a new store"
    )
    error = _sqlite_error(tmp_path / "elsewhere.db")  # "no such table: runs"
    db.unlink()
    assert "was deleted while the stage ran" in store_failure(error, mlflow_cfg)
    assert store_failure(RuntimeError("not the store"), mlflow_cfg) is None
