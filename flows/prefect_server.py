"""One Prefect API for a whole pipeline run, instead of a temporary server per DVC stage.

Without ``PREFECT_API_URL``, every ``python -m flows.<stage>`` process starts Prefect's ephemeral API
itself (seconds on a small machine, longer the first time: the database is created and migrated).
``make run`` runs five stages, so :func:`shared_api` starts one ``prefect server start`` (no UI) on a free
loopback port, exports its URL to the child processes, and stops it when the block ends, also on Ctrl-C or
SIGTERM. The server runs as the child of a guard process (:mod:`flows.guard`), which outlives a killed runner
just long enough to stop the running stage before the server (the stage's runs end while their API answers).

Services (:data:`SERVICES_ENV`): Prefect 3 clients report task runs as *events*; the server's task-run recorder
turns them into the task runs the UI and API show, and the event persister stores the events (the run's event
feed). Both run here; the services this pipeline does not use (scheduler, late runs, triggers and automations,
foreman, repossessor, cancellation cleanup, pause expirations, database vacuum, telemetry) stay off, so the
start-up cost stays that of ``--no-services`` — which, though, records no task run at all (every stage's flow
run said "did not generate any task or subflow runs"). The server writes to the same database as the ephemeral API
(``$PREFECT_HOME``), so every run still shows in the Prefect UI afterwards (``make ui``).

What it does not: replace a server the user runs — with ``PREFECT_API_URL`` already set (exported, or set by
:func:`flows.environment.apply` from the active profile or a server answering on this machine: ``codea1 ui``)
it uses that one and starts nothing.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

STARTUP_TIMEOUT_S = 180.0
"""A first start creates and migrates the database: far slower than later ones on a small machine."""
STOP_TIMEOUT_S = 10.0


SERVICES_ENV = {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED": "true",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED": "true",
    "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false",
    "PREFECT_SERVER_SERVICES_LATE_RUNS_ENABLED": "false",
    "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "false",
    "PREFECT_SERVER_SERVICES_FOREMAN_ENABLED": "false",
    "PREFECT_SERVER_SERVICES_REPOSSESSOR_ENABLED": "false",
    "PREFECT_SERVER_SERVICES_CANCELLATION_CLEANUP_ENABLED": "false",
    "PREFECT_SERVER_SERVICES_PAUSE_EXPIRATIONS_ENABLED": "false",
    "PREFECT_SERVER_SERVICES_DB_VACUUM_ENABLED": "false",
    "PREFECT_SERVER_SERVICES_CLEANUP_RECONCILER_ENABLED": "false",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
}
"""The server's environment additions: record task runs and events, nothing else in the background."""


class ServerStartError(RuntimeError):
    """The Prefect server did not answer its health check in time (the message carries its log's tail)."""


