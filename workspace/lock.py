"""One training run per workspace: ``<checkpoint_dir>/train.lock``.

What it does: :class:`WorkspaceLock` takes the lock file atomically with its owner already in it: the holder's
pid, host and start time are written to a temporary file that is then hard-linked to ``train.lock``
(``os.link`` fails when the name exists), so no process ever sees an empty or half-written lock. A lock whose
process is gone (or whose pid another process reuses) on this host is stale and taken over with one warning
line; the removal of a stale lock holds an ``flock`` on the folder and removes the file only when it still
holds the stale owner it was judged by, so two processes taking over one stale lock never both win. A live
holder raises :class:`WorkspaceLockedError` naming its pid and start time. A lock on a shared disk taken by
another machine is never stolen.
What it does not: lock anything but the training workspace (the MLflow store has its own locking).

Tests: ``pytest tests/workspace/test_lock.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Iterator
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

    Created whole by ``os.link`` of a written temporary file (atomic, fails when the name exists); a lock whose
    pid is gone (or reused by another process) on this host is stale: it is replaced with one warning line. A live
    holder raises :class:`WorkspaceLockedError`.
    """

    def __init__(self, checkpoint_dir: str | Path):
        self.path = Path(checkpoint_dir) / LOCK_NAME
        self.held = False

    def _read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    def _holder(self) -> dict[str, Any] | None:
        try:
            raw = self._read()
        except OSError:
            return {}
        return None if raw is None else _parse(raw)

    def _stale(self, holder: dict[str, Any]) -> bool:
        if holder.get("host") not in (None, socket.gethostname()):
            return False  # another machine's run on a shared disk: never stolen
        pid = int(holder.get("pid") or 0)
        return pid <= 0 or not _alive(pid) or _proc_start(pid) != holder.get("proc_start", _proc_start(pid))

    def _create(self, me: dict[str, Any]) -> bool:
        """Write ``me`` into a temporary file and link it to the lock's name: True when this made the lock."""
        tmp = self.path.with_name(f".{LOCK_NAME}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            with open(tmp, "x", encoding="utf-8") as fh:
                json.dump(me, fh)
            os.link(tmp, self.path)
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        return True

    def _remove_stale(self, raw: bytes) -> bool:
        """Remove the lock file if it still holds ``raw`` (the stale owner it was judged by), holding an
        ``flock`` on the folder so that removals never interleave; True when this call removed it."""
        with _folder_flock(self.path.parent):
            try:
                if self._read() != raw:
                    return False  # taken over (or released) meanwhile: judged again by the caller
            except OSError:
                return False
            self.path.unlink(missing_ok=True)
            return True

    def acquire(self) -> WorkspaceLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "proc_start": _proc_start(os.getpid()),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        for _ in range(10):
            if self._create(me):
                self.held = True
                return self
            raw = self._read()
            if raw is None:
                continue  # released meanwhile
            holder = _parse(raw)
            if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
                return self  # this process holds it already (the CLI entry, then the flow): not released here
            if not self._stale(holder):
                raise WorkspaceLockedError(
                    f"{self.path}: another training run holds this workspace (pid {holder.get('pid')} on "
                    f"{holder.get('host')}, started {holder.get('started')}); wait for it or stop it"
                )
            if self._remove_stale(raw):
                owner = (
                    f"of pid {holder.get('pid')} (started {holder.get('started')})"
                    if holder
                    else "(unreadable)"
                )
                log.warning("%s: stale lock %s removed", self.path, owner)
        raise WorkspaceLockedError(f"{self.path}: could not take the lock (it keeps changing)")

    def release(self) -> None:
        if self.held and (self._holder() or {}).get("pid") == os.getpid():
            self.path.unlink(missing_ok=True)
        self.held = False

    def __enter__(self) -> WorkspaceLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _parse(raw: bytes) -> dict[str, Any]:
    """A lock file's owner; ``{}`` when it is not a JSON object (a lock no process of this module wrote)."""
    try:
        holder = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


@contextlib.contextmanager
def _folder_flock(folder: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``folder`` for the block (released by the kernel when the process dies, so it is
    never stale); a file system without ``flock`` on folders runs the block unguarded."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)  # closing the last descriptor drops the flock
