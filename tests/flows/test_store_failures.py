"""The MLflow store or a disk failing under a running stage is one line naming the store or path, its cause and
what to do, with the last checkpoint safe.

Guards: the store made read-only, deleted or truncated during train printed 369 to 1,166 lines of SQLAlchemy,
MLflow and Prefect tracebacks, a store full during train named the checkpoint folder instead of the store's, and
a full disk during evaluate failed after the whole evaluation. Everything here is real: the store lives on a
small tmpfs of its own (root mounts it; the tests skip with that reason where mounting is impossible), made
read-only by a read-only bind mount over it, deleted, truncated, filled, or locked by a second sqlite connection
while the stage runs in its own process.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from support import mounted_tmpfs, tiny_config, write_done


@pytest.fixture()
def store_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs of its own for the MLflow store (unmounted afterwards, with any bind mount over it)."""
    with mounted_tmpfs(
        tmp_path / "store", "64m", "no real disk to break", unmounts=2
    ) as mnt:  # (+ the bind mount)
        yield mnt


def _read_only(mnt: Path) -> None:
    """The folder read-only for every new open, as a read-only remount would be (a tmpfs with files open for
    writing refuses that remount): a read-only bind mount of the folder over itself."""
    subprocess.run(["mount", "--bind", str(mnt), str(mnt)], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(mnt)], check=True)


def _truncate(db: Path) -> None:
    os.truncate(db, db.stat().st_size // 2)


def _fill(mnt: Path) -> None:
    subprocess.run(["dd", "if=/dev/zero", f"of={mnt}/fill", "bs=1M", "count=100"], capture_output=True)


BREAKS: dict[str, tuple[Callable[[Path], None], str]] = {
    "read-only": (
        _read_only,
        r"is read-only \(sqlite: attempt to write a readonly database\)|Read-only file system",
    ),
    "deleted": (lambda mnt: (mnt / "mlflow.db").unlink(), "was deleted while the stage ran"),
    "truncated": (
        lambda mnt: _truncate(mnt / "mlflow.db"),
        r"is corrupt \(sqlite: database disk image is malformed\)",
    ),
    "full": (_fill, "No space left on device|disk is full"),
}
"""How the store is broken after the first checkpoint -> what the stage's last line says."""


def _stage_env() -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL

    env = dict(os.environ, OMP_NUM_THREADS="1", PREFECT_API_URL=str(PREFECT_API_URL.value()))
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _assert_one_line(log: str, cause: str, names: str) -> str:
    """The stage's output: its last line names ``names`` and matches ``cause``; no traceback, no SQL, a few lines
    (the lab's and torch's own warnings, the task and flow runs' one line each) instead of hundreds."""
    import re

    last = log.strip().splitlines()[-1]
    assert last.startswith("error: ") and names in last and re.search(cause, last), log[-3000:]
    assert "Traceback" not in log and "[SQL:" not in log, log[-5000:]
    assert len(log.strip().splitlines()) <= 15, log
    return last


@pytest.mark.e2e
@pytest.mark.parametrize("how", sorted(BREAKS))
def test_a_store_broken_during_train_is_one_line_after_a_safe_checkpoint(
    how, store_disk, prefect_harness, tiny_model_dir, tmp_path, repo_root
) -> None:
    from workspace.checkpoints import checkpoint_iteration, select_checkpoint

    brk, cause = BREAKS[how]
    cfg = tiny_config(
        tmp_path,
        tiny_model_dir,
        **{
            "orchestration.max_steps": 6,
            "data.epochs": 6,
            "tracking.tracking_uri": f"sqlite:///{store_disk}/mlflow.db",
            "tracking.artifact_location": str(store_disk / "artifacts"),
        },
    )
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(cfg.to_dict()))
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.train", "--params", str(params)],
        cwd=repo_root,
        env=_stage_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    latest = tmp_path / "train" / "checkpoints" / "LATEST"
    deadline = time.monotonic() + 300
    while not latest.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()[0][-3000:]
    brk(store_disk)
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2, log[-3000:]
    last = _assert_one_line(log, cause, str(store_disk))
    if last.startswith("error: the MLflow store ("):  # (a disk's line is the path and the cause)
        assert last.endswith("then rerun to resume from the last checkpoint"), last
    safe = select_checkpoint(tmp_path / "train")  # verified against its manifest
    assert safe is not None and checkpoint_iteration(safe) >= 1


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs: less than an evaluation's outputs take."""
    with mounted_tmpfs(tmp_path / "disk", "256k", "no real full disk to write to") as mnt:
        yield mnt


