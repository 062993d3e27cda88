"""What reaches the console from a stage: one line for a failure a user can fix, one line per iteration.

What it does: :func:`quiet_user_error_tracebacks` installs log filters that drop the tracebacks Prefect and
MLflow attach to a user error, a disk error, a locked MLflow store (:func:`store_locked`) or any other error of
its database (:func:`store_error`; one line each instead); :func:`failure_line` is a stage's one line for a
disk or MLflow store failure; :func:`quiet_console` keeps generated code's SyntaxWarnings and the Hugging Face
progress bars off the console, and :func:`progress_line` is the training's one line per iteration.
What it does not: turn an error into the stage's exit (``flows/run_endings.py``) or decide what is logged.

Tests: ``tests/flows/test_store_locked.py``, ``tests/flows/test_run_endings.py``,
``tests/flows/test_summary.py``.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterator
from typing import Any

from codea1_core.config import ConfigError
from flows.common import UserError

DISK_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES, errno.EPERM}
"""Errors of a disk that cannot take a write (full, over quota, read-only, no permission): one line, no
traceback."""


def error_chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and what caused it, outermost first (``__cause__``, else ``__context__``)."""
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


def store_locked(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) is sqlite's "database is locked": another process holds the MLflow
    store's write lock past its busy timeout (20 s in MLflow). A wait, not a failure of ours."""
    return any("database is locked" in str(e) for e in error_chain(exc))


STORE_LOCKED_LINE = "the MLflow store is locked by another process (sqlite: database is locked)"


def store_error(exc: BaseException | None) -> str | None:
    """sqlite's one-line message when ``exc`` (or what caused it) is an error of the MLflow store's database
    (read-only, deleted, corrupt, full: MLflow wraps them in SQLAlchemy's and its own exceptions), else None."""
    import sqlite3

    for e in error_chain(exc):
        if isinstance(e, sqlite3.Error):
            return (str(e).splitlines() or [type(e).__name__])[0]
    return None


def _first_line(text: str) -> str:
    """A logged message cut at its first line when it carries sqlite's SQL and parameters (MLflow's
    exceptions repeat them in every ``repr``)."""
    return text.split("\\n", 1)[0].split("\n", 1)[0] if "(sqlite3." in text else text


def failure_line(exc: BaseException, cfg: Any, then: str) -> str | None:
    """One line for a disk or MLflow store failure behind ``exc`` (a writer, MLflow or Prefect may wrap it), None
    for anything else: a disk that cannot take a write names the path (``<path>: No space left on device``; the
    artifact store's folder says so), a failed store names its URI, what happened and what to do
    (``tracking.store.store_failure``), then ``then`` (how to carry on: the stage's rerun)."""
    from tracking.store import store_failure

    disk = next((e for e in error_chain(exc) if isinstance(e, OSError) and e.errno in DISK_ERRNOS), None)
    if disk is not None:
        path = str(disk.filename or _failing_folder(cfg) or cfg.orchestration.checkpoint_dir)
        artifacts = cfg.tracking.artifact_location
        where = "the MLflow artifact store: " if "://" not in artifacts and _under(path, artifacts) else ""
        return f"{where}{path}: {disk.strerror}"
    store = store_failure(exc, cfg)
    return None if store is None else f"{store}; then {then}"


def _failing_folder(cfg: Any) -> str | None:
    """The folder a disk error without a path came from (MLflow's artifact copy, a library's write): the first of
    the stage's folders where a 64 KiB write fails the same way."""
    import os
    import secrets
    from pathlib import Path

    folders = [cfg.tracking.artifact_location, cfg.orchestration.checkpoint_dir, cfg.eval.out_dir]
    for folder in (Path(f) for f in folders if "://" not in f):
        if not folder.is_dir():
            continue
        probe = folder / f".codea1-disk-probe.{os.getpid()}.{secrets.token_hex(4)}"
        try:
            with open(probe, "wb") as fh:
                fh.write(bytes(65536))
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            if exc.errno in DISK_ERRNOS:
                return str(folder)
        finally:
            try:
                probe.unlink(missing_ok=True)
            except OSError:
                pass
    return None


def _under(path: str, folder: str) -> bool:
    from pathlib import Path

    return Path(path).resolve().is_relative_to(Path(folder).resolve())


