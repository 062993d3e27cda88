"""The MLflow model registry: versions of ``codea1-code`` / ``codea1-test``, their aliases, local copies.

What it does: :func:`register_version` adds a logged model as a version (once per run and iteration:
:func:`registered_version` finds one already there); :func:`latest_version`, :func:`alias_info` and
:func:`set_alias` are what the register stage reads and moves (``champion`` / ``candidate``);
:func:`registry_model_dir` downloads a ``models:/`` URI once into ``data/cache/models`` and :func:`cli_model`
is the model ``codea1 solve`` / ``codea1 attack`` use (a flag, the config, else the registry's champion).
What it does not: package a model (``tracking.packaging``) or decide a promotion (``flows/register.py``).

Tests: ``pytest tests/tracking/test_registry.py``; the stage in ``tests/flows/test_register.py``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from codea1_core.config import Config
from tracking.store import client, store_exists, tracking_uri

MODEL_NAMES = {"code": "codea1-code", "test": "codea1-test"}
"""The registered model of each role."""


def registered_version(mlflow_client: Any, name: str, run_id: str, step: int) -> str | None:
    """The version of ``name`` already registered from ``run_id`` at iteration ``step``, if any."""
    from mlflow.exceptions import MlflowException

    try:
        existing = mlflow_client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
    except MlflowException:
        return None
    for version in existing:
        if (version.tags or {}).get("iteration") == str(step):
            return str(version.version)
    return None


def register_version(mlflow_client: Any, name: str, run_id: str, model_id: str, step: int, uri: str) -> str:
    """Create ``name`` if needed and add a version of the logged model ``model_id`` (source ``models:/<id>``:
    the version is linked to its logged model and run, and portable, where an absolute ``file://`` path would
    break when the store moves)."""
    from mlflow.exceptions import MlflowException

    try:
        mlflow_client.create_registered_model(name)
    except MlflowException as exc:
        if "already exists" not in str(exc).lower() and "RESOURCE_ALREADY_EXISTS" not in str(exc):
            raise
    if done := registered_version(mlflow_client, name, run_id, step):
        return done
    with _global_tracking_uri(uri):
        version = mlflow_client.create_model_version(
            name, f"models:/{model_id}", run_id=run_id, tags={"iteration": str(step)}, model_id=model_id
        )
    return str(version.version)


@contextlib.contextmanager
def _global_tracking_uri(uri: str) -> Iterator[None]:
    """MLflow's sqlite registry looks a ``models:/<id>`` source up through the process-global tracking URI, not
    the client's (a TODO in its store): set it for the block, then restore it and ``MLFLOW_TRACKING_URI``
    (which ``mlflow.set_tracking_uri`` also exports) exactly as they were."""
    import mlflow
    from mlflow.tracking._tracking_service import utils as tracking_utils

    saved_global, saved_env = tracking_utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        tracking_utils._tracking_uri = saved_global
        if saved_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = saved_env


def latest_version(cfg: Config, name: str) -> dict[str, Any] | None:
    """The newest version of a registered model as ``{version, run_id}``, or None."""
    from mlflow.exceptions import MlflowException

    mlflow_client = client(cfg)
    try:
        versions = mlflow_client.search_model_versions(f"name='{name}'")
    except MlflowException:
        return None
    if not versions:
        return None
    newest = max(versions, key=lambda v: int(v.version))
    return {"version": str(newest.version), "run_id": newest.run_id}


def alias_info(cfg: Config, name: str, alias: str) -> dict[str, Any] | None:
    """The version behind ``alias`` with its tags, or None."""
    from mlflow.exceptions import MlflowException

    mlflow_client = client(cfg)
    try:
        mv = mlflow_client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None
    return {"version": str(mv.version), "tags": dict(mv.tags or {}), "run_id": mv.run_id}


def set_alias(cfg: Config, name: str, version: str, alias: str, tags: dict[str, str] | None = None) -> None:
    """Point ``alias`` at ``version`` and tag the version (e.g. with its evaluation number)."""
    mlflow_client = client(cfg)
    mlflow_client.set_registered_model_alias(name, alias, version)
    for key, value in (tags or {}).items():
        mlflow_client.set_model_version_tag(name, version, key, value)


REGISTRY_CACHE = Path("data/cache/models")
"""Where registry models are downloaded for ``solve`` / ``attack`` (``<name>-v<version>/``; git-ignored)."""


def registry_model_dir(cfg: Config, uri: str, cache: Path = REGISTRY_CACHE) -> str:
    """A local Hugging Face model folder for ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``.

    The version's ``model/`` folder (weights and tokenizer, see
    :func:`tracking.packaging.save_transformers_model`) is downloaded once into ``cache/NAME-vVERSION``; a URI
    the registry does not know is a ValueError naming it.
    """
    import mlflow.artifacts
    from mlflow.exceptions import MlflowException

    spec = uri.removeprefix("models:/")
    name, sep, alias = spec.partition("@")
    if not sep:
        name, _, version_id = spec.partition("/")
    mlflow_client = client(cfg)
    where = tracking_uri(cfg)
    try:
        mv = (
            mlflow_client.get_model_version_by_alias(name, alias)
            if sep
            else mlflow_client.get_model_version(name, version_id)
        )
    except MlflowException as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{uri}: not in the MLflow registry at {where} ({first})") from None
    folder = cache / f"{name}-v{mv.version}"
    found = sorted(folder.rglob("MLmodel")) if folder.is_dir() else []
    if not found:
        from codea1_core.atomic import atomic_dir

        location = mlflow_client.get_model_version_download_uri(name, str(mv.version))
        with atomic_dir(folder) as tmp:
            mlflow.artifacts.download_artifacts(artifact_uri=location, dst_path=str(tmp), tracking_uri=where)
        found = sorted(folder.rglob("MLmodel"))
    if not found:
        raise ValueError(f"{uri}: version {mv.version} has no MLmodel file (not a model codea1 registered)")
    return str(found[0].parent / "model")


def cli_model(cfg: Config, role: str, override: str | None) -> tuple[str | None, str]:
    """The model ``solve`` / ``attack`` use for ``role`` and a note saying which.

    ``--<role>-model`` (a folder, a hub id or a ``models:/`` URI), else ``eval.<role>_model``, else the
    registry's ``champion`` of ``codea1-<role>`` when the store has one, else None (the evaluate stage's
    choice: the workspace's trained export, then the configured start model).
    """
    chosen = override or (cfg.eval.code_model if role == "code" else cfg.eval.test_model) or None
    if chosen is None and cfg.tracking.backend == "mlflow" and store_exists(cfg):
        info = alias_info(cfg, MODEL_NAMES[role], "champion")
        if info is not None:
            chosen = f"models:/{MODEL_NAMES[role]}@champion"
    if chosen is None or not chosen.startswith("models:/"):
        return chosen, f"{role} model: {chosen or 'the workspace model'}"
    path = registry_model_dir(cfg, chosen)
    return path, f"{role} model: {chosen} ({path})"