@pytest.mark.e2e
def test_a_full_disk_fails_the_evaluate_stage_before_it_evaluates(
    small_disk, prefect_harness, tiny_model_dir, tmp_path, repo_root
) -> None:
    """eval.out_dir on a full disk: one line naming it, before any model is loaded (the stage's real process)."""
    cfg = tiny_config(
        tmp_path, tiny_model_dir, **{"eval.out_dir": str(small_disk / "eval"), "tracking.backend": "null"}
    )
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(cfg.to_dict()))
    proc = subprocess.run(
        [sys.executable, "-m", "flows.evaluate", "--params", str(params)],
        cwd=repo_root,
        env=_stage_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 2, log[-3000:]
    last = _assert_one_line(log, "No space left on device", f"eval.out_dir={small_disk / 'eval'}")
    assert "test write before the evaluation failed" in last, last
    assert not any(small_disk.rglob("*.json")) and not any(small_disk.rglob("*.tmp")), list(
        small_disk.rglob("*")
    )


def _lock_before(monkeypatch: pytest.MonkeyPatch, module: object, name: str, db: Path) -> list:
    """Replace ``module.name`` with a wrapper that takes the store's sqlite write lock (a second connection's
    ``BEGIN EXCLUSIVE``, held to the end of the test) and then calls the real function: a store locked by
    another process mid-run, after the start's probe."""
    real, holders = getattr(module, name), []

    def locked(*args, **kwargs):
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        holders.append(holder)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, locked)
    return holders


def test_a_store_locked_at_the_end_of_evaluate_is_one_line(mlflow_cfg, tmp_path, monkeypatch) -> None:
    from support import FakeExecutor, TextPolicy, log_lines

    from flows import evaluate
    from flows.common import UserError
    from flows.console import quiet_user_error_tracebacks

    cfg = mlflow_cfg.replace(
        **{
            "eval.out_dir": str(tmp_path / "eval"),
            "data.eval_benchmarks": [],
            "eval.test_sources": [],
            "orchestration.checkpoint_dir": str(tmp_path / "train"),
        }
    )
    db = Path(cfg.tracking.tracking_uri.removeprefix("sqlite:///"))
    evaluate._track(cfg, {"warm": 1.0}, _report(tmp_path), False)  # the store exists and works
    holders = _lock_before(monkeypatch, evaluate, "_track", db)
    quiet_user_error_tracebacks()
    policy = TextPolicy(lambda text: "")
    try:
        with log_lines("mlflow.store.db.utils") as lines, pytest.raises(UserError) as err:
            evaluate.evaluate(cfg, code_policy=policy, test_policy=policy, executor=FakeExecutor())
    finally:
        for holder in holders:
            holder.rollback()
            holder.close()
    msg = str(err.value)
    assert msg.startswith(f"the MLflow store ({cfg.tracking.tracking_uri}) stayed locked by another process")
    assert (
        "(sqlite: database is locked)" in msg
        and msg.endswith("then rerun the evaluation")
        and "\n" not in msg
    )
    assert (tmp_path / "eval" / "metrics.json").is_file()  # the evaluation's outputs are written first
    assert all("Traceback" not in line for line in lines), lines


def _report(tmp_path: Path) -> Path:
    report = tmp_path / "report.html"
    report.write_text("<html></html>")
    return report


@pytest.mark.e2e
def test_a_store_locked_during_register_is_one_line(
    mlflow_cfg, prefect_harness, tmp_path, monkeypatch, capsys
) -> None:
    """The register stage's entry with a real registered version, the store locked after its start-up probe."""
    import json

    from support import write_params

    from flows import register
    from flows.common import stage_main
    from tracking import packaging
    from tracking.runs import MlflowTracker

    def marker(src, out, role, step):
        out.mkdir(parents=True)
        (out / "MLmodel").write_text("flavors: {}\n")
        return out

    monkeypatch.setattr(packaging, "save_transformers_model", marker)
    cfg = mlflow_cfg.replace(
        **{
            "orchestration.checkpoint_dir": str(tmp_path / "train"),
            "eval.out_dir": str(tmp_path / "eval"),
            "eval.promote_metric": "code/lab_heldout/pass@1",
            "eval.promote_metric_test": "test/lab_heldout/pass@5",
        }
    )
    tracker = MlflowTracker(cfg)
    versions = {role: tracker.register(role, tmp_path, 1) for role in ("code", "test")}
    write_done(tmp_path / "train", versions, tracker.run_id)
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "metrics.json").write_text(
        json.dumps({"code/lab_heldout/pass@1": 40.0, "test/lab_heldout/pass@5": 20.0})
    )
    db = Path(cfg.tracking.tracking_uri.removeprefix("sqlite:///"))
    holders = _lock_before(monkeypatch, register, "register", db)
    monkeypatch.chdir(tmp_path)
    try:
        params = write_params(cfg, tmp_path / "params.yaml")
        rc = stage_main(
            register.run, "register", ["--params", params], checks=("metrics",)
        )  # as register's main
    finally:
        for holder in holders:
            holder.rollback()
            holder.close()
    err = capsys.readouterr().err
    assert rc == 2, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: the MLflow store ({cfg.tracking.tracking_uri}) stayed locked"), err[
        -3000:
    ]
    assert last.endswith("then rerun the register stage") and "Traceback" not in err, err[-3000:]
    assert not (tmp_path / "outputs" / "register.json").exists()
