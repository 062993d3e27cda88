"""Servers the project starts on a port it picks survive that port being taken before they bind it.

Regression: CI failed with ``[Errno 98] error while attempting to bind on address ('127.0.0.1', 37723): address
already in use`` from ``tools.ui_check``'s Prefect server. Ports were picked with ``bind(0)``, from the kernel's
ephemeral range, which every outgoing connection on the machine draws from too; nothing retried. Now
:func:`flows.prefect_server.free_port` picks outside that range and both starters (``make run``'s
:func:`~flows.prefect_server.shared_api`, the UI check's :func:`~tools.ui_check.servers`) start again on another
port when the server says its port was in use. Here the first port each is given is held by a listening socket.
"""

from __future__ import annotations

import contextlib
import os
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows import prefect_server
from flows.prefect_server import _ephemeral_range, free_port, port_taken


def test_free_ports_lie_outside_the_ephemeral_range_and_are_bindable() -> None:
    low, high = _ephemeral_range()
    ports = {free_port() for _ in range(50)}
    assert len(ports) > 40  # drawn at random, not one fixed port
    for port in ports:
        assert not low <= port <= high
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_port_taken_reads_the_servers_own_words(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(
        "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 1): address already in use\n"
    )
    assert port_taken(log)
    log.write_text(
        "Port 10719 is already in use. Please specify a different port with the `--port` \nflag.\n"
    )
    assert port_taken(log)
    log.write_text("Traceback ...\nModuleNotFoundError: No module named 'prefect'\n")
    assert not port_taken(log)
    assert not port_taken(tmp_path / "missing.log")


@contextlib.contextmanager
def _held_first(monkeypatch: pytest.MonkeyPatch, module: object) -> Iterator[socket.socket]:
    """``module.free_port`` gives a port a listening socket holds first, then free ones."""
    held = socket.socket()
    held.bind(("127.0.0.1", free_port()))
    held.listen()
    given = [held.getsockname()[1]]
    monkeypatch.setattr(module, "free_port", lambda: given.pop() if given else free_port())
    try:
        yield held
    finally:
        held.close()


@pytest.mark.e2e
def test_shared_api_starts_again_on_another_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    with _held_first(monkeypatch, prefect_server) as held:
        with prefect_server.shared_api() as api_url:
            assert f":{held.getsockname()[1]}/" not in api_url
            with urllib.request.urlopen(f"{api_url}/health", timeout=5) as response:
                assert response.status == 200
        assert "PREFECT_API_URL" not in os.environ


@pytest.mark.e2e
def test_ui_check_servers_start_again_on_other_ports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tools import ui_check

    with _held_first(monkeypatch, prefect_server) as held:
        with ui_check.servers(tmp_path, timeout_s=300) as (prefect_url, mlflow_url, _):
            assert not prefect_url.endswith(f":{held.getsockname()[1]}")
            assert not mlflow_url.endswith(f":{held.getsockname()[1]}")
            for url in (f"{prefect_url}/api/health", f"{mlflow_url}/health"):
                with urllib.request.urlopen(url, timeout=5) as response:
                    assert response.status == 200
