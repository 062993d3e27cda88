"""Process defaults for every entry point, applied before anything imports Prefect, MLflow or GX.

Why here: Prefect reads its settings once, when ``prefect`` is first imported (``get_current_settings()`` is
cached), so a default set later — e.g. inside ``main()`` after ``from prefect import flow`` — is silently
ignored. The first-ever ephemeral Prefect API on a fresh machine must create and migrate its database,
which can take longer than Prefect's 20 s start-up default on a small machine and would fail the very first
``make run``. ``flows/__init__.py`` calls :func:`apply` so that every ``python -m flows.<stage>`` (the DVC
stages), the ``codea1`` CLI, ``serve``, ``ui`` and ``lab-compare`` get these defaults first; the scripts in
``bench/`` and the test suite import ``flows`` before anything else for the same reason.

What it does not: override anything the user set — every default is ``os.environ.setdefault`` — or hide
real warnings: only named library notices a user can do nothing about are filtered.

A running Prefect API is reused (:func:`running_api`): without ``PREFECT_API_URL`` in the environment, the
active Prefect profile's is exported, else that of a Prefect server answering on this machine's API port
(``codea1 ui``, ``prefect server start``; ``PREFECT_SERVER_API_PORT``, default 4200), so a stage run by
``dvc repro`` / ``dvc exp run`` uses it (its runs show in that UI) instead of starting a temporary server of
its own. ``CODEA1_PREFECT_REUSE=0`` turns the probe off (the test suite does: its runs stay in its own API).

Numerics (``model.cpu_numerics``): :data:`REPRODUCIBLE_NUMERICS` pins the kernel levels that decide how CPU
arithmetic rounds, so a seed gives the same numbers on any x86-64 CPU with AVX2 (vendor, AVX-512 or not).
MKL and ATen read these variables at their first kernel, not at import, so :func:`apply` sets them as
defaults here (tests, ``bench/`` and every entry point start in the mode) and :func:`pin_numerics`, called
when a stage has read its params (``flows.common``), keeps them (``reproducible``: a conflicting variable the
user set is an error) or takes back the ones set here (``native``). Why these levels, and what they cost:
README ("Reproducible numbers").
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

REPRODUCIBLE_NUMERICS: dict[str, str] = {
    # MKL's conditional numerical reproducibility: the COMPATIBLE branch (SSE2 kernels) is the one MKL runs the
    # same on Intel and other vendors' CPUs (its AVX2/AVX512 branches fall back to AUTO on non-Intel CPUs), and
    # the one in which a row's GEMM result does not depend on its batch (codea1_core.models.cpu_numerics).
    "MKL_CBWR": "COMPATIBLE",
    "MKL_DYNAMIC": "FALSE",  # MKL's CNR condition: no run-time change of its thread count
    # ATen's vectorised element-wise kernels: AVX2 on every CPU that has it (AVX-512 CPUs would pick avx512,
    # whose wider vectors sum in another order); its own SLEEF maths, not the C library's, which varies
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN, where torch calls it on the CPU
}
"""The ``model.cpu_numerics: reproducible`` environment; ``native`` leaves all four to the CPU."""

NUMERICS_ENV = "CODEA1_CPU_NUMERICS"
"""``native``: :func:`apply` sets none of :data:`REPRODUCIBLE_NUMERICS` (a test session or benchmark on the CPU's
own kernels); a stage still follows its ``model.cpu_numerics`` when it reads its params."""

NUMERICS_SET_VAR = "CODEA1_NUMERICS_DEFAULTS"
"""Names of the :data:`REPRODUCIBLE_NUMERICS` variables set by :func:`apply` (not by the user): inherited by child
processes (``dvc repro`` from ``flows.pipeline``), so a stage in ``native`` mode can take them back there too."""

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


PREFECT_REUSE_ENV = "CODEA1_PREFECT_REUSE"
"""``0``: never reuse a Prefect server found on this machine's API port (:func:`running_api`)."""


def profile_api_url() -> str | None:
    """``PREFECT_API_URL`` of the active Prefect profile (``$PREFECT_PROFILES_PATH`` or
    ``$PREFECT_HOME/profiles.toml``; ``$PREFECT_PROFILE`` or the file's ``active``), read without importing
    Prefect; None when unset or unreadable."""
    import tomllib
    from pathlib import Path

    home = Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()
    path = Path(os.environ.get("PREFECT_PROFILES_PATH") or home / "profiles.toml").expanduser()
    try:
        profiles = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    active = os.environ.get("PREFECT_PROFILE") or profiles.get("active")
    url = (profiles.get("profiles") or {}).get(active or "", {}).get("PREFECT_API_URL")
    return str(url) if url else None


