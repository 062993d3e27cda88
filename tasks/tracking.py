"""Experiment tracking: the ONLY module that imports mlflow.

What it does: a :class:`Tracker` protocol with an MLflow implementation (:class:`MlflowTracker`: one run per
training run, flattened params, git/DVC tags, per-iteration metrics with ``step=iteration``, artifacts,
checkpoint registration as versions of ``codea1-code`` / ``codea1-test``) and a :class:`NullTracker` for tests
and ``tracking.backend: null``; plus the registry helpers the ``register`` stage uses (aliases).
What it does not: decide what to log (the train flow does) or when to promote (``flows/register.py``).

Resume safety: MLflow appends duplicate metric points, so the tracker reads the steps already logged under
``progress/iteration`` when it re-opens a run and silently skips them (``log_iteration`` is idempotent per step).

Store: ``cfg.tracking.tracking_uri`` (default ``sqlite:///mlflow/mlflow.db``; ``$MLFLOW_TRACKING_URI`` wins),
artifacts under ``cfg.tracking.artifact_location``. Browse with ``mlflow ui --backend-store-uri <uri>``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from prefect import task
from prefect.cache_policies import NO_CACHE

from codea1_core.config import Config

log = logging.getLogger(__name__)

STEP_KEY = "progress/iteration"
MODEL_NAMES = {"code": "codea1-code", "test": "codea1-test"}


class Tracker(Protocol):
    """What the train flow needs from experiment tracking."""

    run_id: str | None

    def logged_steps(self) -> set[int]: ...

    def log_iteration(self, step: int, metrics: dict[str, float]) -> bool: ...

    def log_table(self, rows: list[dict[str, Any]], artifact_file: str) -> None: ...

    def log_dict(self, data: dict[str, Any], artifact_file: str) -> None: ...

    def log_file(self, path: str | Path, artifact_dir: str) -> None: ...

    def register(self, role: str, model_dir: str | Path, step: int) -> str | None: ...

    def end(self, status: str = "FINISHED") -> None: ...


class NullTracker:
    """Records calls in memory; logs nothing anywhere (tests, ``tracking.backend: null``)."""

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.metrics: dict[int, dict[str, float]] = {}
        self.artifacts: list[str] = []
        self.registered: list[tuple[str, int]] = []
        self.status = "RUNNING"

    def logged_steps(self) -> set[int]:
        return set(self.metrics)

    def log_iteration(self, step: int, metrics: dict[str, float]) -> bool:
        if step in self.metrics:
            return False
        self.metrics[step] = dict(metrics)
        return True

    def log_table(self, rows: list[dict[str, Any]], artifact_file: str) -> None:
        self.artifacts.append(artifact_file)

    def log_dict(self, data: dict[str, Any], artifact_file: str) -> None:
        self.artifacts.append(artifact_file)

    def log_file(self, path: str | Path, artifact_dir: str) -> None:
        self.artifacts.append(f"{artifact_dir}/{Path(path).name}")

    def register(self, role: str, model_dir: str | Path, step: int) -> str | None:
        self.registered.append((role, step))
        return None

    def end(self, status: str = "FINISHED") -> None:
        self.status = status


def tracking_uri(cfg: Config) -> str:
    """The MLflow store: ``$MLFLOW_TRACKING_URI`` wins over ``tracking.tracking_uri``."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or cfg.tracking.tracking_uri
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return uri


def _client(cfg: Config):
    from mlflow.tracking import MlflowClient

    uri = tracking_uri(cfg)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
"""MLflow 3's UI opens an experiment of this kind on its runs (untagged ones open on an empty GenAI overview)."""


def _experiment_id(client: Any, cfg: Config) -> str:
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    if exp is not None:
        if "mlflow.experimentKind" not in (exp.tags or {}):
            for key, value in EXPERIMENT_KIND.items():
                client.set_experiment_tag(exp.experiment_id, key, value)
        return exp.experiment_id
    location = Path(cfg.tracking.artifact_location).resolve()
    location.mkdir(parents=True, exist_ok=True)
    return client.create_experiment(
        cfg.tracking.experiment, artifact_location=location.as_uri(), tags=EXPERIMENT_KIND
    )