class _UserErrorFilter(logging.Filter):
    """Drop the traceback Prefect attaches when a flow or task fails with a user error (one line is enough);
    a task that failed because the MLflow store was locked (and is retried), and a served flow run that SIGTERM
    stopped (Prefect's engine logs the ``CancelledRun`` as an unexpected exception), get one short line too."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, UserError | ConfigError) or (
            isinstance(exc, OSError) and exc.errno in DISK_ERRNOS
        ):
            record.exc_info, record.exc_text = None, None
        elif type(exc).__name__ == "CancelledRun":  # SIGTERM stopped it (final_state): not an engine crash
            record.msg, record.args = f"the flow run ended CANCELLED: {exc}", ()
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info, record.exc_text = None, None
        elif exc is not None and store_locked(exc):
            text = record.getMessage()
            retry = text[text.find(" - Retry") :] if " - Retry" in text else ""
            record.msg, record.args = f"{text.split(':', 1)[0]}: {STORE_LOCKED_LINE}{retry}", ()
            record.exc_info, record.exc_text = None, None
        elif exc is not None and (sqlite := store_error(exc)) is not None:  # the stage's last line says more
            text = record.getMessage()
            retry = text[text.find(" - Retry") :] if " - Retry" in text else ""
            record.msg = f"{text.split(':', 1)[0]}: MLflow store error (sqlite: {sqlite}){retry}"
            record.args, record.exc_info, record.exc_text = (), None, None
        elif exc is None and "(sqlite3." in str(record.msg):  # "Finished in state Failed(...)": the SQL again
            record.msg, record.args = _first_line(record.getMessage()), ()
        return True


class _StoreLockedFilter(logging.Filter):
    """MLflow logs every "database is locked" (and every other sqlite error of its store: read-only, deleted,
    corrupt) with its SQL and two tracebacks before raising it (which the task's retries and the stage's entry
    handle): one line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and store_locked(exc):
            record.msg, record.args = f"{STORE_LOCKED_LINE}; waited 20 s, the step is retried", ()
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info, record.exc_text = None, None
        elif exc is not None and (sqlite := store_error(exc)) is not None:
            record.msg, record.args = f"MLflow store error (sqlite: {sqlite})", ()
            record.exc_info, record.exc_text = None, None
        return True


def quiet_user_error_tracebacks() -> None:
    """Install :class:`_UserErrorFilter` on Prefect's run loggers and :class:`_StoreLockedFilter` on MLflow's
    database logger (once each)."""
    for name, kind in (
        ("prefect.flow_runs", _UserErrorFilter),
        ("prefect.task_runs", _UserErrorFilter),
        ("mlflow.store.db.utils", _StoreLockedFilter),
    ):
        logger = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())


def quiet_console() -> None:
    """SyntaxWarnings about generated code and the transformers / huggingface_hub progress bars ("Loading
    weights", "Writing model shards": printed on every load and save) stay off the console."""
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging

    from codea1_core.method.parsing import silence_parse_warnings

    silence_parse_warnings()

    hf_logging.disable_progress_bar()
    disable_progress_bars()


def progress_line(it: int, total: int, row: dict[str, Any], history: list[dict[str, Any]]) -> str:
    """``it 5/95  code_r .71  test_r .17  MB 412  5.1 s/it  ETA 7 min``: one line per iteration.

    ``s/it`` is the mean of the last 10 iterations (a resumed run's included), so the ETA follows the load.
    Fields a mode does not have (``test_r`` in golden, ``MB`` without a Mistake Book) are left out.
    """
    recent = [r["time/iteration_s"] for r in history[-10:] if "time/iteration_s" in r] or [0.0]
    per_it = sum(recent) / len(recent)
    parts = [f"it {it}/{total}", f"code_r {_short(row.get('code/reward_mean'))}"]
    if "test/reward_mean" in row:
        parts.append(f"test_r {_short(row['test/reward_mean'])}")
    if "mistake_book/size" in row:
        parts.append(f"MB {int(row['mistake_book/size'])}")
    parts += [f"{per_it:.1f} s/it", f"ETA {_duration((total - it) * per_it)}"]
    return "  ".join(parts)


def _short(value: Any) -> str:
    """``0.71`` -> ``.71`` (rewards are in [0, 1]: two digits say enough); missing -> ``-``."""
    if not isinstance(value, (int, float)) or value != value:
        return "-"
    return f"{value:.2f}".replace("0.", ".", 1)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
