"""What the stages after training record on MLflow: the evaluation, the register decision, links to runs.

What it does: :func:`log_evaluation` puts the evaluation numbers on the training run (``eval/<key>``, once
per value: a re-evaluation with the same numbers appends nothing) and in an ``evaluate`` run nested under it
(with the report); :func:`log_to_run` logs a decision (metrics + a JSON
artifact) to a run without repeating a point a rerun already logged; :func:`record_run_id` keeps which run
trained which config in a training folder (outside its DVC outputs), :func:`training_run_id` is the run whose
export is evaluated (``final/DONE.json``) and :func:`run_link` its address in the MLflow UI.
What it does not: decide what is logged (``flows/evaluate.py``, ``flows/register.py``) or track training
(``tracking.runs``).

Tests: ``pytest tests/tracking/test_results.py``; ``tests/flows/test_register_rerun.py``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from codea1_core.atomic import write_json_atomic
from codea1_core.config import Config
from tracking import store


def log_to_run(
    cfg: Config, run_id: str | None, metrics: dict[str, float], data: dict[str, Any], name: str
) -> None:
    """Log a decision (metrics + a JSON artifact) to an existing run, or to a new one when ``run_id`` is None;
    a metric whose latest value is already this one is not logged again (register reruns)."""
    client = store.client(cfg)
    if run_id is None:
        run_id = client.create_run(store.experiment_id(client, cfg), run_name=name).info.run_id
    latest = client.get_run(run_id).data.metrics  # a rerun with the same numbers appends no second point
    for key, value in metrics.items():
        if store.is_number(value) and latest.get(key) != float(value):
            client.log_metric(run_id, key, float(value))
    client.log_dict(run_id, data, f"{name}.json")


RUNS_FILE = "mlflow_runs.json"
"""Which MLflow run trained which config in a training folder (``{config fingerprint: run id}``), beside the DVC
outputs, not inside one: a run id differs on every fresh run, so an output holding it would change ``dvc.lock``
whatever the run decides. Keyed by fingerprint, so a folder whose outputs another experiment restored (``dvc exp
apply``) finds that experiment's run, or none."""


def recorded_run_id(folder: str | Path, fingerprint: str) -> str | None:
    """The MLflow run recorded for ``fingerprint`` in ``folder`` (None when none is, or the file is unreadable)."""
    try:
        runs = json.loads((Path(folder) / RUNS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    run_id = runs.get(fingerprint) if isinstance(runs, dict) else None
    return run_id if isinstance(run_id, str) else None


def record_run_id(folder: str | Path, fingerprint: str, run_id: str | None) -> None:
    """Record ``run_id`` as the MLflow run of ``fingerprint`` in ``folder`` (atomic; None: nothing to record)."""
    if run_id is None:
        return
    path = Path(folder) / RUNS_FILE
    try:
        runs = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        runs = {}
    runs = runs if isinstance(runs, dict) else {}
    if runs.get(fingerprint) != run_id:
        write_json_atomic(path, {**runs, fingerprint: run_id}, fsync=True)


def training_run_id(cfg: Config) -> str | None:
    """The MLflow run of the training run whose export is evaluated: the config ``<checkpoint_dir>/final/DONE.json``
    names, looked up in the folder's :data:`RUNS_FILE`."""
    folder = Path(cfg.orchestration.checkpoint_dir)
    try:
        fingerprint = json.loads((folder / "final" / "DONE.json").read_text(encoding="utf-8")).get(
            "fingerprint"
        )
    except (OSError, ValueError, AttributeError):
        return None
    return recorded_run_id(folder, fingerprint) if isinstance(fingerprint, str) else None


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

    if not store.store_exists(cfg):
        return None
    try:
        experiment_id = store.client(cfg).get_run(run_id).info.experiment_id
    except MlflowException:
        return None
    return f"{MLFLOW_UI}/#/experiments/{experiment_id}/runs/{run_id}{MLFLOW_UI_VIEW}"


def log_evaluation(cfg: Config, metrics: dict[str, float], report: Path, train_run_id: str | None) -> str:
    """Evaluation numbers where training runs can be compared on them: on the training run itself (as
    ``eval/<key>`` at step 0, only the values that differ from its latest ones: evaluating the same export again
    appends nothing) and in an ``evaluate`` run nested under it (``mlflow.parentRunId``, with the report).
    Without a training run (a model dir evaluated on its own) only the standalone ``evaluate`` run is made.
    Returns the evaluate run's id."""
    from mlflow.entities import Metric

    client = store.client(cfg)
    tags = {"codea1.mode": cfg.mode, "mlflow.note.content": KEY_NOTE}  # the run's description in the UI
    name = "evaluate"
    if train_run_id is not None:
        parent = client.get_run(train_run_id)
        tags |= {"mlflow.parentRunId": train_run_id, "codea1.train_run_id": train_run_id}
        name = f"evaluate-{parent.info.run_name}"
    run_id = client.create_run(store.experiment_id(client, cfg), run_name=name, tags=tags).info.run_id
    now_ms = int(time.time() * 1000)
    clean = {k.replace("@", "_at_"): float(v) for k, v in metrics.items() if store.is_number(v)}
    rows = [Metric(k, v, now_ms, 0) for k, v in sorted(clean.items())]
    for i in range(0, len(rows), 1000):
        client.log_batch(run_id, metrics=rows[i : i + 1000])
    client.log_artifact(run_id, str(report), "eval")
    client.set_terminated(run_id)
    if train_run_id is not None:  # a re-evaluation with the same numbers appends no second point
        latest = parent.data.metrics
        on_train = [
            Metric(f"eval/{k}", v, now_ms, 0)
            for k, v in sorted(clean.items())
            if latest.get(f"eval/{k}") != v
        ]
        for i in range(0, len(on_train), 1000):
            client.log_batch(train_run_id, metrics=on_train[i : i + 1000])
        client.set_tag(train_run_id, "codea1.evaluate_run_id", run_id)
    return run_id
