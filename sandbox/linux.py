"""The Linux calls the sandbox's isolation modules make, bound once: libc through ctypes, flags, settings files.

What it does: binds libc's ``unshare``, ``mount``, ``umount2``, ``prctl`` and ``syscall`` (:data:`libc`) with
their flag constants (``CLONE_*``, ``MS_*``, ``PR_*``, ``MNT_DETACH``: the one home of these numbers, which
``sandbox/syscall_filter.py`` also matches its allow-list against); :func:`check` turns a failed call into
an ``OSError``; :func:`set_death_signal` is the bare, fork-cheap ``PR_SET_PDEATHSIG`` call each child makes;
:func:`write_file` writes one kernel setting (``/proc/sys``, cgroup files).

What it does not: decide what to isolate (``sandbox/namespaces.py``, ``sandbox/mounts.py``,
``sandbox/cgroups.py``, ``sandbox/confinement.py``, ``sandbox/credentials.py`` do). Linux only. Tested through
``tests/sandbox/``.
"""

from __future__ import annotations

import ctypes
import os
import signal

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_NOATIME = 0x400
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_KEEPCAPS = 8
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
MNT_DETACH = 2


# dlopen(NULL): the interpreter's own symbols, libc's included. Not ctypes.util.find_library, which
# imports subprocess, hence threading (an at-fork handler in every zygote, run for every child).
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def check(ret: int, what: str) -> None:
    """Raise ``OSError`` (errno and ``what``) when a libc call returned non-zero."""
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    """Move the calling process into new namespaces (``CLONE_*`` flags)."""
    check(libc.unshare(flags), f"unshare({flags:#x})")


def mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    """mount(2) with ``MS_*`` flags; ``None`` for an unused string argument."""
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    check(libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def prctl(option: int, arg: int = 0) -> None:
    """Call prctl(2) with one argument."""
    check(libc.prctl(option, arg, 0, 0, 0), f"prctl({option})")


bare_prctl = ctypes.CDLL(None)["prctl"]  # its own function pointer: no argtypes, no errno copy
_SIGKILL = int(signal.SIGKILL)


def set_death_signal(_bare=bare_prctl, _option=PR_SET_PDEATHSIG, _signal=_SIGKILL) -> None:
    """SIGKILL when our parent dies (PR_SET_PDEATHSIG), through a bare ctypes call with plain ints.

    Why not :func:`prctl`: each forked child calls this twice, and the argument converters and errno
    handling of a full ctypes call touch several times more pages (each a copy-on-write fault in every
    child); a failure is retried through :func:`prctl` for its errno. The defaults bind the names
    once (no global look-ups in the child).
    """
    if _bare(_option, _signal, 0, 0, 0) != 0:
        prctl(_option, _signal)


def write_file(path: str, text: str) -> None:
    """Write one kernel setting (a ``/proc/sys`` or cgroup file) in one ``write``."""
    with open(path, "w") as fh:
        fh.write(text)
