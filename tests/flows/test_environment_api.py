"""A stage reuses a running Prefect API: the profile's, or a server answering on this machine's API port.

Regression: with ``codea1 ui`` (or ``prefect server start``) running, every stage ``dvc exp run`` ran started its
own temporary Prefect server (~20 s each) and its runs never showed in the running UI: only an exported
``PREFECT_API_URL`` was used. Each check runs a fresh interpreter that imports ``flows`` (every entry point does,
first) and reads the API its Prefect settings then hold.
"""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

PROBE = "import flows\nfrom prefect.settings import PREFECT_API_URL\nprint(PREFECT_API_URL.value())\n"


class _Health(http.server.BaseHTTPRequestHandler):
    """A stand-in for a Prefect server: ``GET /api/health`` answers ``true`` (what Prefect's does)."""

    def do_GET(self) -> None:  # noqa: N802 (the handler's API)
        ok = self.path == "/api/health"
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write(b"true" if ok else b"")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def answering_port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api_seen(tmp_path: Path, repo_root: Path, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_URL", "PREFECT_PROFILE"))}
    base |= {"PREFECT_HOME": str(tmp_path / "prefect_home"), "PYTHONPATH": str(repo_root)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=tmp_path,
        env=base | env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_a_server_answering_on_the_api_port_is_used(
    tmp_path: Path, repo_root: Path, answering_port: int
) -> None:
    api = f"http://127.0.0.1:{answering_port}/api"
    seen = _api_seen(
        tmp_path, repo_root, PREFECT_SERVER_API_PORT=str(answering_port), CODEA1_PREFECT_REUSE="1"
    )
    assert seen == api
    off = _api_seen(
        tmp_path, repo_root, PREFECT_SERVER_API_PORT=str(answering_port), CODEA1_PREFECT_REUSE="0"
    )
    assert off == "None"
    exported = _api_seen(
        tmp_path,
        repo_root,
        PREFECT_SERVER_API_PORT=str(answering_port),
        CODEA1_PREFECT_REUSE="1",
        PREFECT_API_URL="http://127.0.0.1:9/api",
    )
    assert exported == "http://127.0.0.1:9/api"  # the user's own setting wins


def test_nothing_answering_leaves_prefect_to_start_its_own(tmp_path: Path, repo_root: Path) -> None:
    seen = _api_seen(
        tmp_path, repo_root, PREFECT_SERVER_API_PORT=str(_closed_port()), CODEA1_PREFECT_REUSE="1"
    )
    assert seen == "None"


def test_the_active_profiles_api_is_exported_for_the_stages(tmp_path: Path) -> None:
    """``make run``'s runner starts no temporary server when the active profile names an API."""
    from flows.environment import profile_api_url, running_api

    home = tmp_path / "prefect_home"
    home.mkdir()
    (home / "profiles.toml").write_text(
        'active = "team"\n[profiles.team]\nPREFECT_API_URL = "http://10.0.0.5:4200/api"\n'
        '[profiles.other]\nPREFECT_API_URL = "http://10.0.0.6:4200/api"\n'
    )
    env = {"PREFECT_HOME": str(home), "CODEA1_PREFECT_REUSE": "0"}
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PREFECT_API_URL", raising=False)
        mp.delenv("PREFECT_PROFILES_PATH", raising=False)
        mp.delenv("PREFECT_PROFILE", raising=False)
        for key, value in env.items():
            mp.setenv(key, value)
        assert profile_api_url() == running_api() == "http://10.0.0.5:4200/api"
        mp.setenv("PREFECT_PROFILE", "other")
        assert running_api() == "http://10.0.0.6:4200/api"
        (home / "profiles.toml").write_text('active = "team"\n[profiles.team]\n')
        assert running_api() is None
