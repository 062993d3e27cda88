"""Who a sandboxed process is and what it holds: its uid's processes, its keyring, its capabilities.

What it does: :func:`call_uid` (the second uid of a worker, the one its isolated calls run as);
:func:`capability_setter` (a bare ``capset`` keeping at most ``CAP_SETUID``); :func:`call_sweeper` (after a
call, kill whatever the call left running); :func:`sweep_uid` and :func:`sweep_uid_from_proc` (kill every
process of a uid dedicated to one worker); :func:`join_fresh_keyring` and :func:`keyring_joiner` (a new
anonymous session keyring, so the parent's keys are not possessed); :func:`has_capabilities` (whether a
child forked without a uid drop would keep any).

What it does not: drop a child's uid (``sandbox/confinement.py``) or pick the uid (``sandbox/executor.py``).
Linux only. Tested by ``tests/sandbox/test_sandbox_hostile.py``, ``tests/sandbox/test_sandbox_deny.py`` and
``tests/sandbox/test_sandbox_reach.py``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import struct
import time
from collections.abc import Callable

from sandbox.linux import libc

CALL_UID_OFFSET = 1 << 30
"""A worker's calls run as its uid plus this: the executor draws worker uids below ``100_000 + 2**30``, so
no call uid is any worker's uid, and two workers share a call uid only if they share their uid."""
CAP_SETUID = 7


def call_uid(uid: int) -> int:
    """The uid the isolated calls of the worker with unprivileged uid ``uid`` run as (gid: the worker's)."""
    return uid + CALL_UID_OFFSET


def capability_setter(capabilities: int) -> Callable[[], int]:
    """``set()`` for a child (bound once): ``capset`` with ``capabilities`` (a bit mask of the first 32)
    as its effective and permitted sets, nothing inheritable; returns 0 or -1. It can only lower what
    the process holds."""
    fn = ctypes.CDLL(None)["capset"]
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    header = ctypes.create_string_buffer(struct.pack("Ii", 0x20080522, 0), 8)  # _LINUX_CAPABILITY_VERSION_3
    data = ctypes.create_string_buffer(struct.pack("6I", capabilities, capabilities, 0, 0, 0, 0), 24)

    def set_(_fn=fn, _header=header, _data=data) -> int:
        return _fn(_header, _data)

    return set_


def call_sweeper(uid: int) -> Callable[[], None]:
    """``sweep()`` for the process reporting the calls (bound once), run after a call's process exited
    when processes remain below it: a helper becomes the call uid ``uid`` (the reporter keeps
    ``CAP_SETUID`` for this alone) and sends SIGKILL to every process it may signal, i.e. every process
    of ``uid`` (in the worker's PID namespace); then the reporter reaps what exited. One pass suffices:
    a process forked after it would have a parent already holding its SIGKILL, and such a fork fails."""
    fork, setresuid, kill, exit_, waitpid, sleep, now = (
        os.fork,
        os.setresuid,
        os.kill,
        os._exit,
        os.waitpid,
        time.sleep,
        time.monotonic,
    )
    sigkill, nohang, child_error = int(signal.SIGKILL), os.WNOHANG, ChildProcessError

    def sweep() -> None:
        helper = fork()
        if helper == 0:
            try:
                setresuid(uid, uid, uid)
                kill(-1, sigkill)
                kill(-1, sigkill)
            except BaseException:  # noqa: BLE001
                pass
            exit_(0)
        waitpid(helper, 0)
        deadline = now() + 0.05
        while True:  # the killed processes are (or become) our children: reap them as they exit
            try:
                pid = waitpid(-1, nohang)[0]
            except child_error:
                return
            if pid == 0:
                if now() > deadline:
                    return
                sleep(0.0005)

    return sweep


def sweep_uid(uid: int, gid: int | None = None) -> None:
    """Kill every process running as ``uid`` (from a short-lived helper that becomes that uid, with group
    ``gid``, by default ``uid``).

    Used after a program whose descendants outlived it; ``uid`` must be dedicated to one worker.
    """
    gid = uid if gid is None else gid
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
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
