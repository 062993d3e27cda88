"""Process plumbing of the stages: signals, the workspace lock and its error lines, log filters, task runs.

What it does: what ``flows/train.py`` needs from the process it runs in but is not the algorithm —
  * :func:`stop_on_sigterm` / :class:`Stopped`: SIGTERM stops a run after its current task (the last
    checkpoint stands), a second SIGTERM at once;
  * :func:`run_guarded`: one training run per workspace (``workspace.lock.WorkspaceLock``) and the
    failures a user can act on (lock held, no intact checkpoint, MLflow store unusable, disk full or
    read-only) turned into one :class:`~flows.common.UserError` line naming the path;
  * :func:`quiet_user_error_tracebacks`, :func:`quiet_console`: what stays off the console;
  * :class:`TrainRun`: what one training run holds between iterations;
  * :func:`as_task` / :func:`as_function`: run a step as a Prefect task run, or as a plain function (bench);
  * :func:`progress_line`: the one console line per iteration;
  * :func:`fault_point`: the test hook that SIGKILLs the process at a named point;
  * :func:`load_problems`, :func:`training_steps`, :func:`seed_everything`, :func:`preflight`: what the run
    starts from, checked before the flow starts so a bad input is one line.
What it does not: decide what a stage computes (the flows do).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codea1_core.config import Config, ConfigError
from codea1_core.method import batches
from flows.common import PLAIN, UserError, quoted

log = logging.getLogger("codea1.train")

# --------------------------------------------------------------------------------------------------
# Signals: stop after the current task
# --------------------------------------------------------------------------------------------------


class Stopped(Exception):
    """SIGTERM arrived: the run stops before its next task (the last checkpoint stands)."""


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[threading.Event]:
    """While inside: SIGTERM sets the returned event (a second SIGTERM exits at once with 143).

    Why: Prefect's own SIGTERM bridge tears the run down from wherever it is (minutes, with tracebacks);
    stopping between tasks keeps the workspace resumable. Only the main thread can install a handler.
    """
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise SystemExit(143)
        stop.set()
        log.warning("train: SIGTERM received: stopping after the current task (send it again to stop now)")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def ending(run: Any) -> Iterator[None]:
    """End ``run.tracker``'s run as what happened in the block: FINISHED, KILLED after SIGTERM (:class:`Stopped`
    is swallowed: ``run.summary`` says ``stopped``), FAILED on any error (re-raised; a re-run resumes the same
    MLflow run). The history done so far is written either way (``dvc plots`` shows the iterations done)."""
    from workspace.resume import write_history

    try:
        yield
    except Stopped:
        write_history(run.out_dir, run.history)
        run.tracker.end("KILLED")
        run.summary = {"stopped": True, "iteration": int(run.history[-1]["iteration"]) if run.history else 0}
        return
    except BaseException:
        with contextlib.suppress(Exception):  # best effort: never hides the failure itself
            write_history(run.out_dir, run.history)
        run.tracker.end("FAILED")
        raise
    run.tracker.end("FINISHED")


@contextlib.contextmanager
def failing(tracker: Any) -> Iterator[None]:
    """Any failure in the block ends ``tracker``'s run FAILED, then propagates (a run reopened during setup
    must not stay RUNNING when a model does not load)."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):  # best effort: never hides the failure itself
            tracker.end("FAILED")
        raise


def timed_steps(call: Callable[..., Any], times: dict[str, float], stop: threading.Event | None):
    """``timed(name, task, *args)``: ``call(task, *args)`` timed into ``times["time/<name>_s"]``; raises
    :class:`Stopped` instead when ``stop`` is set (SIGTERM: the run stops between tasks)."""

    def timed(name: str, task: Any, *args: Any, **kwargs: Any) -> Any:
        if stop is not None and stop.is_set():
            raise Stopped(name)
        t0 = time.perf_counter()
        out = call(task, *args, **kwargs)
        times[f"time/{name}_s"] = time.perf_counter() - t0
        return out

    return timed


