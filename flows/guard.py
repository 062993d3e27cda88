"""Stopping a stage's process group: SIGTERM, a bounded wait, SIGKILL; and the guard that stops the stage, then
the temporary Prefect server, when the pipeline runner dies.

What it does: :func:`stop_process_group` is how :mod:`flows.pipeline` stops ``dvc repro`` and the running stage
(on Ctrl-C or SIGTERM). Run as a script, ``python flows/guard.py RUNNER_PID TIMEOUT_S [--group PGID]
[--log FILE] [--dvc-root DIR] [--api URL] [--server CMD ...]``, this file is the runner's guard: a separate
process, in its own session (no signal meant for the group or the terminal reaches it), that the kernel sends
SIGTERM when the runner dies, however it dies (``PR_SET_PDEATHSIG``, armed by the runner before the exec, with
SIGTERM blocked until the handler below is in place). It then, in this order:

1. stops the stage's process group (``--group``, or the last ``group PGID`` line the runner wrote on its stdin)
   the same way: SIGTERM, the stage finishes its current task and ends its runs while their API still answers;
2. removes the entries of ``dvc`` processes that no longer exist from ``<dvc-root>/.dvc/tmp/rwlock``;
3. marks the flow and task runs still RUNNING or PENDING that started on its server's watch CRASHED (``--api``:
   a stage killed after the stop timeout could not end them itself; they would stay RUNNING forever);
4. stops the Prefect server it started itself (``--server``: the server is the guard's child, so it outlives
   the runner by exactly as long as the stage needs it, and dies with the guard by ``PR_SET_PDEATHSIG``), and
   removes the server's log (``--log``).

The runner ends the guard by closing its stdin (EOF: nothing left to guard; a server and log are stopped and
removed as above) or, without a server, by killing it. A server that exits on its own while no group is
registered ends the guard with the server's exit code (the runner reports a failed start).

Why a script of the standard library only: the guard starts next to every stage, and must not wait for (or
depend on) anything the project imports.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from codea1_core.atomic import write_json_atomic


def group_alive(pgid: int) -> bool:
    """Whether any process (zombies included) is still in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_process_group(pgid: int, timeout_s: float, poll: Callable[[], object] = lambda: None) -> None:
    """SIGTERM group ``pgid``, wait up to ``timeout_s`` for every process in it to exit (calling ``poll``
    every 0.2 s: the caller reaps its own child there, since a zombie still counts as a member), then SIGKILL
    what is left. A KeyboardInterrupt while waiting (a second Ctrl-C) kills at once."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            poll()
            if not group_alive(pgid):
                return
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def prune_rwlock(dvc_root: str | os.PathLike[str], attempts: int = 25) -> list[int]:
    """Remove the entries of processes that no longer exist from ``<dvc_root>/.dvc/tmp/rwlock`` (a killed ``dvc``
    leaves its own); returns their pids. Edited as DVC does: under ``flock`` of ``rwlock.lock``, then a temp file
    renamed over it. Nothing is changed when the lock stays busy (a live ``dvc`` holds it)."""
    import fcntl
    import json

    tmp = os.path.join(os.fspath(dvc_root), ".dvc", "tmp")
    path = os.path.join(tmp, "rwlock")
    if not os.path.isfile(path):
        return []
    with open(os.path.join(tmp, "rwlock.lock"), "a") as guard:
        for _ in range(attempts):
            try:
                fcntl.flock(guard.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(0.2)
        else:
            return []
        try:
            with open(path, encoding="utf-8") as fh:
                lock = json.load(fh)
        except (OSError, ValueError):
            return []
        dead: set[int] = set()

        def alive(info: dict) -> bool:
            pid = int(info.get("pid", 0))
            if pid and _dead(pid):
                dead.add(pid)
                return False
            return True

        write = {p: i for p, i in lock.get("write", {}).items() if alive(i)}
        read = {
            p: kept for p, infos in lock.get("read", {}).items() if (kept := [i for i in infos if alive(i)])
        }
        if dead:
            write_json_atomic(
                path, {"write": write, "read": read}, indent=None, sort_keys=False, default=None
            )
        return sorted(dead)


ACTIVE_STATES = ["RUNNING", "PENDING"]


def _post(url: str, body: dict, timeout_s: float) -> object:
    import json
    import urllib.request

    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read() or b"null")


def crash_orphans(api: str, since_s: float, timeout_s: float = 5.0) -> list[str]:
    """Set every flow run still RUNNING or PENDING that started after ``since_s`` (epoch seconds), and every
    such task run of those flow runs, to CRASHED through the Prefect REST API at ``api``; returns the flow run
    ids. Called once the stage's process group is gone: no process is left to end them. Best effort: an API
    that does not answer changes nothing."""
    import datetime as dt

    after = dt.datetime.fromtimestamp(since_s, dt.UTC).isoformat()
    state = {
        "type": "CRASHED",
        "name": "Crashed",
        "message": "its process was killed with the pipeline runner",
    }
    active = {"type": {"any_": ACTIVE_STATES}}
    try:
        runs = _post(
            f"{api}/flow_runs/filter",
            {"flow_runs": {"state": active, "start_time": {"after_": after}}, "limit": 200},
            timeout_s,
        )
        ids = [str(r["id"]) for r in runs] if isinstance(runs, list) else []
        if not ids:
            return []
        tasks = _post(
            f"{api}/task_runs/filter",
            {"task_runs": {"state": active, "flow_run_id": {"any_": ids}}, "limit": 200},
            timeout_s,
        )
        for task in tasks if isinstance(tasks, list) else []:
            _post(f"{api}/task_runs/{task['id']}/set_state", {"state": state, "force": True}, timeout_s)
        for run_id in ids:
            _post(f"{api}/flow_runs/{run_id}/set_state", {"state": state, "force": True}, timeout_s)
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return ids


def _stop_server(server: subprocess.Popen, timeout_s: float = 10.0) -> None:
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=timeout_s)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    server.wait()


def _die_with_guard() -> None:
    """In the server (before exec): SIGTERM when the guard dies (``PR_SET_PDEATHSIG``; Linux only)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _guard(args: argparse.Namespace) -> None:
    started = time.time()  # runs that started before the server did are not this pipeline's
    group: list[int | None] = [args.group]
    server: list[subprocess.Popen | None] = [None]
    stopping = threading.Event()

    def stop(*_: object) -> None:
        if stopping.is_set():  # SIGTERM while the EOF path stops everything already (or the reverse)
            return
        stopping.set()
        pgid = group[0]
        if pgid is not None and group_alive(pgid):
            print(
                f"pipeline: the pipeline process died; stopping its stage (process group {pgid}, "
                f"up to {args.timeout_s:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
            stop_process_group(pgid, args.timeout_s)
        if args.dvc_root:
            prune_rwlock(args.dvc_root)
        if args.api and server[0] is not None and server[0].poll() is None:
            crash_orphans(args.api, started)
        if server[0] is not None:
            _stop_server(server[0])
        if args.log:
            try:
                os.unlink(args.log)
            except OSError:
                pass
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # blocked since the fork: delivered now
    if os.getppid() != args.runner:  # the runner died before the death signal was armed
        stop()
    if args.server:
        with open(args.log or os.devnull, "ab") as out:
            server[0] = subprocess.Popen(
                args.server,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_guard,
            )

        def watch(proc: subprocess.Popen) -> None:
            code = proc.wait()
            if not stopping.is_set() and group[0] is None:
                os._exit(code or 1)

        threading.Thread(target=watch, args=(server[0],), daemon=True).start()
    for line in sys.stdin:  # the runner's notes: "group PGID" (a stage group started) / "group -" (it ended)
        word, _, value = line.strip().partition(" ")
        if word == "group":
            group[0] = int(value) if value.lstrip("-").isdigit() else None
    stop()  # EOF: the runner is done, or dead


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="guard.py")
    parser.add_argument("runner", type=int)
    parser.add_argument("timeout_s", type=float)
    parser.add_argument("--group", type=int, default=None)
    parser.add_argument("--log", default=None)
    parser.add_argument("--dvc-root", default=None)
    parser.add_argument("--api", default=None)
    parser.add_argument("--server", nargs=argparse.REMAINDER, default=None)
    return parser.parse_args(argv)


if __name__ == "__main__":
    _guard(_parse(sys.argv[1:]))
