"""The training run's tracker: one MLflow run per training run, and a null stand-in with the same methods.

What it does: a :class:`Tracker` protocol with an MLflow implementation (:class:`MlflowTracker`: one run per
training run, flattened params, git/DVC tags (:func:`run_tags`; under ``dvc exp run`` the experiment's name
and baseline revision, :func:`dvc_experiment`, the name also ending the run's name), per-iteration metrics with
``step=iteration``, artifacts, the final models logged and registered as versions of ``codea1-code`` /
``codea1-test``) and a :class:`NullTracker` for tests and ``tracking.backend: null``; :func:`make_tracker`
picks one from the config.
What it does not: decide what to log (the train flow does) or when to promote (``flows/register.py``).

Resume safety: MLflow appends duplicate metric points, so the tracker reads the steps already logged under
``progress/iteration`` when it re-opens a run and skips them (``log_iteration`` is idempotent per step).

Tests: ``pytest tests/tracking/test_runs.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Protocol

from codea1_core.config import Config
from tracking import packaging
from tracking.registry import MODEL_NAMES, register_version, registered_version
from tracking.store import client, experiment_id, is_number, tracking_uri

STEP_KEY = "progress/iteration"


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


def dvc_experiment() -> dict[str, str]:
    """The DVC experiment this process runs in, as MLflow tags: ``dvc exp run`` gives its stages
    ``DVC_EXP_NAME`` and ``DVC_EXP_BASELINE_REV`` (the commit it derives from); ``{}`` outside one."""
    names = {"DVC_EXP_NAME": "dvc.exp.name", "DVC_EXP_BASELINE_REV": "dvc.exp.baseline_rev"}
    return {tag: os.environ[var] for var, tag in names.items() if os.environ.get(var)}


def experiment_run_name(run_name: str | None) -> str | None:
    """``run_name`` with the DVC experiment's name appended under ``dvc exp run``: two experiments of the same
    params (``train-codea1-seed1-alpha0.25``) get two names."""
    exp = os.environ.get("DVC_EXP_NAME")
    return f"{run_name}-{exp}" if run_name and exp else run_name


class MlflowTracker:
    """One MLflow run per training run, re-opened by id on resume."""

    def __init__(self, cfg: Config, run_id: str | None = None, run_name: str | None = None) -> None:
        from mlflow.entities import Param, RunTag

        self.cfg = cfg
        self.client = client(cfg)
        if run_id is not None and self._run_exists(run_id):
            self.run_id = run_id
            self.client.update_run(run_id, status="RUNNING")
        else:
            exp_id = experiment_id(self.client, cfg)
            created = {"codea1.mode": cfg.mode, **dvc_experiment()}
            run = self.client.create_run(exp_id, run_name=experiment_run_name(run_name), tags=created)
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
            if is_number(v)
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
        plus the chat ``python_function`` of :func:`tracking.packaging.add_chat_flavour`), linked to this run,
        and register it as a version of ``codea1-<role>``
        (``mlflow.transformers.load_model("models:/codea1-code@champion")``
        loads it, ``mlflow models serve -m models:/codea1-code@champion`` serves it)."""
        import tempfile

        from mlflow.entities import LoggedModelOutput, LoggedModelStatus

        name = MODEL_NAMES[role]
        if self.cfg.tracking.register and (done := registered_version(self.client, name, self.run_id, step)):
            return done  # a retried finish() (killed after registering): one version per completed run
        with tempfile.TemporaryDirectory(prefix="codea1-mlmodel-") as tmp:
            packaging.save_transformers_model(model_dir, Path(tmp) / "mlmodel", role, step)
            logged = self.client.create_logged_model(
                self.experiment_id, name=name, source_run_id=self.run_id, tags={"iteration": str(step)}
            )
            self.client.log_model_artifacts(logged.model_id, str(Path(tmp) / "mlmodel"))
            self.client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
            # the run page's "Logged models" lists the run's model outputs, not models naming it as their source
            self.client.log_outputs(self.run_id, [LoggedModelOutput(logged.model_id, step)])
        if not self.cfg.tracking.register:
            return None
        return register_version(self.client, name, self.run_id, logged.model_id, step, tracking_uri(self.cfg))

    def end(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)


def make_tracker(cfg: Config, run_id: str | None = None, run_name: str | None = None) -> Tracker:
    """``MlflowTracker`` or ``NullTracker`` from ``cfg.tracking.backend``."""
    if cfg.tracking.backend == "null":
        return NullTracker()
    return MlflowTracker(cfg, run_id=run_id, run_name=run_name)
