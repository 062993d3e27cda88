"""What reaches the console from a stage: one line for a failure a user can fix, one line per iteration.

What it does: :func:`quiet_user_error_tracebacks` installs log filters that drop the tracebacks Prefect and
MLflow attach to a user error, a disk error or a locked MLflow store (:func:`store_locked`; one line each
instead), :func:`quiet_console` keeps generated code's SyntaxWarnings and the Hugging Face progress bars off
the console, and :func:`progress_line` is the training's one line per iteration.
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
        return True


class _StoreLockedFilter(logging.Filter):
    """MLflow logs every "database is locked" with its SQL and two tracebacks before raising it (which the task's
    retries and :func:`run_guarded` handle): one line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and store_locked(exc):
            record.msg, record.args = f"{STORE_LOCKED_LINE}; waited 20 s, the step is retried", ()
            record.levelno, record.levelname = logging.WARNING, "WARNING"
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
