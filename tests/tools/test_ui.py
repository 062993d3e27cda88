"""``codea1 ui``: the Prefect UI reaches its API on --prefect-port, and SIGTERM stops both servers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import free_port

from tools.ui import prefect_env


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_prefect_child_env_follows_the_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: with PREFECT_API_URL exported for :4200, `--prefect-port 4301` served a UI
    pointing at :4200."""
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    env = prefect_env(4301)
    assert env["PREFECT_SERVER_UI_API_URL"] == env["PREFECT_API_URL"] == "http://127.0.0.1:4301/api"
    assert env["PREFECT_SERVER_API_PORT"] == "4301"


@pytest.mark.e2e
@pytest.mark.slow
def test_ui_api_url_follows_port_and_sigterm_stops_both(tmp_path: Path, repo_root: Path) -> None:
    import httpx

    pp, mp = free_port(), free_port()
    env = dict(
        os.environ,
        PREFECT_HOME=str(tmp_path / "ph"),
        PREFECT_API_URL="http://127.0.0.1:4200/api",
        PYTHONPATH=str(repo_root),
    )
    code = f"from tools.ui import start_uis; raise SystemExit(start_uis('none.yaml', {pp}, {mp}))"
    out = tmp_path / "ui.out"
    with out.open("w") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-c", code], cwd=tmp_path, env=env, stdout=stdout, start_new_session=True
        )
    import psutil

    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 240
        while "MLflow UI:" not in out.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, "servers did not come up"
            time.sleep(0.2)
        # printed only once it answers (it printed its URL a minute before MLflow answered)
        assert httpx.get(f"http://127.0.0.1:{mp}/health", timeout=5).status_code == 200
        while not (_listening(pp) and _listening(mp)):
            assert proc.poll() is None and time.monotonic() < deadline, "servers did not come up"
            time.sleep(1)
        children = psutil.Process(proc.pid).children(recursive=True)
        settings = httpx.get(f"http://127.0.0.1:{pp}/ui-settings", timeout=10).json()
        assert settings["api_url"] == f"http://127.0.0.1:{pp}/api"
        proc.send_signal(signal.SIGTERM)  # the parent only: it must stop its children
        assert proc.wait(60) == 0
        deadline = time.monotonic() + 30
        while (_listening(pp) or _listening(mp)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _listening(pp) and not _listening(mp), "a server survived SIGTERM"
    finally:  # whatever happened, nothing this test started keeps running
        for child in children:
            if child.is_running():
                child.kill()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
