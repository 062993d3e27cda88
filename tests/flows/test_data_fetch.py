"""``codea1 data fetch``: pinned releases, sha256 checked, atomic, resumable, one line on failure.

Downloads run against a real loopback HTTP server (``http.server``) serving fixture files: a good file, one
whose connection is cut half way (the next request, with ``Range``, gets the rest), one with the wrong bytes,
and a 404. No test touches the network.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from codea1_core.config import Config, resolve_data_dir
from flows import data
from flows.data import RELEASES, Release

BODY = b'{"task_id": "HumanEval/0"}\n' * 4000  # ~100 kB: several reads


class Handler(BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}
    cut_once: set[str] = set()
    ranges: list[str] = []

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        name = self.path.rsplit("/", 1)[-1]
        if name not in self.files:
            self.send_error(404, "Not Found")
            return
        body = self.files[name]
        start = 0
        if rng := self.headers.get("Range"):
            self.ranges.append(rng)
            start = int(rng.removeprefix("bytes=").split("-")[0])
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        if name in self.cut_once:  # promise the whole body, send half, hang up
            self.cut_once.discard(name)
            self.wfile.write(body[start : start + (len(body) - start) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body[start:])


@pytest.fixture()
def server() -> Iterator[str]:
    Handler.files, Handler.cut_once, Handler.ranges = {}, set(), []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/files"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture()
def fixture_release(monkeypatch: pytest.MonkeyPatch) -> Release:
    """HumanEval+'s entry pinned to the fixture body (the real pins are checked against the offline copies)."""
    release = Release(
        "humanevalplus",
        "HumanEvalPlus-v0.1.10.jsonl.gz",
        "unused",
        hashlib.sha256(BODY).hexdigest(),
        len(BODY),
    )
    monkeypatch.setitem(RELEASES, "humanevalplus", release)
    return release


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def test_fetch_checks_the_sum_and_writes_the_file_and_its_sums(
    server: str, fixture_release: Release, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Handler.files[fixture_release.file] = BODY
    assert data.main(["fetch", "humanevalplus", "--dir", str(tmp_path / "d"), "--mirror", server]) == 0
    assert (tmp_path / "d" / "humanevalplus" / fixture_release.file).read_bytes() == BODY
    assert f"- {fixture_release.file} {fixture_release.sha256}" in (tmp_path / "d" / "README.md").read_text()
    assert "humanevalplus: " in capsys.readouterr().out


def test_a_cut_download_is_resumed_with_range(server: str, fixture_release: Release, tmp_path: Path) -> None:
    Handler.files[fixture_release.file] = BODY
    Handler.cut_once.add(fixture_release.file)
    path = data.fetch("humanevalplus", tmp_path, server)
    assert path.read_bytes() == BODY
    assert Handler.ranges == [f"bytes={len(BODY) // 2}-"], "the second request must resume, not restart"
    assert _left(tmp_path) == [fixture_release.file]  # no .part left behind


def test_a_cut_download_left_by_a_failed_run_is_resumed_by_the_next(
    server: str,
    fixture_release: Release,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    Handler.files[fixture_release.file] = BODY
    Handler.cut_once.add(fixture_release.file)
    args = ["fetch", "humanevalplus", "--dir", str(tmp_path), "--mirror", server]
    monkeypatch.setattr(data, "ATTEMPTS", 1)
    assert data.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "connection cut" in err[0] and "to resume" in err[0], err
    assert not (tmp_path / "humanevalplus" / fixture_release.file).exists()
    assert _left(tmp_path) == [f".{fixture_release.file}.part"]
    assert data.main(args) == 0
    assert (tmp_path / "humanevalplus" / fixture_release.file).read_bytes() == BODY
    assert Handler.ranges == [f"bytes={len(BODY) // 2}-"]


def test_a_bad_checksum_writes_nothing(
    server: str, fixture_release: Release, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Handler.files[fixture_release.file] = BODY.replace(b"0", b"1")
    assert data.main(["fetch", "humanevalplus", "--dir", str(tmp_path), "--mirror", server]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sha256" in err[0] and "nothing written" in err[0], err
    assert _left(tmp_path) == []


def test_a_404_is_one_line_and_writes_nothing(
    server: str, fixture_release: Release, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert data.main(["fetch", "humanevalplus", "--dir", str(tmp_path), "--mirror", server]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "HTTP 404" in err[0] and "humanevalplus" in err[0], err
    assert _left(tmp_path) == []


def test_the_pins_are_the_offline_releases(shared_data_dir: Path) -> None:
    """The pinned sha256 and sizes are those of the upstream files CI reads from the offline folder."""
    for release in RELEASES.values():
        path = shared_data_dir / release.folder / release.file
        assert path.stat().st_size == release.size, release.file
        assert hashlib.sha256(path.read_bytes()).hexdigest() == release.sha256, release.file


def test_fetched_benchmarks_are_the_default_data_folder(
    server: str, shared_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real files through a loopback mirror into ``data/benchmarks``, then loaded without CODEA1_DATA_DIR."""
    from codea1_core.data.datasets import load_source

    for release in RELEASES.values():
        Handler.files[release.file] = (shared_data_dir / release.folder / release.file).read_bytes()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CODEA1_DATA_DIR", raising=False)
    assert data.main(["fetch", "--mirror", server]) == 0
    cfg = Config()
    assert resolve_data_dir(cfg) == Path("data/benchmarks")
    assert len(load_source("humanevalplus", "test", cfg, resolve_data_dir(cfg))) == 164
    assert len(load_source("mbppplus", "test", cfg, resolve_data_dir(cfg))) == 378
    monkeypatch.setenv("CODEA1_DATA_DIR", str(shared_data_dir))  # the variable still wins
    assert resolve_data_dir(cfg) == shared_data_dir


def test_an_unreachable_server_tries_every_benchmark_and_names_the_offline_route(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a failed fetch stopped at the first benchmark, named a ``.part`` file that did not exist,
    left an empty folder behind and gave no offline way (which file to put where)."""
    import socket

    with socket.socket() as sock:  # a port nothing listens on: connection refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setattr(data, "ATTEMPTS", 1)
    target = tmp_path / "d"
    assert data.main(["fetch", "--dir", str(target), "--mirror", f"http://127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert [line.split(":")[1].strip() for line in err] == list(RELEASES), err  # one line per benchmark
    for line, release in zip(err, RELEASES.values(), strict=True):
        assert ".part" not in line, line
        assert (
            f"download {release.url} elsewhere and copy it to {target / release.folder / release.file}"
            in line
        )
    assert not target.exists()  # no empty folder left behind