def run_tags(repo_dir: str | Path = ".") -> dict[str, str]:
    """Git commit and DVC data hashes (from ``dvc.lock`` when present) as MLflow tags."""
    tags: dict[str, str] = {}
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=repo_dir,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        tags["git.commit"] = out.stdout.strip() if out.returncode == 0 else "none"
    except (OSError, subprocess.SubprocessError):
        tags["git.commit"] = "unknown"
    lock = Path(repo_dir) / "dvc.lock"
    if lock.is_file():
        import yaml

        stages = (yaml.safe_load(lock.read_text()) or {}).get("stages", {})
        for stage, body in stages.items():
            for out in body.get("outs", []) or []:
                digest = out.get("md5") or out.get("hash") or ""
                tags[f"dvc.{stage}.{out.get('path')}"] = str(digest)
    return tags


class MlflowTracker:
    """One MLflow run per training run, re-opened by id on resume."""

    def __init__(self, cfg: Config, run_id: str | None = None, run_name: str | None = None) -> None:
        from mlflow.entities import Param, RunTag

        self.cfg = cfg
        self.client = _client(cfg)
        if run_id is not None and self._run_exists(run_id):
            self.run_id = run_id
            self.client.update_run(run_id, status="RUNNING")
        else:
            exp_id = _experiment_id(self.client, cfg)
            run = self.client.create_run(exp_id, run_name=run_name, tags={"codea1.mode": cfg.mode})
            self.run_id = run.info.run_id
            params = [
                Param(k, json.dumps(v) if isinstance(v, list) else str(v)) for k, v in cfg.flat().items()
            ]
            tags = [RunTag(k, v) for k, v in run_tags().items()]
            from codea1_core.models.cpu_numerics import describe  # imports torch: only where a run starts

            tags += [RunTag(f"numerics.{k}", v) for k, v in describe(cfg.model.cpu_numerics).items()]
            for i in range(0, len(params), 100):  # MLflow caps a batch at 100 params
                self.client.log_batch(self.run_id, params=params[i : i + 100])
            self.client.log_batch(self.run_id, tags=tags)
        self.experiment_id = self.client.get_run(self.run_id).info.experiment_id
        self._steps = {int(m.step) for m in self.client.get_metric_history(self.run_id, STEP_KEY)}

    def _run_exists(self, run_id: str) -> bool:
        """Whether the run to resume is there; only "not found" means no. Any other store error (a locked
        sqlite file under load, a server hiccup) propagates: read as "absent" it would fork a second MLflow run
        and register every model again under it."""
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_run(run_id).info.lifecycle_stage == "active"
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return False
            raise

    def logged_steps(self) -> set[int]:
        return set(self._steps)

    def log_iteration(self, step: int, metrics: dict[str, float]) -> bool:
        """Log one iteration's metrics at ``step``; returns False (and logs nothing) if the step exists."""
        from mlflow.entities import Metric

        if step in self._steps:
            return False
        now_ms = int(time.time() * 1000)
        rows = [  # MLflow names cannot hold '@' (pass@k -> pass_at_k, as in flows/evaluate.py)
            Metric(k.replace("@", "_at_"), float(v), now_ms, step)
            for k, v in sorted(metrics.items())
            if _is_number(v)
        ]
        rows.append(Metric(STEP_KEY, float(step), now_ms, step))  # last: marks the step complete
        for i in range(0, len(rows), 1000):
            self.client.log_batch(self.run_id, metrics=rows[i : i + 1000])
        self._steps.add(step)
        return True

    def log_table(self, rows: list[dict[str, Any]], artifact_file: str) -> None:
        import pandas as pd

        self.client.log_table(self.run_id, pd.DataFrame(rows), artifact_file)

    def log_dict(self, data: dict[str, Any], artifact_file: str) -> None:
        self.client.log_dict(self.run_id, data, artifact_file)

    def log_file(self, path: str | Path, artifact_dir: str) -> None:
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_dir)
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_dir)

    def register(self, role: str, model_dir: str | Path, step: int) -> str | None:
        """Log an exported HF model dir as an MLflow 3 *logged model* (the Models tab; ``transformers`` flavour
        plus the chat ``python_function`` of :func:`add_chat_flavour`), linked to this run, and register it as
        a version of ``codea1-<role>`` (``mlflow.transformers.load_model("models:/codea1-code@champion")``
        loads it, ``mlflow models serve -m models:/codea1-code@champion`` serves it)."""
        import tempfile

        from mlflow.entities import LoggedModelStatus

        name = MODEL_NAMES[role]
        if self.cfg.tracking.register and (done := _registered(self.client, name, self.run_id, step)):
            return done  # a retried finish() (killed after registering): one version per completed run
        with tempfile.TemporaryDirectory(prefix="codea1-mlmodel-") as tmp:
            save_transformers_model(model_dir, Path(tmp) / "mlmodel", role, step)
            logged = self.client.create_logged_model(
                self.experiment_id, name=name, source_run_id=self.run_id, tags={"iteration": str(step)}
            )
            self.client.log_model_artifacts(logged.model_id, str(Path(tmp) / "mlmodel"))
            self.client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
        if not self.cfg.tracking.register:
            return None
        return register_version(self.client, name, self.run_id, logged.model_id, step, tracking_uri(self.cfg))

    def end(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


MODEL_CARD = """---
tags: [codea1, code-generation]
---
# {name}

The {role} LLM of a codea1 (Code-A1) co-evolution run, iteration {step}. Load it with
`mlflow.transformers.load_model("models:/{name}@champion")`, or download it and use
`AutoModelForCausalLM.from_pretrained(<download>/model)` (the tokenizer is in the same folder).
"""


def save_transformers_model(model_dir: str | Path, out: Path, role: str, step: int) -> Path:
    """An MLflow ``transformers``-flavour model (text-generation pipeline) in ``out`` from an HF model dir.

    Offline and quiet: the model card is ours (no Hub lookup), pip requirements are given (no probing of
    every installed package), and the tokenizer files are copied next to the weights too, so a download's
    ``model/`` folder also loads with plain ``from_pretrained``.
    """
    import shutil

    import mlflow.transformers
    from huggingface_hub import ModelCard
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    name = MODEL_NAMES[role]
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # "Loading weights" / "Writing model shards" bars stay off the console
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        mlflow.transformers.save_model(
            transformers_model={"model": model, "tokenizer": tokenizer},
            path=str(out),
            task="text-generation",
            pip_requirements=["torch", "transformers"],
            model_card=ModelCard(MODEL_CARD.format(name=name, role=role, step=step)),
        )
    finally:
        if was:
            hf_logging.enable_progress_bar()
    for item in (out / "components" / "tokenizer").iterdir():
        shutil.copy2(item, out / "model" / item.name)
    add_chat_flavour(out, role)
    return out


CHAT_LOADER = "codea1_chat_serving"
"""The pyfunc loader module's name inside a logged model (``code/``): :mod:`codea1_core.models.chat_serving`."""


def chat_config(role: str) -> dict[str, Any]:
    """The role's prompt format for serving, from the training prompts (§4): system line and user template."""
    from types import SimpleNamespace

    from codea1_core.method import prompts

    if role == "code":
        template = f"{prompts.CODE_INSTRUCTION}\n\nQuestion:\n{{content}}"
        return {"role": role, "system": prompts.CODE_SYSTEM, "user_template": template, "chat": True}
    stub = SimpleNamespace(entry_point="{entry_point}", description="{content}")
    messages = prompts.test_messages_blackbox(stub)  # type: ignore[arg-type]
    return {
        "role": role,
        "system": prompts.TEST_SYSTEM,
        "user_template": messages[1]["content"],
        "chat": True,
    }


def add_chat_flavour(out: Path, role: str) -> None:
    """Make a saved transformers-flavour model servable as a chat model (``mlflow models serve``).

    The ``transformers`` flavour stays (``mlflow.transformers.load_model`` still loads the pipeline); the
    ``python_function`` flavour is replaced by :mod:`codea1_core.models.chat_serving` (copied into ``code/``),
    with a signature (``messages`` in; ``text`` and ``code`` out), a params schema (``max_new_tokens``,
    ``temperature``) and the role's prompt format as its ``model_config``.
    """
    import shutil

    from mlflow.models import Model, ModelSignature
    from mlflow.types.schema import Array, ColSpec, DataType, Object, ParamSchema, ParamSpec, Property, Schema

    from codea1_core.models import chat_serving

    (out / "code").mkdir(exist_ok=True)
    shutil.copy2(chat_serving.__file__, out / "code" / f"{CHAT_LOADER}.py")
    model = Model.load(str(out / "MLmodel"))
    pyfunc = dict(model.flavors.get("python_function", {}))
    pyfunc.update(loader_module=CHAT_LOADER, code="code", data="model", model_config=chat_config(role))
    model.flavors["python_function"] = pyfunc
    message = Object([Property("role", DataType.string), Property("content", DataType.string)])
    model.signature = ModelSignature(
        inputs=Schema([ColSpec(Array(message), name="messages")]),
        outputs=Schema([ColSpec(DataType.string, name="text"), ColSpec(DataType.string, name="code")]),
        params=ParamSchema(
            [
                ParamSpec("max_new_tokens", DataType.long, chat_serving.DEFAULT_PARAMS["max_new_tokens"]),
                ParamSpec("temperature", DataType.double, chat_serving.DEFAULT_PARAMS["temperature"]),
            ]
        ),
    )
    model.save(str(out / "MLmodel"))


def _registered(client: Any, name: str, run_id: str, step: int) -> str | None:
    """The version of ``name`` already registered from ``run_id`` at iteration ``step``, if any."""
    from mlflow.exceptions import MlflowException

    try:
        existing = client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
    except MlflowException:
        return None
    for version in existing:
        if (version.tags or {}).get("iteration") == str(step):
            return str(version.version)
    return None


def register_version(client: Any, name: str, run_id: str, model_id: str, step: int, uri: str) -> str:
    """Create ``name`` if needed and add a version of the logged model ``model_id`` (source ``models:/<id>``:
    the version is linked to its logged model and run, and portable, where an absolute ``file://`` path would
    break when the store moves)."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name)
    except MlflowException as exc:
        if "already exists" not in str(exc).lower() and "RESOURCE_ALREADY_EXISTS" not in str(exc):
            raise
    if done := _registered(client, name, run_id, step):
        return done
    with _global_tracking_uri(uri):
        version = client.create_model_version(
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


def make_tracker(cfg: Config, run_id: str | None = None, run_name: str | None = None) -> Tracker:
    """``MlflowTracker`` or ``NullTracker`` from ``cfg.tracking.backend``."""
    if cfg.tracking.backend == "null":
        return NullTracker()
    return MlflowTracker(cfg, run_id=run_id, run_name=run_name)


# ------------------------------------------------------------------------------------------------
# Registry helpers for the register stage
# ------------------------------------------------------------------------------------------------


def latest_version(cfg: Config, name: str) -> dict[str, Any] | None:
    """The newest version of a registered model as ``{version, run_id}``, or None."""
    from mlflow.exceptions import MlflowException

    client = _client(cfg)
    try:
        versions = client.search_model_versions(f"name='{name}'")
    except MlflowException:
        return None
    if not versions:
        return None
    newest = max(versions, key=lambda v: int(v.version))
    return {"version": str(newest.version), "run_id": newest.run_id}


def alias_info(cfg: Config, name: str, alias: str) -> dict[str, Any] | None:
    """The version behind ``alias`` with its tags, or None."""
    from mlflow.exceptions import MlflowException

    client = _client(cfg)
    try:
        mv = client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None
    return {"version": str(mv.version), "tags": dict(mv.tags or {}), "run_id": mv.run_id}


REGISTRY_CACHE = Path("data/cache/models")
"""Where registry models are downloaded for ``solve`` / ``attack`` (``<name>-v<version>/``; git-ignored)."""


def _store_exists(cfg: Config) -> bool:
    """False for a local sqlite store that has no file yet (asking it would create an empty one)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or cfg.tracking.tracking_uri
    return not uri.startswith("sqlite:///") or Path(uri.removeprefix("sqlite:///")).is_file()


def registry_model_dir(cfg: Config, uri: str, cache: Path = REGISTRY_CACHE) -> str:
    """A local Hugging Face model folder for ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``.

    The version's ``model/`` folder (weights and tokenizer, see :func:`save_transformers_model`) is downloaded
    once into ``cache/NAME-vVERSION``; a URI the registry does not know is a ValueError naming it.
    """
    import mlflow.artifacts
    from mlflow.exceptions import MlflowException

    spec = uri.removeprefix("models:/")
    name, sep, alias = spec.partition("@")
    if not sep:
        name, _, version_id = spec.partition("/")
    client = _client(cfg)
    where = tracking_uri(cfg)
    try:
        mv = (
            client.get_model_version_by_alias(name, alias)
            if sep
            else client.get_model_version(name, version_id)
        )
    except MlflowException as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{uri}: not in the MLflow registry at {where} ({first})") from None
    folder = cache / f"{name}-v{mv.version}"
    found = sorted(folder.rglob("MLmodel")) if folder.is_dir() else []
    if not found:
        from codea1_core.atomic import atomic_dir

        location = client.get_model_version_download_uri(name, str(mv.version))
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
    if chosen is None and cfg.tracking.backend == "mlflow" and _store_exists(cfg):
        info = alias_info(cfg, MODEL_NAMES[role], "champion")
        if info is not None:
            chosen = f"models:/{MODEL_NAMES[role]}@champion"
    if chosen is None or not chosen.startswith("models:/"):
        return chosen, f"{role} model: {chosen or 'the workspace model'}"
    path = registry_model_dir(cfg, chosen)
    return path, f"{role} model: {chosen} ({path})"


def set_alias(cfg: Config, name: str, version: str, alias: str, tags: dict[str, str] | None = None) -> None:
    """Point ``alias`` at ``version`` and tag the version (e.g. with its evaluation number)."""
    client = _client(cfg)
    client.set_registered_model_alias(name, alias, version)
    for key, value in (tags or {}).items():
        client.set_model_version_tag(name, version, key, value)


def log_to_run(
    cfg: Config, run_id: str | None, metrics: dict[str, float], data: dict[str, Any], name: str
) -> None:
    """Log a decision (metrics + a JSON artifact) to an existing run, or to a new one when ``run_id`` is None;
    a metric whose latest value is already this one is not logged again (register reruns)."""
    client = _client(cfg)
    if run_id is None:
        run_id = client.create_run(_experiment_id(client, cfg), run_name=name).info.run_id
    latest = client.get_run(run_id).data.metrics  # a rerun with the same numbers appends no second point
    for key, value in metrics.items():
        if _is_number(value) and latest.get(key) != float(value):
            client.log_metric(run_id, key, float(value))
    client.log_dict(run_id, data, f"{name}.json")


def training_run_id(cfg: Config) -> str | None:
    """The MLflow run of the training run whose export is evaluated (``<checkpoint_dir>/final/DONE.json``)."""
    done = Path(cfg.orchestration.checkpoint_dir) / "final" / "DONE.json"
    try:
        return json.loads(done.read_text()).get("run_id")
    except (OSError, ValueError):
        return None


MLFLOW_UI = "http://127.0.0.1:5000"
"""Where ``codea1 ui`` / ``make ui`` serve the MLflow UI (the report's links point there)."""
MLFLOW_UI_VIEW = "?workflowType=machine_learning"
"""Appended to every MLflow UI link: MLflow 3.17's UI opens experiments in its global GenAI view (an empty traces
overview) whatever the experiment's ``mlflow.experimentKind`` tag says; this query opens the runs, and the UI keeps
it while navigating."""
KEY_NOTE = (
    "MLflow metric names cannot contain '@': pass@k, mut@k and avg@n are logged as pass_at_k, mut_at_k and "
    "avg_at_n (outputs/eval/metrics.json keeps the original keys)."
)


def run_link(cfg: Config, run_id: str) -> str | None:
    """The MLflow UI address of ``run_id`` (None when the store does not know it)."""
    from mlflow.exceptions import MlflowException

    if not _store_exists(cfg):
        return None
    try:
        experiment_id = _client(cfg).get_run(run_id).info.experiment_id
    except MlflowException:
        return None
    return f"{MLFLOW_UI}/#/experiments/{experiment_id}/runs/{run_id}{MLFLOW_UI_VIEW}"


def log_evaluation(cfg: Config, metrics: dict[str, float], report: Path, train_run_id: str | None) -> str:
    """Evaluation numbers where training runs can be compared on them: on the training run itself (as
    ``eval/<key>``) and in an ``evaluate`` run nested under it (``mlflow.parentRunId``, with the report).
    Without a training run (a model dir evaluated on its own) only the standalone ``evaluate`` run is made.
    Returns the evaluate run's id."""
    from mlflow.entities import Metric

    client = _client(cfg)
    tags = {"codea1.mode": cfg.mode, "mlflow.note.content": KEY_NOTE}  # the run's description in the UI
    name = "evaluate"
    if train_run_id is not None:
        parent = client.get_run(train_run_id)
        tags |= {"mlflow.parentRunId": train_run_id, "codea1.train_run_id": train_run_id}
        name = f"evaluate-{parent.info.run_name}"
    run_id = client.create_run(_experiment_id(client, cfg), run_name=name, tags=tags).info.run_id
    now_ms = int(time.time() * 1000)
    clean = {k.replace("@", "_at_"): float(v) for k, v in metrics.items() if _is_number(v)}
    rows = [Metric(k, v, now_ms, 0) for k, v in sorted(clean.items())]
    for i in range(0, len(rows), 1000):
        client.log_batch(run_id, metrics=rows[i : i + 1000])
    client.log_artifact(run_id, str(report), "eval")
    client.set_terminated(run_id)
    if train_run_id is not None:
        on_train = [Metric(f"eval/{k}", v, now_ms, 0) for k, v in sorted(clean.items())]
        for i in range(0, len(on_train), 1000):
            client.log_batch(train_run_id, metrics=on_train[i : i + 1000])
        client.set_tag(train_run_id, "codea1.evaluate_run_id", run_id)
    return run_id


# ------------------------------------------------------------------------------------------------
# The per-iteration logging task
# ------------------------------------------------------------------------------------------------


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
