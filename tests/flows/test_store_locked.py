"""Another process holding the MLflow store's sqlite write lock is one line per wait, not tracebacks.

Before: a lock held mid-training printed four SQLAlchemy tracebacks: MLflow logs each "database is locked" with
its SQL and two tracebacks (``mlflow.store.db.utils``) before raising it, and Prefect logs the failed
``log_iteration`` attempt with a traceback again before retrying it. Here the lock is real (a second sqlite
connection holds ``BEGIN EXCLUSIVE``) and so is the error (SQLAlchemy on that file, without waiting); it is logged
through MLflow's and Prefect's own loggers as they log it (MLflow waits 20 s before raising, too long for here).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import log_lines

FMT = "%(levelname)s %(name)s: %(message)s"


@pytest.fixture()
def locked_error(tmp_path: Path) -> Iterator[BaseException]:
    """The MlflowException MLflow raises for a locked store, caused by SQLAlchemy's real OperationalError (the
    lock is released again before the test runs: a store locked at start-up is the probe's one line)."""
    import sqlalchemy
    from mlflow.exceptions import MlflowException

    db = tmp_path / "mlflow.db"
    sqlite3.connect(db).execute("CREATE TABLE runs (run_uuid TEXT)").connection.commit()
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    engine = sqlalchemy.create_engine(f"sqlite:///{db}", connect_args={"timeout": 0})
    error: BaseException | None = None
    try:
        with engine.connect() as con:
            con.execute(sqlalchemy.text("SELECT run_uuid FROM runs"))
    except sqlalchemy.exc.OperationalError as exc:
        try:
            raise MlflowException(message=exc) from exc
        except MlflowException as wrapped:
            error = wrapped
    finally:
        holder.rollback()
        holder.close()
        engine.dispose()
    if error is None:
        pytest.fail("the held lock did not block the read")
    yield error


def test_mlflow_and_prefect_log_a_locked_store_in_one_line_each(locked_error: BaseException) -> None:
    from flows.console import STORE_LOCKED_LINE, quiet_user_error_tracebacks

    quiet_user_error_tracebacks()
    mlflow_log, prefect_log = (
        logging.getLogger("mlflow.store.db.utils"),
        logging.getLogger("prefect.task_runs"),
    )
    with log_lines(mlflow_log.name, prefect_log.name, fmt=FMT) as lines:
        cause = locked_error.__cause__
        try:
            raise cause
        except Exception as exc:  # as MLflow's make_managed_session logs it
            mlflow_log.exception("SQLAlchemy database error. The following exception is caught.\n%s", exc)
        try:
            raise locked_error
        except Exception as exc:
            prefect_log.error(
                "Task run failed with exception: %r - Retry 1/2 will start immediately", exc, exc_info=True
            )
    text = "\n".join(lines)
    assert len(text.splitlines()) == 2, text
    assert "Traceback" not in text and "SELECT" not in text, text
    assert lines[0].startswith("WARNING mlflow.store.db.utils: " + STORE_LOCKED_LINE), lines[0]
    assert lines[1] == (
        f"ERROR prefect.task_runs: Task run failed with exception: {STORE_LOCKED_LINE}"
        " - Retry 1/2 will start immediately"
    ), lines[1]


def test_other_errors_keep_their_tracebacks() -> None:
    from flows.console import quiet_user_error_tracebacks

    quiet_user_error_tracebacks()
    with log_lines("mlflow.store.db.utils", fmt=FMT) as lines:
        try:
            raise RuntimeError("disk I/O error")
        except RuntimeError:
            logging.getLogger("mlflow.store.db.utils").exception("SQLAlchemy database error.")
    assert "Traceback" in lines[0] and "disk I/O error" in lines[0]


def test_a_store_locked_through_every_retry_ends_the_stage_in_one_line(
    locked_error: BaseException, tmp_path: Path, capsys
) -> None:
    from flows.common import stage_main
    from flows.run_endings import run_guarded

    def start() -> dict:
        raise locked_error

    params = tmp_path / "params.yaml"
    params.write_text(
        "data:\n  train_batch_size: 8\n"
        f"orchestration:\n  checkpoint_dir: {tmp_path / 'train'}\n"
        f"tracking:\n  tracking_uri: sqlite:///{tmp_path / 'mlflow.db'}\n"
        f"  artifact_location: {tmp_path / 'artifacts'}\n"
        f"model:\n  code_path: {tmp_path}\n  test_path: {tmp_path}\n"
    )

    def run(params: str, overrides: list[str]) -> None:
        from codea1_core.config import load_config

        run_guarded(load_config(params, overrides), start)

    assert stage_main(run, "train", ["--params", str(params)]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: the MLflow store (sqlite:///") and "database is locked" in last, err
    assert "Traceback" not in err
