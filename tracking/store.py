"""The MLflow store: its URI, a client, the experiment, and a probe that fails fast when it is unusable.

What it does: :func:`tracking_uri` (``$MLFLOW_TRACKING_URI`` wins over ``tracking.tracking_uri``; the folder
of a relative sqlite file is created), :func:`client`, :func:`experiment_id` (created with its artifact
location and the tag MLflow 3's UI reads), :func:`is_number` (what the store takes as a metric), and
:func:`probe_store` / :func:`probe_if_used`: a real write into the store and its artifact folder, within
seconds, raising :class:`TrackingUnavailable` with one line naming the URI or folder; :func:`store_failure`: the
one line for a store that fails later, under a running stage (locked, read-only, deleted, corrupt, full).
What it does not: log anything (``tracking.runs``, ``tracking.results``) or touch the registry
(``tracking.registry``).

Browse the store with ``mlflow ui --backend-store-uri <uri>`` (``codea1 ui``).
Tests: ``pytest tests/tracking``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from codea1_core.config import Config


def tracking_uri(cfg: Config) -> str:
    """The MLflow store: ``$MLFLOW_TRACKING_URI`` wins over ``tracking.tracking_uri``."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or cfg.tracking.tracking_uri
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return uri


def client(cfg: Config):
    """An ``MlflowClient`` on the store (tracking and registry alike)."""
    from mlflow.tracking import MlflowClient

    uri = tracking_uri(cfg)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def store_exists(cfg: Config) -> bool:
    """False for a local sqlite store that has no file yet (asking it would create an empty one)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or cfg.tracking.tracking_uri
    return not uri.startswith("sqlite:///") or Path(uri.removeprefix("sqlite:///")).is_file()


EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
"""MLflow 3's UI opens an experiment of this kind on its runs (untagged ones open on an empty GenAI overview)."""


def experiment_id(mlflow_client: Any, cfg: Config) -> str:
    """The id of ``tracking.experiment``; created, with artifacts under ``tracking.artifact_location``, when
    missing."""
    exp = mlflow_client.get_experiment_by_name(cfg.tracking.experiment)
    if exp is not None:
        if "mlflow.experimentKind" not in (exp.tags or {}):
            for key, value in EXPERIMENT_KIND.items():
                mlflow_client.set_experiment_tag(exp.experiment_id, key, value)
        return exp.experiment_id
    location = Path(cfg.tracking.artifact_location).resolve()
    location.mkdir(parents=True, exist_ok=True)
    return mlflow_client.create_experiment(
        cfg.tracking.experiment, artifact_location=location.as_uri(), tags=EXPERIMENT_KIND
    )


