"""One training run per workspace: ``<checkpoint_dir>/train.lock``.

What it does: :class:`WorkspaceLock` takes the lock file atomically (``O_CREAT | O_EXCL``) holding the
holder's pid, host and start time; a lock whose process is gone (or whose pid another process reuses) on this
host is stale and taken over with one warning line; a live holder raises :class:`WorkspaceLockedError` naming
its pid and start time. A lock on a shared disk taken by another machine is never stolen.
What it does not: lock anything but the training workspace (the MLflow store has its own locking).

Tests: ``pytest tests/workspace/test_lock.py``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

LOCK_NAME = "train.lock"
log = logging.getLogger("codea1.checkpoint")


class WorkspaceLockedError(RuntimeError):
    """Another training run holds the workspace; the message names its pid and start time."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _proc_start(pid: int) -> str:
    """The kernel's start time of ``pid`` (``/proc/<pid>/stat`` field 22), '' where unavailable: tells a
    live holder from an unrelated process that reused its pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


class WorkspaceLock:
    """``<checkpoint_dir>/train.lock`` holding the holder's pid, host, start time; a context manager.

    Taken with ``O_CREAT | O_EXCL`` (atomic); a lock whose pid is gone (or reused by another process) on this
    host is stale: it is replaced with one warning line. A live holder raises :class:`WorkspaceLockedError`.
    """

    def __init__(self, checkpoint_dir: str | Path):
        self.path = Path(checkpoint_dir) / LOCK_NAME
        self.held = False

    def _holder(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}

    def _stale(self, holder: dict[str, Any]) -> bool:
        if holder.get("host") not in (None, socket.gethostname()):
            return False  # another machine's run on a shared disk: never stolen
        pid = int(holder.get("pid") or 0)
        return pid <= 0 or not _alive(pid) or _proc_start(pid) != holder.get("proc_start", _proc_start(pid))

    def acquire(self) -> WorkspaceLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "proc_start": _proc_start(os.getpid()),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder is None:
                    continue  # released meanwhile
                if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
                    return self  # this process holds it already (the CLI entry, then the flow): not released here
                if not self._stale(holder):
                    raise WorkspaceLockedError(
                        f"{self.path}: another training run holds this workspace (pid {holder.get('pid')} on "
                        f"{holder.get('host')}, started {holder.get('started')}); wait for it or stop it"
                    ) from None
                log.warning(
                    "%s: stale lock of pid %s (started %s) removed",
                    self.path,
                    holder.get("pid"),
                    holder.get("started"),
                )
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(me, fh)
            self.held = True
            return self
        raise WorkspaceLockedError(f"{self.path}: could not take the lock (it keeps changing)")

    def release(self) -> None:
        if self.held and (self._holder() or {}).get("pid") == os.getpid():
            self.path.unlink(missing_ok=True)
        self.held = False

    def __enter__(self) -> WorkspaceLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
