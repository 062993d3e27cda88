"""``make ui`` / ``codea1 ui``: start the Prefect server UI and the MLflow UI on 127.0.0.1.

Both run as child processes of this command, each in its own process group, and stop with it: Ctrl-C
(SIGINT), SIGTERM and SIGHUP all stop both servers and everything they started (workers), then this command
exits. The Prefect UI talks to the API on the same ``--prefect-port``: the child gets ``PREFECT_API_URL`` /
``PREFECT_SERVER_UI_API_URL`` for that port, overriding an exported ``PREFECT_API_URL`` for another one (which
would leave the UI unable to reach its API). Each server's URL is printed once it answers its health check
(MLflow's first start migrates its store: a minute or more). Runs started elsewhere appear in this UI when their
``PREFECT_API_URL`` points at it (printed below).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from codea1_core.config import ConfigError, load_config

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stop(Exception):
    """Raised by the signal handler: leave the wait loop and stop the servers."""


def _bin(name: str) -> str:
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else (shutil.which(name) or name)


def prefect_env(port: int) -> dict[str, str]:
    """The Prefect server child's environment: its UI and clients use the API on ``port``."""
    api = f"http://127.0.0.1:{port}/api"
    return {
        **os.environ,
        "PREFECT_SERVER_API_HOST": "127.0.0.1",
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_API_URL": api,
        "PREFECT_SERVER_UI_API_URL": api,
    }


def commands(prefect_port: int, mlflow_port: int, tracking_uri: str, artifacts: str) -> list[list[str]]:
    """The two server command lines."""
    return [
        [_bin("prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(prefect_port)],
        [
            _bin("mlflow"),
            "ui",
            "--host",
            "127.0.0.1",
            "--port",
            str(mlflow_port),
            "--backend-store-uri",
            tracking_uri,
            "--default-artifact-root",
            artifacts,
            "--workers",  # uvicorn restarts a worker that misses its 5 s ping: several never answer on a busy box
            "1",
        ],
    ]


def stop(procs: list[subprocess.Popen], grace_s: float = 15.0) -> None:
    """SIGINT each server's process group, wait up to ``grace_s``, then SIGKILL what is left."""
    for p in procs:
        _signal_group(p, signal.SIGINT)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        _signal_group(p, signal.SIGKILL)  # workers the server left behind go too
        if p.poll() is None:
            p.wait(timeout=10)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _raise_stop(signum: int, frame: Any) -> None:
    raise Stop(signal.Signals(signum).name)


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something already listens on ``host:port`` (checked before starting, for a one-line error)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def answers(url: str) -> bool:
    """Whether ``url`` answers HTTP 200 now (a server's health check; 1 s timeout, no proxy)."""
    import urllib.request

    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def absolute_sqlite(uri: str) -> str:
    """``sqlite:///mlflow/mlflow.db`` -> ``sqlite:////abs/.../mlflow/mlflow.db``: valid from any folder."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri.removeprefix("sqlite:///")).resolve())
    return uri


def start_uis(params: str, prefect_port: int, mlflow_port: int) -> int:
    """Start both servers, print their URLs, wait until a signal or a server exits, stop both."""
    try:
        cfg = load_config(params) if Path(params).exists() else None
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for port, flag in ((prefect_port, "--prefect-port"), (mlflow_port, "--mlflow-port")):
        if port_in_use(port):
            print(
                f"error: port {port} on 127.0.0.1 is in use (another `codea1 ui`?): stop it or pass {flag} N",
                file=sys.stderr,
            )
            return 2
    tracking_uri = absolute_sqlite(
        os.environ.get("MLFLOW_TRACKING_URI")
        or (cfg.tracking.tracking_uri if cfg else "sqlite:///mlflow/mlflow.db")
    )
    artifacts = cfg.tracking.artifact_location if cfg else "mlflow/artifacts"
    Path("mlflow").mkdir(exist_ok=True)
    # both inherit flows.environment's defaults (applied when flows was imported); Prefect's gets its port
    envs = [prefect_env(prefect_port), dict(os.environ)]
    previous = {sig: signal.signal(sig, _raise_stop) for sig in STOP_SIGNALS}
    procs: list[subprocess.Popen] = []
    stopped = False
    try:
        for cmd, env in zip(commands(prefect_port, mlflow_port, tracking_uri, artifacts), envs, strict=True):
            procs.append(subprocess.Popen(cmd, env=env, start_new_session=True))
        api = prefect_env(prefect_port)["PREFECT_API_URL"]
        from tracking.results import MLFLOW_UI_VIEW  # (the runs' view, not MLflow 3's GenAI overview)

        announce = {  # each server's lines, printed once it answers its health check
            f"http://127.0.0.1:{prefect_port}/api/health": [
                f"Prefect UI: http://127.0.0.1:{prefect_port}   (export PREFECT_API_URL={api})"
            ],
            f"http://127.0.0.1:{mlflow_port}/health": [
                f"MLflow UI:  http://127.0.0.1:{mlflow_port}/#/experiments{MLFLOW_UI_VIEW}    (store: {tracking_uri})",
                f"MLflow CLI (mlflow models serve, mlflow runs ...): export MLFLOW_TRACKING_URI={tracking_uri}",
            ],
        }
        print("starting the Prefect and MLflow servers (each URL is printed once it answers)", flush=True)
        while all(p.poll() is None for p in procs):
            for url in [u for u in announce if answers(u)]:
                print("\n".join(announce.pop(url)), flush=True)
                if not announce:
                    print("Ctrl-C (or SIGTERM) stops both.", flush=True)
            time.sleep(0.5)
    except Stop:
        stopped = True  # asked to stop: both servers going down is success
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop(procs)
    failed = [p.args[0] for p in procs if p.returncode not in (0, -signal.SIGINT, 130, None)]
    return 0 if stopped or not failed else 1


def main(argv: list[str] | None = None) -> int:
    """``codea1 ui [--prefect-port N] [--mlflow-port N] [--params FILE]``."""
    parser = argparse.ArgumentParser(
        prog="codea1 ui", description="Start the Prefect and MLflow UIs on 127.0.0.1 (Ctrl-C stops both)."
    )
    parser.add_argument(
        "--prefect-port", type=int, default=4200, help="Prefect UI and API port (default 4200)"
    )
    parser.add_argument("--mlflow-port", type=int, default=5000, help="MLflow UI port (default 5000)")
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    args = parser.parse_args(argv)
    return start_uis(args.params, args.prefect_port, args.mlflow_port)


if __name__ == "__main__":
    raise SystemExit(main())
