"""The ``register`` stage: promote the trained models to ``champion`` only when their evaluation beats it.

What it does: reads the evaluation (``<eval.out_dir>/metrics.json``) and the model versions the train stage
registered (``<checkpoint_dir>/final/DONE.json``); judges each role on its own metric (higher is better): the
Code LLM on ``eval.promote_metric``, the Test LLM on ``eval.promote_metric_test``. A version becomes
``champion`` only when its number strictly beats the current champion's (or there is none) AND its own warm
start's (``warmstart/<metric>``, when the warm start was evaluated); otherwise ``candidate``. The numbers and the
reason are tagged on the version, logged to the training run and written to ``outputs/register.json``
(atomically). Each role is judged in a task run, ``judge[<role>]`` (``tasks/register.py``, where the rule is).
What it does not: train, evaluate, or register new versions (the train stage does).

Run: ``python -m flows.register [--params params.yaml] [key=value ...]`` or ``codea1 register``.
"""

from __future__ import annotations

if __name__ == "__main__":  # refused params: one line, before the imports below load Prefect and torch
    from flows.common import check_params_first

    check_params_first("register")

import json
import math
from pathlib import Path
from typing import Any

from prefect import flow

from codea1_core.atomic import write_json_atomic
from codea1_core.config import Config
from flows.common import (
    UserError,
    flow_config,
    flow_run_name,
    resolve_run_dir,
    stage_checks,
    stage_main,
    stage_task,
)
from tasks.register import judge
from tracking.registry import MODEL_NAMES, latest_version
from tracking.results import log_to_run, training_run_id

DECISION_PATH = Path("outputs/register.json")


def metric_value(metrics: dict[str, Any], name: str, source: Path) -> float:
    """``name`` from a flat (``{"code/x/pass@1": ..}``) or nested (``{"code": {"x": ..}}``) metrics dict."""
    if name in metrics:
        value = metrics[name]
    else:
        value = metrics
        for part in name.split("/"):
            if not isinstance(value, dict) or part not in value:
                raise UserError(f"{source}: metric {name!r} (eval.promote_metric) not found")
            value = value[part]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise UserError(f"{source}: metric {name!r} is not a number: {value!r}")
    return float(value)


def warmstart_value(metrics: dict[str, Any], name: str) -> float | None:
    """The warm start's number of metric ``name`` (``warmstart/<name>``), None when the warm start was not
    evaluated."""
    base = metrics.get(f"warmstart/{name}")
    return float(base) if isinstance(base, (int, float)) and not isinstance(base, bool) else None


def promote_metrics(cfg: Config) -> dict[str, str]:
    """Each role's own promotion metric: the Code LLM's ``eval.promote_metric``, the Test LLM's
    ``eval.promote_metric_test`` (default: its validity pass@k on the first test source)."""
    test = cfg.eval.promote_metric_test
    if not test and cfg.eval.test_sources:
        test = f"test/{cfg.eval.test_sources[0]}/pass@{cfg.eval.tests_per_suite}"
    return {"code": cfg.eval.promote_metric, "test": test}


@flow(name="register", flow_run_name=flow_run_name)
def register_flow(
    params: str = "params.yaml", overrides: list[str] | None = None, run_dir: str = ""
) -> dict[str, Any]:
    """Prefect entry point (DVC stage, CLI, the pipeline deployment): :func:`register`; with ``run_dir`` the
    run folder's evaluation and training are judged and the decision is written to ``<run_dir>/register.json``."""
    from flows.console import failure_line

    folder = resolve_run_dir(run_dir)
    out_path = folder / DECISION_PATH.name if folder is not None else DECISION_PATH
    cfg = flow_config(params, overrides, str(folder or ""))
    try:
        return register(cfg, out_path=out_path)
    except Exception as exc:  # a disk or MLflow store failure: one line naming it
        line = failure_line(exc, cfg, then="rerun the register stage")
        if line is None:
            raise
        raise UserError(line) from None


def _versions(cfg: Config, done: dict[str, Any] | None) -> dict[str, str]:
    """The versions the train stage registered (``DONE.json``); without one, the newest of each model.

    A run's DONE.json is authoritative: a golden run registers no Test LLM, and an older ``codea1-test``
    version must then not be re-judged against this run's numbers.
    """
    if done is not None:
        return {role: str(v) for role, v in (done.get("versions") or {}).items() if v is not None}
    found = {}
    for role, name in MODEL_NAMES.items():
        latest = latest_version(cfg, name)
        if latest:
            found[role] = latest["version"]
    return found


def register(cfg: Config, eval_path: Path | None = None, out_path: Path = DECISION_PATH) -> dict[str, Any]:
    """Judge each role on its own metric, set aliases, log and write the decision; returns it."""
    eval_path = eval_path or Path(cfg.eval.out_dir) / "metrics.json"
    if not eval_path.is_file():
        raise UserError(f"{eval_path}: not found; run the evaluate stage first")
    try:
        metrics = json.loads(eval_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{eval_path}: invalid JSON ({exc})") from None
    done_path = Path(cfg.orchestration.checkpoint_dir) / "final" / "DONE.json"
    done = json.loads(done_path.read_text()) if done_path.is_file() else None
    versions = _versions(cfg, done)
    if not versions:
        raise UserError(
            "no registered model versions found: run the train stage with tracking.register: true"
        )
    targets = promote_metrics(cfg)
    models = {}
    for role, version in versions.items():  # a role's numbers are read just before it is judged
        metric = targets[role]
        new, warm = metric_value(metrics, metric, eval_path), warmstart_value(metrics, metric)
        models[role] = stage_task(judge, cfg, role, version, metric, new, warm)
    code = models.get("code") or next(iter(models.values()))
    decision: dict[str, Any] = {
        "metric": code["metric"],
        "new": code["new"],
        "models": models,
        "decision": code["alias"],
        "champion_value": code["champion_value"],
    }
    numbers: dict[str, float] = {
        "register/new": code["new"],
        "register/promoted": float(code["alias"] == "champion"),
    }
    for role, m in models.items():
        numbers[f"register/{role}/new"] = m["new"]
        numbers[f"register/{role}/promoted"] = float(m["alias"] == "champion")
        if m["champion_value"] is not None:
            numbers[f"register/{role}/champion"] = m["champion_value"]
    log_to_run(cfg, training_run_id(cfg), numbers, decision, "register")
    write_json_atomic(out_path, decision, fsync=True)
    return decision


def run(params: str = "params.yaml", overrides: list[str] | None = None) -> dict[str, Any]:
    """DVC/CLI entry point: one line per role with its metric, the numbers compared and the decision (the MLflow
    store probed first: an unusable one is one line, not minutes of retries)."""
    from flows.common import stage_config
    from flows.console import quiet_user_error_tracebacks
    from tracking.store import TrackingUnavailable, probe_if_used

    quiet_user_error_tracebacks()  # a store or disk failure: its one line, not Prefect's traceback
    try:
        probe_if_used(stage_config(params, overrides))
    except TrackingUnavailable as exc:
        raise UserError(str(exc)) from None
    decision = register_flow(params=params, overrides=list(overrides or []))
    for role, m in decision["models"].items():
        print(f"register {role}: {m['metric']} -> {m['alias']} ({m['reason']})")
    return decision


if __name__ == "__main__":
    raise SystemExit(
        stage_main(
            run,
            "Register trained models; promote to champion if the evaluation beats it",
            checks=stage_checks("register"),
        )
    )
