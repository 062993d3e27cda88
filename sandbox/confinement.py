"""What confines each forked child before it runs a program: rlimits, the uid drop, the death signal.

What it does: :func:`apply_zygote_limits` (once per zygote: no-new-privs, no core dumps, SIGXFSZ
ignored, inherited by every child); :func:`child_rlimits` (the job-independent rlimits, built once);
:func:`child_confiner` (built once per zygote, run in each forked child: rlimits, CPU limit, uid/gid
drop, parent-death signal); :func:`call_confiner` (built once per zygote, run in each isolated call's
process: the call uid, no capability, a process cap below the program's, its own signal scope).

What it does not: fork, run untrusted code, or kill what a child left behind (``sandbox/credentials.py``,
``sandbox/zygote.py``). Linux only. Tested by ``tests/sandbox/test_sandbox.py`` and
``tests/sandbox/test_sandbox_cost.py`` (what a child inherits, what it costs).
"""

from __future__ import annotations

import math
import os
import resource
import signal
from collections.abc import Callable

from sandbox.credentials import CAP_SETUID, capability_setter
from sandbox.limits import ExecLimits
from sandbox.linux import (
    PR_SET_CHILD_SUBREAPER,
    PR_SET_KEEPCAPS,
    PR_SET_NO_NEW_PRIVS,
    bare_prctl,
    prctl,
    set_death_signal,
)


def apply_zygote_limits() -> None:
    """Once, in the zygote: the limits every child inherits unchanged (no per-child cost).

    No-new-privs is irrevocable and survives fork and the uid drop; RLIMIT_CORE 0 and an ignored
    SIGXFSZ (too-large writes fail with EFBIG instead of killing) are inherited as they are. None of
    them restricts what the zygote itself does (fork, kill, wait, mount tmpfs, no exec).
    """
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def child_rlimits(limits: ExecLimits, drop: bool) -> tuple[tuple[int, tuple[int, int]], ...]:
    """The per-child rlimits that do not depend on the job (AS, FSIZE, NOFILE and, with the uid drop,
    NPROC), as ``setrlimit`` arguments: built once by the zygote, so a child allocates nothing for them."""
    mem = limits.memory_mb * 1024 * 1024
    fsize = limits.max_file_mb * 1024 * 1024
    fixed = [
        (resource.RLIMIT_AS, (mem, mem)),
        (resource.RLIMIT_FSIZE, (fsize, fsize)),
        (resource.RLIMIT_NOFILE, (limits.max_open_files, limits.max_open_files)),
    ]
    if drop:
        fixed.append((resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes)))
    return tuple(fixed)


def child_confiner(
    fixed: tuple[tuple[int, tuple[int, int]], ...], uid: int | None, keep_setuid: bool = False
) -> Callable[[float], None]:
    """``confine(cpu_s)``: apply the rlimits ``fixed`` (from :func:`child_rlimits`) and RLIMIT_CPU for
    ``cpu_s``, then drop to ``uid`` (gid = uid) when given, then set the death signal again (a uid
    change clears it). Built once by the zygote (which ran :func:`apply_zygote_limits`: CORE, SIGXFSZ,
    no-new-privs are inherited), called in each forked child.

    With ``keep_setuid`` (isolated calls under a uid drop) the child keeps ``CAP_SETUID`` and nothing
    else, so each call's process can become the worker's call uid (:func:`call_confiner`), a uid that
    may not signal, ``prlimit``, renice or re-pin this process, and that holds no process slot of it;
    the worker's syscall filter lets ``setresuid`` reach only the worker's two uids. The child is also
    a subreaper: what a call's process leaves running becomes its child, found after the call.

    Why a closure: every name it needs is bound here, before the fork, so a child looks up no module
    globals (each look-up writes the reference count of the object found: a copy-on-write fault).
    ``confine`` raises OSError when a limit or the uid change could not be applied (the child must
    then exit).
    """
    setrlimit, cpu_limit, ceil = resource.setrlimit, resource.RLIMIT_CPU, math.ceil
    setgroups, setresgid, setresuid, death_signal = os.setgroups, os.setresgid, os.setresuid, set_death_signal
    bare = bare_prctl
    keep = capability_setter(1 << CAP_SETUID) if keep_setuid and uid is not None else None

    def confine(cpu_s: float) -> None:
        for which, value in fixed:
            setrlimit(which, value)
        cpu = ceil(cpu_s)
        if cpu < 1:
            cpu = 1
        setrlimit(cpu_limit, (cpu, cpu + 1))
        if uid is not None:
            setgroups(())
            setresgid(uid, uid, uid)
            if keep is not None:
                bare(PR_SET_KEEPCAPS, 1, 0, 0, 0)  # the permitted set survives the uid change
            setresuid(uid, uid, uid)  # (also makes the process non-dumpable)
            if keep is not None:
                if keep() != 0:  # every capability but CAP_SETUID dropped
                    raise OSError("capset failed")
                bare(PR_SET_KEEPCAPS, 0, 0, 0, 0)
                bare(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        else:
            bare(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no process of the uid may open our /proc files
        death_signal()  # after setuid: a uid change clears it

    return confine


def call_confiner(
    call_uid: int | None, max_processes: int, join_scope: Callable[[], int] | None
) -> Callable[[], int]:
    """``confine_call()`` for each isolated call's process (built once by the zygote); returns 0, or -1
    when a step failed (the call's process must then exit).

    With a uid drop: the call uid ``call_uid`` (the child's CAP_SETUID allows it; the group stays the
    worker's, so the temp dir is shared), no capability left, and RLIMIT_NPROC two below the program's
    process cap, so the call's processes (counted for its uid) can never take the slots its reporter
    needs to start the next call and the sweep. Then the call's own Landlock signal scope where the
    kernel has it (``sandbox/landlock.py``). Without a uid drop only the scope.
    """
    setresuid, setrlimit, nproc = os.setresuid, resource.setrlimit, resource.RLIMIT_NPROC
    drop = capability_setter(0) if call_uid is not None else None
    slots = max(max_processes - 2, 1)

    def confine_call() -> int:
        if drop is not None:
            setresuid(call_uid, call_uid, call_uid)
            if drop() != 0:
                return -1
            setrlimit(nproc, (slots, slots))
        if join_scope is not None and join_scope() != 0:
            return -1
        return 0

    return confine_call
