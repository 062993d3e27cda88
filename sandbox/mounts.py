"""The filesystem a worker's programs see, laid out in its own mount namespace, and the clean-up between programs.

What it does: :func:`remount_host_readonly` (every host mount but ``/proc`` and ``/sys`` read-only);
:func:`minimal_dev` (``/dev`` with :data:`MINIMAL_DEV` only); :func:`cover_run` (``/run``, where host
daemons keep their sockets, covered); :func:`mount_private_tmp` (a private size-limited tmpfs on each of
:data:`PRIVATE_TMP_DIRS`) and :func:`wipe_private_tmp` (a fresh one after a program); :func:`hide` (the
project, its data and the user's home behind an empty tmpfs, the interpreter's directories kept readable),
with :func:`default_hide_paths` and :func:`python_keep_paths`.

What it does not: create the mount namespace (``sandbox/namespaces.py`` does, then calls these in order).
Linux only; needs root (CAP_SYS_ADMIN). Tested by ``tests/sandbox/test_sandbox.py``,
``tests/sandbox/test_sandbox_deny.py`` and the hostile corpus.
"""

from __future__ import annotations

import os

from sandbox.linux import (
    MNT_DETACH,
    MS_BIND,
    MS_NOATIME,
    MS_NODEV,
    MS_NOSUID,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    check,
    libc,
    mount,
)

_KEPT_MOUNT_FLAGS = MS_NOSUID | MS_NODEV | 0x8 | 0x400 | 0x800  # nosuid nodev noexec noatime nodiratime

PRIVATE_TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock", "/run/shm", "/dev/mqueue")
"""Well-known world-writable directories replaced by a private, size-limited tmpfs in each worker, wiped
after every program (so writes never reach the host or the next program). Every other host mount is made
read-only in the worker's mount namespace, so a world-writable directory missing here is still covered."""
_NOT_REMOUNTED = ("/proc", "/sys")
"""Kernel interfaces left as they are (root-only where writable; the worker needs its cgroup files)."""


def _mount_points() -> list[str]:
    """Mount points of this mount namespace, parents first (from /proc/self/mountinfo, octal-unescaped)."""
    points = []
    with open("/proc/self/mountinfo", "rb") as fh:
        for line in fh:
            raw = line.split(b" ")[4]
            points.append(raw.decode("unicode_escape").encode("latin-1").decode("utf-8", "replace"))
    return points


def remount_host_readonly() -> int:
    """Make every mount but /proc and /sys read-only in this namespace: no host path stays writable,
    whatever world-writable directory the host has (the private tmpfs go on top afterwards)."""
    count = 0
    for point in _mount_points():
        if any(point == k or point.startswith(k + "/") for k in _NOT_REMOUNTED):
            continue
        try:
            kept = os.statvfs(point).f_flag & _KEPT_MOUNT_FLAGS  # ST_* equal MS_* for these
            mount(None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | kept)
            count += 1
        except OSError:
            continue  # shadowed or vanished mount points cannot be written through either
    return count


def mount_private_tmp(tmp_mb: int) -> list[str]:
    """Mount a private size-limited tmpfs on each existing world-writable well-known directory."""
    done: list[str] = []
    for path in PRIVATE_TMP_DIRS:
        real = os.path.realpath(path)
        if real in done or not os.path.isdir(real):
            continue
        mount("tmpfs", real, "tmpfs", TMPFS_FLAGS, f"size={tmp_mb}m,mode=1777")
        done.append(real)
    return done


TMPFS_FLAGS = MS_NOSUID | MS_NODEV | MS_NOATIME
"""The private tmpfs' mount flags: ``noatime``, so reading a directory changes none of its times."""


def wipe_private_tmp(paths: list[str], tmp_mb: int, stamps: dict[str, int]) -> int:
    """Leave each private tmpfs as a fresh one would be for the next program: replace each the program
    used with a fresh one (no walk over a tree the program shaped, so nothing it built, deep, wide or
    unreadable, can make the clean-up fail or last long; and a fresh tmpfs restarts its inode numbers,
    so how many files a program made and removed cannot be read by the next), then set every root's
    access and modification times to 0 (its change time is then that of this clean-up, whatever the
    program did).

    A tmpfs is used when its root's change time differs from ``stamps[path]`` (recorded here after the
    last clean-up: creating or removing anything in it, or touching it, changes it; anything deeper
    needs an entry in it first); an unused one costs one stat: its times are still the zeros set here
    (any change of its access or modification time changes its change time, and the tmpfs is mounted
    ``noatime``, so reading it changes none).

    Returns how many were replaced (Landlock rules name the old ones: ``sandbox/zygote.py`` renews them).

    Raises:
        OSError: a tmpfs could not be replaced (the worker is then unusable: the parent replaces it).
    """
    replaced = 0
    for path in paths:
        if os.stat(path).st_ctime_ns == stamps.get(path):
            continue
        check(libc.umount2(path.encode(), MNT_DETACH), f"umount {path}")
        mount("tmpfs", path, "tmpfs", TMPFS_FLAGS, f"size={tmp_mb}m,mode=1777")
        replaced += 1
        os.utime(path, ns=(0, 0))
        stamps[path] = os.stat(path).st_ctime_ns
    return replaced


