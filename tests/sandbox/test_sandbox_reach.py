"""Verdicts no call can forge by construction: one hostile program per class (each fails where its layer is
missing).

2. an isolated call's process acting on the process that reports the calls (``prlimit64``,
   ``setpriority``, ``sched_setaffinity``, a signal) or leaving processes that hold its process slots;
4. state crossing programs on a worker: flags on an open file description shared with the zygote
   (stdin's ``/dev/null``, the Landlock scope descriptor), a kept tmpfs' inode counter and times;
5. no PID namespace: other processes' ``comm``, and the host's sockets in ``/proc/1/net`` and the
   parent's ``/proc/<pid>/net``.
"""

from __future__ import annotations

import os
import socket
import sys

import pytest

from sandbox import ExecLimits, ProcessExecutor

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the process sandbox needs Linux"
)

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="needs root (uid drop, namespaces)")


def _pool(**limits) -> ProcessExecutor:
    base = {"call_timeout_s": 2.0, "program_timeout_s": 20.0, "memory_mb": 512, "isolate_calls": True}
    return ProcessExecutor(workers=1, limits=ExecLimits(**{**base, **limits}))


# --------------------------------------------------------------------------------------------------
# 2. The reporter is out of reach of the calls it runs
# --------------------------------------------------------------------------------------------------

_REACH = r"""
import ctypes, os, resource, time
libc = ctypes.CDLL(None, use_errno=True)

def reporter():
    return os.getppid()

def lower_limits(pid):
    done = []
    try:
        resource.prlimit(pid, resource.RLIMIT_NPROC, (1, 1))
        done.append('prlimit')
    except OSError:
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, pid, 19)
        done.append('setpriority')
    except OSError:
        pass
    try:
        os.sched_setaffinity(pid, {0})
        done.append('sched_setaffinity')
    except OSError:
        pass
    return done

def hold_slots():
    for _ in range(200):
        try:
            if os.fork() == 0:
                time.sleep(30)
                os._exit(0)
        except OSError:
            break
    return 'held'

def state():
    return resource.getrlimit(resource.RLIMIT_NPROC)[0] > 1, os.getpriority(os.PRIO_PROCESS, 0)
"""


@needs_root
def test_a_call_cannot_act_on_the_process_reporting_the_calls():
    """Bug guarded: an isolated call's process ran as the reporter's uid, so ``prlimit64``,
    ``setpriority`` and ``sched_setaffinity`` on its parent succeeded, and processes it left held the
    uid's process slots: the reporter's next fork failed, and every later call of the program (the
    reference's expected values) became an error."""
    calls = [
        "lower_limits(reporter())",  # (calls with code of their own: each runs in its own process)
        "(lambda: hold_slots())()",
        "state()",
        "(lambda: 1)()",
        "(lambda: 2)()",
        "state()",
    ]
    with _pool(max_processes=64) as ex:
        out = ex.run(_REACH, calls)
    assert [o.status for o in out] == ["ok"] * len(calls), out
    assert out[0].value == [], f"a call acted on the reporter: {out[0].value}"
    # the reporter keeps the priority it inherited (this process's: 0, or the nice level the suite runs under)
    start = (True, os.getpriority(os.PRIO_PROCESS, 0))
    assert out[2].value == start and out[5].value == start, out
    assert [out[3].value, out[4].value] == [1, 2], out


# --------------------------------------------------------------------------------------------------
# 4. Nothing survives a program on a worker
# --------------------------------------------------------------------------------------------------

_FLAGS = r"""
import fcntl, os

def landlock_fds():
    return [fd for fd in range(3, 2048) if _is_landlock(fd)]

def _is_landlock(fd):
    try:
        return 'landlock' in os.readlink(f'/proc/self/fd/{fd}')
    except OSError:
        return False

def set_flags():
    for fd in [0] + landlock_fds():
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK | os.O_APPEND)
    return 'set'

def flags():
    return [bool(fcntl.fcntl(fd, fcntl.F_GETFL) & (os.O_NONBLOCK | os.O_APPEND)) for fd in [0] + landlock_fds()]
"""

_COUNTER = r"""
import os

def churn(n):
    for i in range(n):
        path = os.path.join(os.environ['TMPDIR'], f'c{i}')
        open(path, 'w').close()
        os.unlink(path)
    os.utime(os.environ['TMPDIR'])
    return n

def probe():
    top = os.stat(os.environ['TMPDIR'])
    path = os.path.join(os.environ['TMPDIR'], 'probe')
    with open(path, 'w'):
        pass
    ino = os.stat(path).st_ino
    os.unlink(path)
    return ino, top.st_mtime_ns, top.st_atime_ns
"""


def test_flags_set_by_a_program_do_not_reach_the_next():
    """Bug guarded: every child's stdin (and, with isolated calls, the Landlock scope descriptor) shared
    its open file description with the zygote, so ``O_NONBLOCK``/``O_APPEND`` set by one program were
    seen by every later program of the worker."""
    with _pool() as ex:
        first = ex.run(_FLAGS, ["set_flags()", "flags()"])
        second = ex.run(_FLAGS, ["flags()"])
    assert [o.status for o in first + second] == ["ok"] * 3, (first, second)
    assert all(first[1].value), first  # (the program sees its own flags)
    assert not any(second[0].value), f"flags of the previous program: {second[0].value}"


@needs_root
def test_a_kept_tmpfs_carries_no_counter_or_time():
    """Bug guarded: a private tmpfs a program left empty was kept for the next one with its inode counter
    and times: making and removing files (or touching the directory) wrote a number the next program
    read back."""
    with _pool() as ex:
        if not ex.isolation.get("private_tmp"):
            pytest.skip(f"no private tmpfs: {ex.isolation.get('filesystem')}")
        quiet = [ex.run(_COUNTER, ["probe()"])[0] for _ in range(2)]
        assert ex.run(_COUNTER, ["churn(500)"])[0].value == 500
        after = ex.run(_COUNTER, ["probe()"])[0]
    assert [o.status for o in [*quiet, after]] == ["ok"] * 3, (quiet, after)
    assert after.value == quiet[1].value == quiet[0].value, (quiet, after)


# --------------------------------------------------------------------------------------------------
# 5. A PID namespace per worker, with its own /proc
# --------------------------------------------------------------------------------------------------

_PROC = r"""
import os

def comms():
    names = []
    for pid in os.listdir('/proc'):
        if pid.isdigit():
            try:
                names.append(open(f'/proc/{pid}/comm').read().strip())
            except OSError:
                pass
    return sorted(names)

def unix_sockets(pid):
    return open(f'/proc/{pid}/net/unix').read()
"""


@needs_root
def test_proc_shows_only_the_program_and_its_own_network():
    """Bug guarded: without a PID namespace a program read every host process's ``comm`` (a name another
    worker's program set with ``PR_SET_NAME``: a channel) and the host's sockets in ``/proc/1/net`` and
    its parent's ``/proc/<pid>/net``."""
    name = f"codea1-probe-{os.getpid()}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("\0" + name)  # an abstract socket of the host's network namespace
    server.listen(1)
    try:
        with _pool() as ex:
            if not ex.isolation.get("network", "").startswith("netns"):
                pytest.skip(f"no namespaces: {ex.isolation.get('network')}")
            out = ex.run(_PROC, ["comms()", "unix_sockets(1)", "unix_sockets(os.getppid() or 1)"])
    finally:
        server.close()
    assert [o.status for o in out] == ["ok"] * 3, out
    assert len(out[0].value) <= 3, f"other processes visible: {out[0].value}"
    assert name not in out[1].value and name not in out[2].value, "the host's sockets are visible"