ADDRESS_IN_USE = "already in use"
"""What a server's log says when its port was taken between :func:`free_port` and its bind: uvicorn's "[Errno 98]
... address already in use", ``prefect server start``'s own check "Port N is already in use"."""
START_ATTEMPTS = 3


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49152, 65535  # IANA's dynamic range: BSD, macOS, Windows


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` free now, for a server started next.

    Chosen outside the kernel's ephemeral range when it can be: every outgoing connection on the machine takes
    its local port from that range, so a port picked there (``bind(0)``) can be taken before the server binds it.
    A port outside it can still be taken by another server: starters retry on :data:`ADDRESS_IN_USE`.
    """
    low, high = _ephemeral_range()
    candidates = [p for p in range(10_000, 65_536) if not low <= p <= high]
    rng = random.SystemRandom()
    for port in rng.sample(candidates, min(64, len(candidates))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_taken(log: Path) -> bool:
    """Whether a server that exited says in ``log`` that its port was in use (start it again on another)."""
    try:
        return ADDRESS_IN_USE in log.read_text(errors="replace").lower()
    except OSError:
        return False


def _healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no server log)"


def die_with_parent() -> None:
    """In a child process (before exec: the server, the stage guard): get SIGTERM when the pipeline process
    dies, even by SIGKILL.

    Linux only (``prctl(PR_SET_PDEATHSIG)``); elsewhere the ``finally`` clause of :func:`shared_api` is all.
    """
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


GUARD = str(Path(__file__).with_name("guard.py"))
"""The runner's guard (:mod:`flows.guard`), run as a script (standard library only)."""


class Guard:
    """The guard process of this runner: it starts the temporary server as its own child and, should the runner
    die, stops the running stage's process group first, then the server (:mod:`flows.guard`)."""

    def __init__(self, proc: subprocess.Popen, api_url: str = "") -> None:
        self.proc = proc
        self.api_url = api_url

    def stage_group(self, pgid: int | None) -> None:
        """Tell the guard which process group runs a stage now (None: none)."""
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.write(f"group {'-' if pgid is None else pgid}\n".encode())
            self.proc.stdin.flush()

    def close(self, timeout_s: float) -> None:
        """EOF on the guard's stdin: it stops the server, removes its log and exits (killed after ``timeout_s``)."""
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # the server gets SIGTERM from the kernel (it dies with its parent)
            self.proc.wait()


_GUARD: Guard | None = None
"""The guard of the server :func:`shared_api` runs, while it runs (``flows.pipeline.run_child`` reports to it)."""


def active_guard() -> Guard | None:
    return _GUARD


def guard_preexec() -> None:
    """In a guard (before exec): SIGTERM when the runner dies, and SIGTERM blocked until the guard's handler is
    installed (a runner killed while the guard starts up would otherwise kill the guard instead)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    die_with_parent()


def dvc_root(start: Path | None = None) -> Path | None:
    """The DVC repository this process runs in (the first folder upwards with a ``.dvc``), if any."""
    here = (start or Path.cwd()).resolve()
    return next((p for p in (here, *here.parents) if (p / ".dvc").is_dir()), None)


@contextlib.contextmanager
def shared_api(timeout_s: float = STARTUP_TIMEOUT_S, stop_timeout_s: float = 120.0) -> Iterator[str]:
    """Yield a Prefect API URL valid for the block; start (and finally stop) a local server if none is set.

    ``PREFECT_API_URL`` is set in ``os.environ`` for the block, so child processes started inside it
    (``dvc repro`` and the stages it runs) all talk to the same API. The server is the child of a guard
    process (:class:`Guard`): when this process dies, even by SIGKILL, the guard stops the running stage first
    (up to ``stop_timeout_s``: it ends its runs while the API still answers), then the server, and removes the
    server's log; the log is removed on every ending.
    """
    global _GUARD
    existing = os.environ.get("PREFECT_API_URL")
    if existing:
        yield existing
        return
    guard, log = _start_server(timeout_s, stop_timeout_s)
    try:
        os.environ["PREFECT_API_URL"] = guard.api_url
        _GUARD = guard
        yield guard.api_url
    finally:
        _GUARD = None
        os.environ.pop("PREFECT_API_URL", None)
        guard.close(STOP_TIMEOUT_S + 5)
        log.unlink(missing_ok=True)


def _start_server(timeout_s: float, stop_timeout_s: float) -> tuple[Guard, Path]:
    """Start the guard and its server on a free port and wait until the API answers; on a port taken between
    the pick and the bind, again on another (:data:`START_ATTEMPTS` in all). Returns the guard and the log."""
    root = dvc_root()
    for attempt in range(1, START_ATTEMPTS + 1):
        port = free_port()
        api_url = f"http://127.0.0.1:{port}/api"
        fd, name = tempfile.mkstemp(prefix="codea1-prefect-server-", suffix=".log")
        os.close(fd)
        log = Path(name)
        cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)]
        cmd += ["--no-ui", "--analytics-off"]
        guard_cmd = [sys.executable, "-I", GUARD, str(os.getpid()), str(stop_timeout_s), "--log", str(log)]
        guard_cmd += ["--api", api_url]
        guard_cmd += ["--dvc-root", str(root)] if root else []
        guard = Guard(
            subprocess.Popen(
                [*guard_cmd, "--server", *cmd],
                stdin=subprocess.PIPE,
                env={**os.environ, **SERVICES_ENV},
                start_new_session=True,
                preexec_fn=guard_preexec,
            ),
            api_url,
        )
        try:
            deadline = time.monotonic() + timeout_s
            while not _healthy(api_url):
                if guard.proc.poll() is not None or time.monotonic() > deadline:
                    why = (
                        f"exited with code {guard.proc.returncode}"
                        if guard.proc.poll() is not None
                        else f"no answer in {timeout_s:.0f} s"
                    )
                    raise ServerStartError(f"the Prefect server {why}; the end of its log:\n{_tail(log)}")
                time.sleep(0.25)
        except BaseException as exc:
            retry = isinstance(exc, ServerStartError) and attempt < START_ATTEMPTS and port_taken(log)
            guard.close(STOP_TIMEOUT_S + 5)
            log.unlink(missing_ok=True)
            if retry:
                continue
            raise
        return guard, log
    raise AssertionError("unreachable: the last attempt returns or raises")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as a KeyboardInterrupt (:func:`sigterm_as_interrupt`): the caller exits 143, not 130."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into :class:`Terminated` (a KeyboardInterrupt) for the block, so ``finally`` clauses (server
    stop) run."""

    def _raise(signum: int, frame: object) -> None:
        raise Terminated(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