def is_number(value: Any) -> bool:
    """Whether ``value`` can be logged as an MLflow metric (a real number, not a bool, not NaN)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


class TrackingUnavailable(RuntimeError):
    """The MLflow store cannot be used; the message is one line naming the URI or file."""


def probe_store(cfg: Config, timeout_s: float = 5.0) -> None:
    """Fail fast (within ~``timeout_s``) when the MLflow store is unreachable, locked or read-only, or its local
    artifact folder is not writable (real writes: ``os.access`` and ``BEGIN IMMEDIATE`` pass on a read-only
    filesystem).

    Why: MLflow's own client retries an unreachable server for minutes and a locked sqlite file for ~100 s,
    printing a traceback per retry; this check runs before any work so the user gets one line instead.
    """
    import sqlite3
    import urllib.error
    import urllib.request

    uri = tracking_uri(cfg)
    if uri.startswith(("http://", "https://")):
        try:
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s).close()
        except urllib.error.HTTPError:
            return  # it answered (an older server without /health): reachable
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise TrackingUnavailable(
                f"MLflow store {uri} unreachable ({reason}): start it, fix MLFLOW_TRACKING_URI / "
                "tracking.tracking_uri, or set tracking.backend=null"
            ) from None
    elif uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///"))
        if not path.exists():
            _probe_folder(path.parent, f"MLflow store {path}: folder")  # sqlite creates the file there
        else:
            try:
                con = sqlite3.connect(str(path), timeout=timeout_s)
                try:
                    con.execute("BEGIN IMMEDIATE")  # needs the write lock, as every MLflow write does
                    con.execute("CREATE TABLE codea1_write_probe (x)")  # a real write: read-only fails here
                    con.execute("ROLLBACK")
                finally:
                    con.close()
            except sqlite3.Error as exc:
                raise TrackingUnavailable(f"MLflow store {path}: {exc}") from None
    artifacts = Path(cfg.tracking.artifact_location)
    if "://" not in cfg.tracking.artifact_location:
        _probe_folder(artifacts, f"MLflow artifacts {artifacts}: folder")


def _probe_folder(folder: Path, what: str) -> None:
    """Create ``folder`` if needed and write and delete a file in it (``os.access`` says yes to root even on a
    read-only filesystem)."""
    from codea1_core.atomic import write_bytes_atomic

    probe = folder / f".codea1-write-probe.{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(probe, b"probe")
        probe.unlink()
    except OSError as exc:
        raise TrackingUnavailable(f"{what} {folder} is not writable ({exc.strerror or exc})") from None


def probe_if_used(cfg: Config) -> None:
    """:func:`probe_store` when the config tracks to MLflow (``tracking.backend: mlflow``): every stage that talks
    to MLflow calls this first (MLflow's own client retries an unusable store for minutes)."""
    if cfg.tracking.backend == "mlflow":
        probe_store(cfg)


_SQLITE_CAUSES = (
    (
        "database is locked",
        "stayed locked by another process through every retry",
        "stop the process writing to it",
    ),
    ("readonly database", "is read-only", "make the file and its folder writable"),
    ("database or disk is full", "cannot grow: its disk is full", "free space on that disk"),
    (
        "disk image is malformed",
        "is corrupt",
        "restore it from a backup or point tracking.tracking_uri at a new store",
    ),
    (
        "file is not a database",
        "is corrupt",
        "restore it from a backup or point tracking.tracking_uri at a new store",
    ),
    (
        "no such table",
        "was deleted or replaced while the stage ran (its tables are gone)",
        "restore it from a backup",
    ),
    ("unable to open database file", "cannot be opened", "check that its folder exists and is writable"),
)
"""sqlite's message -> what happened to the store, what to do about it."""


def store_failure(exc: BaseException, cfg: Config) -> str | None:
    """One line for an MLflow store that failed under a running stage (``exc`` or what caused it): the store's
    URI, what happened to it and what to do (``the MLflow store (sqlite:///...) is read-only (sqlite: attempt to
    write a readonly database); make the file and its folder writable``); None when ``exc`` is no store failure.

    sqlite reports a store file deleted under an open connection as "attempt to write a readonly database": a
    file that is gone is named as deleted. A disk error of the artifact folder is an ``OSError`` naming its path,
    left to the caller's disk-error line.
    """
    import sqlite3

    uri = tracking_uri_text(cfg)
    seen: BaseException | None = exc
    mlflow_text = None
    while seen is not None:
        if isinstance(seen, sqlite3.Error):
            text = str(seen).splitlines()[0] if str(seen) else type(seen).__name__
            what, fix = _sqlite_cause(text, uri)
            return f"the MLflow store ({uri}) {what} (sqlite: {text}); {fix}"
        if mlflow_text is None and type(seen).__name__ == "MlflowException":
            mlflow_text = (str(seen).splitlines() or [type(seen).__name__])[0][:200]
        seen = seen.__cause__ or seen.__context__
    if mlflow_text is not None:
        return f"the MLflow store ({uri}) failed ({mlflow_text}); check it is reachable and writable"
    return None


def _sqlite_cause(text: str, uri: str) -> tuple[str, str]:
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return (
            "was deleted while the stage ran",
            "restore the file from a backup, or rerun to start a new store",
        )
    for needle, what, fix in _SQLITE_CAUSES:
        if needle in text:
            return what, fix
    return "failed", "check the file and its disk"


def tracking_uri_text(cfg: Config) -> str:
    """The store's URI as :func:`tracking_uri` gives it, without creating its folder (a failure message must not
    write)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or cfg.tracking.tracking_uri
