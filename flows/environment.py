"""Process defaults for every entry point, applied before anything imports Prefect, MLflow or GX.

Why here: Prefect reads its settings once, when ``prefect`` is first imported (``get_current_settings()`` is
cached), so a default set later — e.g. inside ``main()`` after ``from prefect import flow`` — is silently
ignored. The first-ever ephemeral Prefect API on a fresh machine must create and migrate its database,
which takes longer than Prefect's 20 s start-up default on 2 cores: that is how the very first ``make run``
once failed. ``flows/__init__.py`` calls :func:`apply` so that every ``python -m flows.<stage>`` (the DVC
stages), the ``codea1`` CLI, ``serve``, ``ui`` and ``lab-compare`` get these defaults first; the scripts in
``bench/`` and the test suite import ``flows`` before anything else for the same reason.

What it does not: override anything the user set — every default is ``os.environ.setdefault`` — or hide
real warnings: only named library notices a user can do nothing about are filtered.
"""

from __future__ import annotations

import logging
import os
import warnings

DEFAULTS: dict[str, str] = {
    # Prefect: local, offline, patient with a first database migration on a small machine.
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    "DO_NOT_TRACK": "1",
    # A training iteration is ~12 task runs: their "Finished in state Completed()" lines would bury the one
    # progress line per iteration. Task failures and retries (WARNING, ERROR) still print; the UI shows every
    # task run's state either way.
    "PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL": "WARNING",
    # Great Expectations: no usage statistics.
    "GX_ANALYTICS_ENABLED": "false",
    # tokenizers: no fork warnings from the sandbox's worker processes.
    "TOKENIZERS_PARALLELISM": "false",
    # MLflow: no per-artifact progress bars in the run log.
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    # Hugging Face: no "... to log in / download" banners for the local tiny model and datasets.
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
}

# (message regex, category, module regex): library notices between the lines that matter, none actionable.
_NOISE: tuple[tuple[str, type[Warning], str], ...] = (
    # google-api-core (pulled in by a transitive dependency) on the running Python version.
    (r"You are using a Python version", FutureWarning, r"google\.api_core(\..*)?"),
)

# Loggers whose INFO lines are bookkeeping, not news: GX's "Created temporary directory ... for ephemeral docs
# site" on every gate, MLflow's "Creating initial MLflow database tables" on a fresh store. Warnings still show.
# GX sets its module loggers' own levels at import, so a filter (which survives setLevel) does the work.
_QUIET_LOGGERS = (
    "great_expectations",
    "great_expectations.data_context.types.base",
    "mlflow.store.db.utils",
    "alembic.runtime.migration",
)


def _warnings_and_above(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING


def apply() -> None:
    """Set the environment defaults (explicit user settings win) and filter known library noise."""
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
    for message, category, module in _NOISE:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name in _QUIET_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(logging.WARNING)
        if _warnings_and_above not in logger.filters:
            logger.addFilter(_warnings_and_above)
