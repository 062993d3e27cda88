"""What confines each forked child before it runs a program: rlimits, the uid drop, the death signal.

What it does: :func:`apply_zygote_limits` (once per zygote: no-new-privs, no core dumps, SIGXFSZ
ignored, inherited by every child); :func:`child_rlimits` (the job-independent rlimits, built once);
:func:`child_confiner` (built once per zygote, run in each forked child: rlimits, CPU limit, uid/gid
drop, parent-death signal).

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

from sandbox.limits import ExecLimits
from sandbox.linux import PR_SET_NO_NEW_PRIVS, bare_prctl, prctl, set_death_signal


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
    fixed: tuple[tuple[int, tuple[int, int]], ...], uid: int | None
) -> Callable[[float], None]:
    """``confine(cpu_s)``: apply the rlimits ``fixed`` (from :func:`child_rlimits`) and RLIMIT_CPU for
    ``cpu_s``, then drop to ``uid`` (gid = uid) when given, then set the death signal again (a uid
    change clears it). Built once by the zygote (which ran :func:`apply_zygote_limits`: CORE, SIGXFSZ,
    no-new-privs are inherited), called in each forked child.

    Why a closure: every name it needs is bound here, before the fork, so a child looks up no module
    globals (each look-up writes the reference count of the object found: a copy-on-write fault).
    ``confine`` raises OSError when a limit or the uid change could not be applied (the child must
    then exit).
    """
    setrlimit, cpu_limit, ceil = resource.setrlimit, resource.RLIMIT_CPU, math.ceil
    setgroups, setresgid, setresuid, death_signal = os.setgroups, os.setresgid, os.setresuid, set_death_signal
    bare = bare_prctl

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
            setresuid(uid, uid, uid)  # (also makes the process non-dumpable)
        else:
            bare(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no process of the uid may open our /proc files
        death_signal()  # after setuid: a uid change clears it

    return confine
