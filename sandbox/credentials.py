"""Who a sandboxed process is and what it holds: its uid's processes, its keyring, its capabilities.

What it does: :func:`sweep_uid` and :func:`sweep_uid_from_proc` (kill every process of a uid dedicated to
one worker); :func:`join_fresh_keyring` and :func:`keyring_joiner` (a new anonymous session keyring, so
the parent's keys are not possessed); :func:`has_capabilities` (whether a child forked without a uid drop
would keep any).

What it does not: drop a child's uid (``sandbox/confinement.py``) or pick the uid (``sandbox/executor.py``).
Linux only. Tested by ``tests/sandbox/test_sandbox_hostile.py`` and ``tests/sandbox/test_sandbox_deny.py``.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

from sandbox.linux import libc


def sweep_uid(uid: int) -> None:
    """Kill every process running as ``uid`` (from a short-lived helper that becomes that uid).

    Used after a program whose descendants outlived it; ``uid`` must be dedicated to one worker.
    """
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            for _ in range(1000):  # kill(-1) as uid: every process of uid but us; ESRCH when none left
                os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def sweep_uid_from_proc(uid: int, rounds: int = 5) -> int:
    """Kill processes whose real uid is ``uid`` by scanning /proc (for the parent; no fork). Returns kills."""
    killed = 0
    for _ in range(rounds):
        found = 0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/status", "rb") as fh:
                    for line in fh:
                        if line.startswith(b"Uid:"):
                            if int(line.split()[1]) == uid:
                                os.kill(int(entry.name), signal.SIGKILL)
                                found += 1
                            break
            except (OSError, ValueError):
                continue
        killed += found
        if not found:
            break
    return killed


KEYCTL_JOIN_SESSION_KEYRING = 1
KEYCTL_NR = {"x86_64": 250, "aarch64": 219, "riscv64": 219}
"""keyctl's number where libseccomp (which knows every architecture's) is missing."""


def keyring_joiner(keyctl_nr: int) -> Callable[[], int]:
    """``join()`` for a child (bound once): a new anonymous session keyring; returns its id or -1."""
    fn = ctypes.CDLL(None)["syscall"]
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p]

    def join(_fn=fn, _nr=keyctl_nr, _op=KEYCTL_JOIN_SESSION_KEYRING) -> int:
        return _fn(_nr, _op, None)

    return join


def join_fresh_keyring(keyctl_nr: int | None) -> bool:
    """Join a new anonymous session keyring (the caller then no longer possesses its parent's); False
    where the call is unavailable."""
    if keyctl_nr is None:
        return False
    return libc.syscall(keyctl_nr, KEYCTL_JOIN_SESSION_KEYRING, None) >= 0


def has_capabilities() -> bool:
    """Whether this process holds any effective or permitted capability (a child forked from it without
    a uid drop keeps them); True where it cannot tell (then assume the worst)."""
    try:
        with open("/proc/self/status") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
        return int(fields["CapEff"], 16) != 0 or int(fields["CapPrm"], 16) != 0
    except (OSError, KeyError, ValueError):
        return True
