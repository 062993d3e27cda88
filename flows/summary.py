"""Printed at the end of ``make run``: the headline numbers and where to look at the results.

Reads only files the pipeline wrote (``outputs/``, ``dvc.lock``); never fails the run — a missing piece
is reported as missing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from codea1_core.config import ConfigError, load_config


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def main(params: str = "params.yaml") -> int:
    try:
        cfg = load_config(params)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    train_dir = Path(cfg.orchestration.checkpoint_dir)
    eval_metrics = _read_json(Path("outputs/eval/metrics.json"))
    train_summary = _read_json(train_dir / "summary.json")
    register = _read_json(Path("outputs/register.json"))

    print("\n=== codea1: results ===")
    if train_summary:
        keys = sorted(k for k in train_summary if isinstance(train_summary[k], (int, float, str)))
        print("training:   " + ", ".join(f"{k}={_fmt(train_summary[k])}" for k in keys[:12]))
    if eval_metrics:
        print("evaluation:")
        for key in sorted(eval_metrics):
            if isinstance(eval_metrics[key], (int, float)):
                print(f"  {key:48s} {_fmt(eval_metrics[key])}")
    else:
        print("evaluation: outputs/eval/metrics.json not found")
    if register:
        print("registry:   " + ", ".join(f"{k}={_fmt(v)}" for k, v in register.items() if not isinstance(v, dict)))
    print("\nWhere to look:")
    print(f"  MLflow runs + registry : make ui -> http://127.0.0.1:5000  (store: {cfg.tracking.tracking_uri})")
    print("  registered models      : codea1-code, codea1-test (aliases: champion / candidate)")
    print("  DVC metrics and plots  : .venv/bin/dvc metrics show ; .venv/bin/dvc plots show")
    print("  HTML report            : outputs/eval/report.html")
    print(f"  checkpoints + book     : {train_dir}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:2]))