def fault_point(name: str) -> None:
    """Test hook: SIGKILL this process at ``name`` when ``$CODEA1_KILL_AT`` says so (tests/flows/test_wedge.py)."""
    if os.environ.get("CODEA1_KILL_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


# --------------------------------------------------------------------------------------------------
# The workspace lock and the failures a user can act on, in one line
# --------------------------------------------------------------------------------------------------

DISK_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES, errno.EPERM}


def run_guarded(cfg: Config, start: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``start()`` (the train flow) under the workspace lock, after :func:`preflight`; lock, checkpoint, tracking
    and disk errors become one UserError line, a SIGTERM-stopped run one line and exit 143 (a config that cannot
    fit its GPU stops first, ``flows.plan``)."""
    from prefect.exceptions import CancelledRun

    from flows.plan import check_training_fits
    from tracking.store import TrackingUnavailable
    from workspace.checkpoints import CheckpointError
    from workspace.lock import WorkspaceLock, WorkspaceLockedError

    check_training_fits(cfg)
    quiet_user_error_tracebacks()
    try:
        with WorkspaceLock(cfg.orchestration.checkpoint_dir):
            preflight(cfg)
            summary = start()
    except CancelledRun as exc:  # SIGTERM: the flow run ended CANCELLED (final_state)
        print(f"train: {exc}: run it again to resume", file=sys.stderr)
        raise SystemExit(143) from None
    except (WorkspaceLockedError, CheckpointError, TrackingUnavailable) as exc:
        raise UserError(str(exc)) from None
    except (
        Exception
    ) as exc:  # a disk error anywhere in the chain (a writer may wrap it): one line naming the path
        disk = next((e for e in _chain(exc) if isinstance(e, OSError) and e.errno in DISK_ERRNOS), None)
        if disk is None and store_locked(exc):
            from tracking.store import tracking_uri

            raise UserError(
                f"the MLflow store ({tracking_uri(cfg)}) stayed locked by another process through "
                "every retry (sqlite: database is locked); stop the process writing to it and rerun to resume"
            ) from None
        if disk is None:
            raise
        raise UserError(f"{disk.filename or cfg.orchestration.checkpoint_dir}: {disk.strerror}") from None
    return summary


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


def store_locked(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) is sqlite's "database is locked": another process holds the MLflow
    store's write lock past its busy timeout (20 s in MLflow). A wait, not a failure of ours."""
    return any("database is locked" in str(e) for e in _chain(exc))


def final_state(summary: dict[str, Any]) -> Any:
    """What the train flow returns: its summary, or a CANCELLED state after SIGTERM (Prefect recorded a stopped
    run as COMPLETED; calling the flow then raises ``CancelledRun`` with this message)."""
    if not summary.get("stopped"):
        return summary
    from prefect.states import Cancelled

    return Cancelled(message=f"stopped by SIGTERM after iteration {summary['iteration']} (checkpointed)")


# --------------------------------------------------------------------------------------------------
# What stays off the console
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# The run's state between iterations (flows/train.py's setup builds it)
# --------------------------------------------------------------------------------------------------
@dataclass
class TrainRun:
    """What one training run holds between iterations (built by :func:`setup`)."""

    cfg: Config
    train_set: list[Any]
    val_set: list[Any]
    total: int
    start: int
    fingerprint: str
    policies: dict[str, Any]
    book: Any
    tracker: Any
    history: list[dict[str, Any]]
    out_dir: Path
    executor: Any = None
    stop: threading.Event | None = None  # set by SIGTERM: :func:`iteration` stops before its next task
    summary: dict[str, Any] | None = None  # what train() returns: finish()'s row or {"stopped": True, ...}

    @property
    def code_pol(self) -> Any:
        return self.policies["code"]

    @property
    def test_pol(self) -> Any:
        return self.policies.get("test", self.policies["code"])


# --------------------------------------------------------------------------------------------------
# Task runs
# --------------------------------------------------------------------------------------------------


def as_task(task: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a Prefect task (a named task run in the UI) under ``orchestration.task_timeout_s``; arguments as
    :func:`flows.common.quoted` gives them (the ``Config`` too is passed as it is)."""
    cfg = kwargs.get("cfg") or next((a for a in args if isinstance(a, Config)), None)
    if cfg is not None and cfg.orchestration.task_timeout_s > 0:
        task = task.with_options(timeout_seconds=cfg.orchestration.task_timeout_s)
    args, kwargs = quoted(args, kwargs, (*PLAIN, Config))
    return task(*args, **kwargs)


def as_function(task: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a task's plain function (no Prefect): the baseline of ``bench/iteration_bench.py``."""
    return getattr(task, "fn", task)(*args, **kwargs)


# --------------------------------------------------------------------------------------------------
# One console line per iteration
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# Before the first step: inputs, seeds, and what would fail later (checked in one line)
# --------------------------------------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch so initialisation does not depend on what ran before in the process."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def training_steps(cfg: Config, n_problems: int) -> int:
    """The run's number of steps (``batches.total_steps``); a config with none is a one-line UserError."""
    total = batches.total_steps(
        n_problems, cfg.data.train_batch_size, cfg.data.epochs, cfg.orchestration.max_steps
    )
    if total < 1:
        raise UserError(
            f"no training step: {n_problems} problems, data.train_batch_size={cfg.data.train_batch_size}, "
            f"data.epochs={cfg.data.epochs}, orchestration.max_steps={cfg.orchestration.max_steps}"
        )
    return total


def load_problems(cfg: Config) -> tuple[list[Any], list[Any]]:
    """Prepared train/val problems (``data/prepared``); lab-only configs fall back to generating them."""
    prepared = Path(cfg.data.prepared_dir)
    if (prepared / "train.parquet").is_file():
        from codea1_core.data.dataset_types import DatasetError
        from codea1_core.data.prepared import load_prepared

        try:  # a truncated or malformed file: one line naming it
            val = load_prepared(prepared / "val.parquet") if (prepared / "val.parquet").is_file() else []
            return load_prepared(prepared / "train.parquet"), val
        except DatasetError as exc:
            raise UserError(str(exc)) from None
    if set(cfg.data.train_sources) <= {"lab"}:
        from codea1_core.data.lab import lab_problems

        log.warning("%s/train.parquet absent: generating the lab problems in memory", prepared)
        return lab_problems(cfg.lab, "train"), lab_problems(cfg.lab, "val")
    raise UserError(
        f"{prepared}/train.parquet not found: run `codea1 prepare` (or `dvc repro prepare`) first"
    )


def preflight(cfg: Config) -> None:
    """What would fail later, checked before the flow starts: checkpoints (verified, with fallback; a step budget
    below the last one) and the MLflow store (probed, <= 10 s). Raises the tasks' errors; :func:`run_guarded` turns them into one line."""
    from tracking.store import probe_store
    from workspace.checkpoints import checkpoint_iteration, select_checkpoint
    from workspace.resume import check_step_budget, stored_fingerprint

    out_dir = Path(cfg.orchestration.checkpoint_dir)
    total = training_steps(
        cfg, len(load_problems(cfg)[0])
    )  # cheap (parquet or lab); setup() checks after filtering
    same = stored_fingerprint(out_dir) == batches.config_fingerprint(cfg.flat())
    latest = select_checkpoint(out_dir) if cfg.orchestration.resume == "auto" and same else None
    if latest is not None:  # a step budget below the checkpoint: refused before the flow starts
        check_step_budget(latest, checkpoint_iteration(latest), total)
    if cfg.tracking.backend == "mlflow":
        probe_store(cfg)
    for role in ("code", "test") if cfg.mode == "codea1" else ("code",):
        check_model_path(cfg, role)


def check_model_path(cfg: Config, role: str) -> None:
    """A local model folder that is missing (the warm start not run yet) is one line; a Hub id (``org/name``,
    one slash) is left to the loader."""
    path = getattr(cfg.model, f"{role}_path")
    local = Path(path).is_absolute() or path.startswith(".") or path.count("/") != 1
    if local and not Path(path).is_dir():
        raise UserError(
            f"model.{role}_path={path}: no such folder: run the warmstart stage (`dvc repro warmstart`) "
            f"or point model.{role}_path at a model"
        )
