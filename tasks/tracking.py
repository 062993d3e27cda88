"""The per-iteration logging task of the train flow: metrics, sample rollouts and files of one step.

What it does: :func:`log_iteration` (task run ``log_iteration[it=N]``, retried twice: a locked MLflow store is
waited out) logs the sample-rollouts table and the step's files (outcome parquet, Mistake Book, plots) and
then the metrics, whose step marker says "everything of this step is logged"; a step already logged is
skipped, so a resumed run never logs a step twice.
What it does not: talk to MLflow itself (:mod:`tracking.runs`' tracker does) or decide what to log (the
train flow does).

Tests: ``pytest tests/tasks/test_tracking.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from tracking.runs import Tracker


@task(name="log_iteration", task_run_name="log_iteration[it={step}]", cache_policy=NO_CACHE, retries=2)
def log_iteration(
    tracker: Tracker,
    step: int,
    metrics: dict[str, float],
    samples: list[dict[str, Any]] | None = None,
    files: dict[str, str] | None = None,
) -> bool:
    """Metrics at ``step`` (skipped when already logged: resume never duplicates a step), the sample-rollouts
    table and per-iteration files (``{artifact_dir: path}``: outcome parquet, Mistake Book snapshot, plots)."""
    if step in tracker.logged_steps():
        return False
    if samples:
        tracker.log_table(samples, f"samples/it_{step:06d}.json")
    for artifact_dir, path in (files or {}).items():
        if Path(path).exists():
            tracker.log_file(path, artifact_dir)
    return tracker.log_iteration(step, metrics)  # last: the step marker means "everything logged"