def local_api(timeout_s: float = 0.5) -> str | None:
    """``http://127.0.0.1:<port>/api`` when a Prefect server answers ``/api/health`` there (``port``:
    ``PREFECT_SERVER_API_PORT``, default 4200; ``codea1 ui``, ``prefect server start``), else None."""
    import json
    import urllib.request

    port = os.environ.get("PREFECT_SERVER_API_PORT", "4200").strip() or "4200"
    api = f"http://127.0.0.1:{port}/api"
    try:
        with urllib.request.urlopen(f"{api}/health", timeout=timeout_s) as response:
            healthy = response.status == 200 and json.loads(response.read(64) or b"null") is True
    except (OSError, ValueError):
        return None
    return api if healthy else None


def running_api() -> str | None:
    """The Prefect API a process started here uses: ``PREFECT_API_URL`` from the environment, else the active
    profile's (:func:`profile_api_url`), else a server answering on this machine (:func:`local_api`, unless
    ``CODEA1_PREFECT_REUSE=0``); None when none (Prefect then starts a temporary server)."""
    url = os.environ.get("PREFECT_API_URL") or profile_api_url()
    if url or os.environ.get(PREFECT_REUSE_ENV, "1").strip() == "0":
        return url
    return local_api()


def apply() -> None:
    """Set the environment defaults (explicit user settings win), export the Prefect API to use when one runs
    (:func:`running_api`) and filter known library noise."""
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
    api = running_api()
    if (
        api is not None
    ):  # (a profile's URL is set here too: the pipeline's children need no server of their own)
        os.environ.setdefault("PREFECT_API_URL", api)
    ours = _numerics_set_here()
    for key, value in REPRODUCIBLE_NUMERICS.items():
        if key not in os.environ and os.environ.get(NUMERICS_ENV, "").strip().lower() != "native":
            os.environ[key] = value
            ours.add(key)
    if ours:
        os.environ[NUMERICS_SET_VAR] = ",".join(sorted(ours))
    for message, category, module in _NOISE:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name in _QUIET_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(logging.WARNING)
        if _warnings_and_above not in logger.filters:
            logger.addFilter(_warnings_and_above)


def _numerics_set_here() -> set[str]:
    """The numerics variables this process (or its parent) set as defaults and nobody changed since."""
    names = os.environ.get(NUMERICS_SET_VAR, "").split(",")
    return {n for n in names if n in REPRODUCIBLE_NUMERICS and os.environ.get(n) == REPRODUCIBLE_NUMERICS[n]}


def pin_numerics(mode: str) -> None:
    """Make the environment match ``model.cpu_numerics`` before torch's first CPU kernel.

    ``reproducible``: every :data:`REPRODUCIBLE_NUMERICS` variable set (a differing value the user set raises
    :class:`~codea1_core.config.ConfigError` naming it), then, if torch already computed something, a check
    that MKL and ATen really run at those levels. ``native``: the defaults :func:`apply` set are taken back.
    """
    from codea1_core.config import ConfigError

    ours = _numerics_set_here()
    if mode == "native":
        for key in ours:
            del os.environ[key]
        os.environ.pop(NUMERICS_SET_VAR, None)
        return
    for key, want in REPRODUCIBLE_NUMERICS.items():
        if key not in os.environ:
            os.environ[key] = want
            ours.add(key)
        have = os.environ[key]
        if have.strip().upper() != want.upper():
            raise ConfigError(
                f"model.cpu_numerics: reproducible pins {key}={want}, but the environment sets {key}={have} "
                "(unset it, or run with model.cpu_numerics=native)"
            )
    if ours:
        os.environ[NUMERICS_SET_VAR] = ",".join(sorted(ours))
    import sys

    if "torch" in sys.modules:  # read back the levels (MKL's and ATen's first call fixes them)
        from codea1_core.models import cpu_numerics

        got = cpu_numerics.mkl_cbwr_branch()
        if got not in (None, REPRODUCIBLE_NUMERICS["MKL_CBWR"]):
            raise ConfigError(
                f"model.cpu_numerics: reproducible, but MKL already runs its {got} branch in this process "
                "(fixed at its first call, before these params were read): start a new process"
            )
        capability = sys.modules["torch"].backends.cpu.get_cpu_capability()
        if capability not in ("AVX2", "DEFAULT"):  # DEFAULT: a CPU without AVX2 (logged by the stage record)
            raise ConfigError(
                f"model.cpu_numerics: reproducible, but ATen already runs its {capability} kernels in this "
                "process (fixed at its first kernel, before these params were read): start a new process"
            )
