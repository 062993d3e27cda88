"""The ``register`` stage: promote the trained models to ``champion`` only when their evaluation beats it.

What it does: reads the evaluation (``<eval.out_dir>/metrics.json``, metric ``eval.promote_metric``, higher is
better) and the model versions the train stage registered (``<checkpoint_dir>/final/DONE.json``); for each of
``codea1-code`` / ``codea1-test`` sets the alias ``champion`` when the new number beats the current champion's
(or there is none), otherwise ``candidate``. Both numbers and the decision are tagged on the version, logged to
the training run and written to ``outputs/register.json`` (atomically).
What it does not: train, evaluate, or register new versions (the train stage does).

Run: ``python -m flows.register [--params params.yaml] [key=value ...]`` or ``codea1 register``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from prefect import flow

from codea1_core.config import Config
from flows.common import UserError, stage_main
from tasks.checkpoint import write_json_atomic
from tasks.tracking import MODEL_NAMES, alias_info, latest_version, log_to_run, set_alias

DECISION_PATH = Path("outputs/register.json")
TAG = "eval.promote_value"


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


def decide(new: float, champion: float | None) -> str:
    """``champion`` when there is none or the new number is strictly higher, else ``candidate``."""
    return "champion" if champion is None or new > champion else "candidate"


@flow(name="register")
def register_flow(config: dict) -> dict[str, Any]:
    """Prefect flow wrapping :func:`register`."""
    return register(Config.from_dict(config, source="config"))


def register(cfg: Config, eval_path: Path | None = None, out_path: Path = DECISION_PATH) -> dict[str, Any]:
    """Compare, set aliases, log and write the decision; returns it (``eval_path``: ``<eval.out_dir>/metrics.json``)."""
    eval_path = eval_path or Path(cfg.eval.out_dir) / "metrics.json"
    if not eval_path.is_file():
        raise UserError(f"{eval_path}: not found; run the evaluate stage first")
    try:
        metrics = json.loads(eval_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{eval_path}: invalid JSON ({exc})") from None
    new = metric_value(metrics, cfg.eval.promote_metric, eval_path)
    done_path = Path(cfg.orchestration.checkpoint_dir) / "final" / "DONE.json"
    done = json.loads(done_path.read_text()) if done_path.is_file() else {}
    decision: dict[str, Any] = {"metric": cfg.eval.promote_metric, "new": new, "models": {}}
    for role, name in MODEL_NAMES.items():
        version = (done.get("versions") or {}).get(role)
        if version is None:
            latest = latest_version(cfg, name)
            version = latest["version"] if latest else None
        if version is None:
            continue
        current = alias_info(cfg, name, "champion")
        champ = float(current["tags"][TAG]) if current and TAG in current["tags"] else None
        if current and current["version"] == str(version):
            champ = None  # re-running register on the same version: keep it champion
        alias = decide(new, champ)
        set_alias(
            cfg, name, str(version), alias, {TAG: repr(new), "eval.promote_metric": cfg.eval.promote_metric}
        )
        decision["models"][role] = {"version": str(version), "alias": alias, "champion_value": champ}
    if not decision["models"]:
        raise UserError(
            "no registered model versions found: run the train stage with tracking.register: true"
        )
    code = decision["models"].get("code", {})
    decision["decision"] = code.get("alias", "candidate")
    decision["champion_value"] = code.get("champion_value")
    numbers = {"register/new": new, "register/promoted": float(decision["decision"] == "champion")}
    if decision["champion_value"] is not None:
        numbers["register/champion"] = decision["champion_value"]
    log_to_run(cfg, done.get("run_id"), numbers, decision, "register")
    write_json_atomic(out_path, decision)
    return decision


def run(cfg: Config) -> dict[str, Any]:
    """DVC/CLI entry point."""
    decision = register_flow(config=cfg.to_dict())
    champ = decision.get("champion_value")
    print(
        f"register: {cfg.eval.promote_metric} = {decision['new']:.4f} vs champion "
        f"{'none' if champ is None else f'{champ:.4f}'} -> {decision['decision']}"
    )
    return decision


if __name__ == "__main__":
    raise SystemExit(
        stage_main(run, "Register trained models; promote to champion if the evaluation beats it")
    )
