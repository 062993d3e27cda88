"""Landlock (Linux >= 5.13): the files a child may reach, whatever the mounts and permissions allow.

What it does: :func:`make_ruleset` (in the trusted worker, once) builds a ruleset that handles every file
access right of the kernel's Landlock ABI and grants: read and execute on the interpreter's directories
and the system ones (``/usr``, ``/bin``, ``/lib*``, ``/etc``, ``/proc``); read and write on the minimal
``/dev``'s files; everything on the private temp directories. So a program cannot read ``/sys`` (the
cgroup's accounting of the previous program among others), ``/var``, ``/home`` or anything else, and
can write only its temp directories. From ABI 4 it also handles TCP bind/connect (none granted), from
ABI 6 it scopes abstract Unix sockets and signals to the domain. Each child joins it with one
``landlock_restrict_self`` (:func:`restrict_function`); :func:`scope_joiner` builds what each call's
process runs to make and join a scope-only ruleset of its own (``sandbox/harness.py``): it can then
signal nothing outside itself, and no descriptor of it is shared with the zygote or another program.

Rules are bound to inodes (a rule on a mount point hidden by a later mount is ignored): after a program
whose private tmpfs was replaced by a fresh one the zygote builds the ruleset again, onto the same
descriptor (``sandbox/zygote.py``, ``_clean_tmp``; programs that leave their tmpfs empty cost nothing). Where
the kernel has no Landlock (or a seccomp profile hides it,
as in a container) nothing is restricted and ``ex.isolation["landlock"]`` says why.

What it does not cover: files under the granted directories (world-readable host files in /etc, /usr,
/proc); connecting to pathname Unix sockets (Landlock has no right for it before ABI 8: the seccomp
filter denies ``socket`` and ``connect``, and /run is covered); ioctl on /dev files (not granted).
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Callable

_CREATE, _ADD_RULE, _RESTRICT = 444, 445, 446  # the same on every architecture
_VERSION = 1  # LANDLOCK_CREATE_RULESET_VERSION
_PATH_BENEATH = 1
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_ABI1_FS = (1 << 13) - 1
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_NET_TCP = 0b11  # BIND_TCP | CONNECT_TCP
_SCOPE = 0b11  # ABSTRACT_UNIX_SOCKET | SIGNAL
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | _TRUNCATE | _IOCTL_DEV

SYSTEM_READ_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc")
"""Readable (and executable) for every child, besides the interpreter's own directories."""
DEV_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def abi_version() -> int:
    """The kernel's Landlock ABI (0: none, or not allowed here)."""
    r = _libc.syscall(_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(_VERSION))
    return max(int(r), 0)


def _fs_rights(abi: int) -> int:
    rights = _ABI1_FS
    if abi >= 2:
        rights |= _REFER
    if abi >= 3:
        rights |= _TRUNCATE
    if abi >= 5:
        rights |= _IOCTL_DEV
    return rights


def _create(fs: int, net: int, scoped: int, abi: int) -> int:
    if abi >= 6:
        attr = struct.pack("QQQ", fs, net, scoped)
    elif abi >= 4:
        attr = struct.pack("QQ", fs, net)
    else:
        attr = struct.pack("Q", fs)
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = _libc.syscall(_CREATE, buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock_create_ruleset: {os.strerror(err)}")
    return int(fd)


def _add(ruleset: int, fd: int, rights: int) -> None:
    attr = ctypes.create_string_buffer(struct.pack("=Qi", rights, fd), 12)
    if _libc.syscall(_ADD_RULE, ruleset, _PATH_BENEATH, attr, ctypes.c_uint32(0)) < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock_add_rule: {os.strerror(err)}")


def make_ruleset(read_paths: list[str], tmp_paths: list[str]) -> tuple[int, int]:
    """Build the child's ruleset; returns ``(ruleset_fd, abi)`` (``-1, 0`` where there is no Landlock).

    Args:
        read_paths: directories readable and executable besides :data:`SYSTEM_READ_PATHS`.
        tmp_paths: the writable directories (the private tmpfs, or the host's /tmp without them).
    """
    abi = abi_version()
    if abi < 1:
        return -1, 0
    fs = _fs_rights(abi)
    ruleset = _create(fs, _NET_TCP if abi >= 4 else 0, _SCOPE if abi >= 6 else 0, abi)
    try:
        for path in sorted({*SYSTEM_READ_PATHS, *read_paths}):
            _add_path(ruleset, path, fs & (EXECUTE | READ_FILE | READ_DIR))
        for path in DEV_FILES:
            _add_path(ruleset, path, READ_FILE | WRITE_FILE)
        _add_path(ruleset, "/dev", READ_DIR)
        for path in tmp_paths:
            _add_path(ruleset, path, fs)
    except OSError:
        os.close(ruleset)
        raise
    return ruleset, abi


def _add_path(ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # absent here: nothing to grant
    try:
        if not os.path.isdir(path):
            rights &= _FILE_RIGHTS
        _add(ruleset, fd, rights)
    finally:
        os.close(fd)


def scope_joiner(abi: int) -> Callable[[], int] | None:
    """``join()`` for a call's process (bound once): create a ruleset that only scopes signals and
    abstract Unix sockets (ABI 6+), join it on top of the child's and close it; returns 0 or -1. Joined
    by each call's process, it keeps the call from signalling the process that reports the calls. Each
    call makes its own: the descriptor never outlives the call, so no open file description is shared
    with the zygote or another program. None below ABI 6."""
    if abi < 6:
        return None
    attr = ctypes.create_string_buffer(struct.pack("QQQ", 0, 0, _SCOPE), 24)
    fn = ctypes.CDLL(None)["syscall"]
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32]
    restrict, close = restrict_function(), os.close

    def join(_fn=fn, _attr=attr, _restrict=restrict, _close=close) -> int:
        fd = _fn(_CREATE, _attr, 24, 0)
        if fd < 0:
            return -1
        ok = _restrict(_RESTRICT, fd, 0)
        _close(fd)
        return 0 if ok == 0 else -1

    return join


def restrict_function() -> ctypes._CFuncPtr:
    """``landlock_restrict_self`` as a bare function pointer: ``f(446, ruleset_fd, 0)`` -> 0 or -1."""
    fn = ctypes.CDLL(None)["syscall"]
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_long]
    return fn
