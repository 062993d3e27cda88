"""Landlock (Linux >= 5.13): the files a child may reach, whatever the mounts and permissions allow.

What it does: :func:`make_ruleset` (in the trusted worker, once) builds a ruleset that handles every file
access right of the kernel's Landlock ABI and grants: read and execute on the interpreter's directories
and the system ones (``/usr``, ``/bin``, ``/lib*``, ``/etc``, ``/proc``); read and write on the minimal
``/dev``'s files; everything on the private temp directories. So a program cannot read ``/sys`` (the
cgroup's accounting of the previous program among others), ``/var``, ``/home`` or anything else, and
can write only its temp directories. From ABI 4 it also handles TCP bind/connect (none granted), from
ABI 6 it scopes abstract Unix sockets and signals to the domain. Each child joins it with one
``landlock_restrict_self`` (:func:`restrict_self`); :func:`scope_calls` builds the second, scope-only
ruleset each call's process joins (``sandbox/harness.py``): it can then signal nothing outside itself.

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


def scope_calls(abi: int) -> int:
    """A ruleset that only scopes signals and abstract Unix sockets (ABI 6+), for each call's process:
    joined on top of the child's, it keeps a call from signalling the process that reports the calls.
    Returns its descriptor, or -1 below ABI 6."""
    if abi < 6:
        return -1
    return _create(0, 0, _SCOPE, abi)


def restrict_function() -> ctypes._CFuncPtr:
    """``landlock_restrict_self`` as a bare function pointer: ``f(446, ruleset_fd, 0)`` -> 0 or -1."""
    fn = ctypes.CDLL(None)["syscall"]
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_long]
    return fn
