"""``make ui`` / ``codea1 ui``: start the Prefect server UI and the MLflow UI on 127.0.0.1.

Both run as child processes of this command and stop with it (Ctrl-C). Runs started while the Prefect
server is up appear in its UI when ``PREFECT_API_URL`` points at it (printed below).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from codea1_core.config import ConfigError, load_config


def _bin(name: str) -> str:
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else (shutil.which(name) or name)


def start_uis(params: str, prefect_port: int, mlflow_port: int) -> int:
    try:
        cfg = load_config(params) if Path(params).exists() else None
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or (
        cfg.tracking.tracking_uri if cfg else "sqlite:///mlflow/mlflow.db"
    )
    artifacts = cfg.tracking.artifact_location if cfg else "mlflow/artifacts"
    Path("mlflow").mkdir(exist_ok=True)
    env = dict(os.environ)  # with flows.environment's defaults (applied when flows was imported)
    procs = [
        subprocess.Popen(
            [_bin("prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(prefect_port)], env=env
        ),
        subprocess.Popen(
            [
                _bin("mlflow"), "ui", "--host", "127.0.0.1", "--port", str(mlflow_port),
                "--backend-store-uri", tracking_uri, "--default-artifact-root", artifacts,
            ],
            env=env,
        ),
    ]  # fmt: skip
    print(
        f"Prefect UI: http://127.0.0.1:{prefect_port}   (export PREFECT_API_URL=http://127.0.0.1:{prefect_port}/api)"
    )
    print(f"MLflow UI:  http://127.0.0.1:{mlflow_port}    (store: {tracking_uri})")
    print("Ctrl-C stops both.", flush=True)
    try:
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
    failed = [p.args[0] for p in procs if p.returncode not in (0, -signal.SIGINT, 130, None)]
    return 1 if failed else 0