MINIMAL_DEV = ("null", "zero", "full", "random", "urandom")
"""The only device nodes a child sees (bound from the host's /dev onto a fresh read-only tmpfs, with the
``fd``/``stdin``/``stdout``/``stderr`` links and empty ``shm`` and ``mqueue`` for the private tmpfs): no
``ptmx``/``pts`` (the host's pty pool), no ``log`` socket, no ``kmsg``, ``tty``, ``fuse``, ``kvm``..."""


def minimal_dev() -> str:
    """Cover /dev with a tmpfs holding only :data:`MINIMAL_DEV` (bind mounts of the host's nodes)."""
    keep = {}
    for name in MINIMAL_DEV:
        try:
            keep[name] = os.open(f"/dev/{name}", os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
    try:
        mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NODEV | 0x8, "size=64k,nr_inodes=64,mode=0755")
        for name, fd in keep.items():
            os.close(os.open(f"/dev/{name}", os.O_CREAT | os.O_WRONLY, 0o666))
            mount(f"/proc/self/fd/{fd}", f"/dev/{name}", None, MS_BIND)
        for name in ("shm", "mqueue"):
            os.mkdir(f"/dev/{name}", 0o1777)
        for name, target in (
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ):
            os.symlink(target, f"/dev/{name}")
        mount(None, "/dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | 0x8, "size=64k,mode=0755")
    finally:
        for fd in keep.values():
            os.close(fd)
    return f"minimal read-only tmpfs ({' '.join(keep)}; shm and mqueue private; no pty, log or tty)"


def cover_run() -> str:
    """Cover /run and /var/run (where host daemons keep their sockets: the system bus, journald's
    /dev/log, Docker, Ray) with a read-only tmpfs holding only empty ``lock``/``shm`` directories
    where the host has them (the private tmpfs go there)."""
    done: list[str] = []
    for path in ("/run", "/var/run"):
        real = os.path.realpath(path)
        if real in done or not os.path.isdir(real):
            continue
        keep = [
            d for d in ("lock", "shm") if os.path.isdir(f"{real}/{d}") and not os.path.islink(f"{real}/{d}")
        ]
        flags = MS_NOSUID | MS_NODEV | 0x8
        mount("tmpfs", real, "tmpfs", flags, "size=4k,nr_inodes=8,mode=0755")
        for d in keep:  # empty, for the private tmpfs mounted there next (PRIVATE_TMP_DIRS)
            os.mkdir(f"{real}/{d}", 0o1777)
        mount(None, real, None, MS_REMOUNT | MS_RDONLY | flags, "size=4k,nr_inodes=8,mode=0755")
        done.append(real)
    return f"covered by a read-only tmpfs ({', '.join(done) or 'none present'}; only the private lock dirs)"


def hide(hide_paths: list[str], keep_paths: list[str]) -> list[str]:
    hidden = []
    for hide in sorted({os.path.realpath(p) for p in hide_paths if p and os.path.isdir(p)}):
        if hide == "/" or any(hide == h or hide.startswith(h + "/") for h in hidden):
            continue
        keeps = [k for k in {os.path.realpath(p) for p in keep_paths} if k.startswith(hide + "/")]
        keeps = [k for k in keeps if not any(k.startswith(o + "/") for o in keeps)]  # outermost only
        keep_fds = {k: os.open(k, os.O_PATH | os.O_DIRECTORY) for k in keeps if os.path.isdir(k)}
        try:
            mount("tmpfs", hide, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
            for keep, fd in keep_fds.items():
                os.makedirs(keep, mode=0o755, exist_ok=True)
                mount(f"/proc/self/fd/{fd}", keep, None, MS_BIND | MS_REC)
                mount(None, keep, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID)
            mount(None, hide, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        finally:
            for fd in keep_fds.values():
                os.close(fd)
        hidden.append(hide)
    return hidden


def default_hide_paths() -> list[str]:
    """The project checkout, its offline data folder and the invoking user's home directory — both ``$HOME``
    and the account's home from the password database: with ``HOME`` pointed elsewhere (CI's fresh home) the
    real one (e.g. a 0700 ``/root`` holding a pyenv interpreter) must still be covered, since only a hidden
    folder gets the interpreter's own directories re-exposed to the unprivileged child."""
    import pwd

    repo = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    paths = [repo, os.path.expanduser("~")]
    try:
        account_home = pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:  # a uid without a passwd entry (some containers)
        account_home = ""
    if account_home and os.path.realpath(account_home) != os.path.realpath(paths[1]):
        paths.append(account_home)
    data = os.environ.get("CODEA1_DATA_DIR") or os.path.join(os.path.dirname(repo), "shared")
    paths.append(data)
    return paths


def python_keep_paths() -> list[str]:
    """Directories the child's interpreter needs to import modules (kept visible, read-only)."""
    import sys
    import sysconfig

    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.update(p for p in sysconfig.get_paths().values() if p)
    return sorted(os.path.realpath(p) for p in paths)
