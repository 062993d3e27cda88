"""The train stage under guard, and how a training run ends.

What it does: :func:`run_guarded` runs the train flow under the workspace lock (one training run per
workspace, ``workspace.lock.WorkspaceLock``) after :func:`flows.train_run.preflight` and
:func:`check_starting_models` (the warm start, the KL reference, verified by checksum), and turns the failures
a user can act on (lock held, no intact checkpoint, MLflow store unusable, locked, read-only, deleted or corrupt,
disk full or read-only: ``flows.console.failure_line``) into one :class:`~flows.common.UserError` line naming
the path or store, a SIGTERM-stopped run into one line and exit 143.
Inside the flow, :func:`ending` ends the MLflow run as what happened (FINISHED, KILLED after SIGTERM, FAILED),
:func:`failing` ends it FAILED when setup fails, and :func:`final_state` makes a stopped run's flow run
CANCELLED.
What it does not: stop a stage's process group (``flows/guard.py``) or decide what a run computes
(``flows/train.py``).

Tests: ``tests/flows/test_run_endings.py``, ``tests/flows/test_store_locked.py``,
``tests/workspace/test_disk_full.py``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from codea1_core.config import Config
from flows.common import UserError
from flows.console import failure_line, quiet_user_error_tracebacks
from flows.steps import Stopped
from flows.train_run import preflight


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
            check_starting_models(cfg)
            summary = start()
    except CancelledRun as exc:  # SIGTERM: the flow run ended CANCELLED (final_state)
        print(f"train: {exc}: run it again to resume", file=sys.stderr)
        raise SystemExit(143) from None
    except (WorkspaceLockedError, CheckpointError, TrackingUnavailable) as exc:
        raise UserError(str(exc)) from None
    except Exception as exc:  # a disk or MLflow store failure anywhere in the chain: one line
        line = failure_line(exc, cfg, then="rerun to resume from the last checkpoint")
        if line is None:
            raise
        raise UserError(line) from None
    return summary


def check_starting_models(cfg: Config) -> None:
    """The models training starts from and keeps as its KL reference (``model.<role>_path``), verified against
    the ``MANIFEST.json`` the warm start wrote into them (every start, so every resume): a corrupt file is one
    line naming it and how to rebuild; a model without a manifest (a user's model, a Hub id) is not checked."""
    from workspace.checkpoints import verify_model

    for role in ("code", "test") if cfg.mode == "codea1" else ("code",):
        reason = verify_model(getattr(cfg.model, f"{role}_path"))
        if reason is not None:
            raise UserError(
                f"model.{role}_path: {reason}: rebuild the warm start (`dvc repro warmstart`, or "
                "`codea1 warmstart`) before training"
            )


def final_state(summary: dict[str, Any]) -> Any:
    """What the train flow returns: its summary, or a CANCELLED state after SIGTERM (Prefect recorded a stopped
    run as COMPLETED; calling the flow then raises ``CancelledRun`` with this message)."""
    if not summary.get("stopped"):
        return summary
    from prefect.states import Cancelled

    return Cancelled(message=f"stopped by SIGTERM after iteration {summary['iteration']} (checkpointed)")


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
        # a failed store fails here too: the first failure is the one the stage tells
        with contextlib.suppress(Exception):
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
