"""Execution limits and the Linux primitives the sandbox uses to apply them (namespaces, rlimits, uids).

What it does: :class:`ExecLimits` (the knobs of one program run); :func:`setup_worker_isolation` (run
once in a fresh worker process: new network + mount namespace, project paths hidden behind tmpfs,
private /tmp); :func:`apply_child_limits` (run in each forked child: rlimits, uid/gid drop,
no-new-privs, parent-death signal); :func:`sweep_uid` (kill every process of a dedicated uid).

What it does not do: fork, talk to the parent, or run untrusted code itself. Linux only; the namespace
parts need root (CAP_SYS_ADMIN). Not a security boundary on its own: see ``sandbox/executor.py``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import resource
import signal
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38

PRIVATE_TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
"""Directories replaced by a private, size-limited tmpfs in each worker (so writes never reach the host)."""


@dataclass(frozen=True)
class ExecLimits:
    """Limits of one program run (ALGORITHM.md D3)."""

    call_timeout_s: float = 2.0
    """Wall-clock limit of one call (expression); a time-out fails only that call."""
    program_timeout_s: float = 10.0
    """Wall-clock cap of the whole program; calls left unrun count as time-outs."""
    memory_mb: int = 1024
    """Address-space limit (RLIMIT_AS) of the child."""
    max_output_bytes: int = 65536
    """Captured stdout+stderr is truncated to this many bytes (the rest is drained and dropped)."""
    define_timeout_s: float | None = None
    """Limit of the program's top level (definition); None = ``call_timeout_s``."""
    max_file_mb: int = 64
    """RLIMIT_FSIZE of the child and size of each private tmpfs."""
    max_open_files: int = 256
    """RLIMIT_NOFILE of the child."""
    max_processes: int = 64
    """RLIMIT_NPROC of the dedicated uid, threads included (only enforced when privileges are dropped)."""
    max_value_bytes: int = 64 * 1024 * 1024
    """Largest encoded result of one call; larger results are ``unsupported_output``."""

    def __post_init__(self) -> None:
        for name in ("call_timeout_s", "program_timeout_s", "memory_mb", "max_output_bytes"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ExecLimits.{name}: expected a positive number, got {value!r}")
        if self.define_timeout_s is not None and self.define_timeout_s <= 0:
            raise ValueError(
                f"ExecLimits.define_timeout_s: expected > 0 or None, got {self.define_timeout_s!r}"
            )

    @property
    def effective_define_timeout_s(self) -> float:
        """Top-level (definition) time limit."""
        return self.call_timeout_s if self.define_timeout_s is None else self.define_timeout_s


# --------------------------------------------------------------------------------------------------
# libc
# --------------------------------------------------------------------------------------------------

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _unshare(flags: int) -> None:
    _check(_libc.unshare(flags), f"unshare({flags:#x})")


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def prctl(option: int, arg: int = 0) -> None:
    """Call prctl(2) with one argument."""
    _check(_libc.prctl(option, arg, 0, 0, 0), f"prctl({option})")


# --------------------------------------------------------------------------------------------------
# Worker-level isolation (once per worker process)
# --------------------------------------------------------------------------------------------------


def setup_worker_isolation(mode: str, hide_paths: list[str], keep_paths: list[str], tmp_mb: int) -> dict:
    """Isolate the calling (fresh, single-threaded) worker process; children inherit it.

    Args:
        mode: ``off`` (nothing), ``auto`` (best available) or ``require`` (raise if unavailable).
        hide_paths: directories covered by an empty read-only tmpfs (the project, its data, $HOME).
        keep_paths: directories under a hidden one that stay visible read-only (the Python install).
        tmp_mb: size of the private tmpfs mounted on /tmp, /var/tmp and /dev/shm.

    Returns:
        ``{"network": ..., "filesystem": ..., "hidden": [...], "private_tmp": bool}``.

    Raises:
        OSError: ``mode == "require"`` and a namespace could not be created.
    """
    info: dict = {"network": "none", "filesystem": "none", "hidden": [], "private_tmp": False}
    if mode == "off":
        info["network"] = info["filesystem"] = "off"
        return info
    try:
        _unshare(CLONE_NEWNET | CLONE_NEWNS)
    except OSError as exc:
        if mode == "require":
            raise
        info["network"] = info["filesystem"] = f"unavailable ({exc.strerror})"
        return info
    info["network"] = "netns (loopback down, no interfaces)"
    try:
        _mount(None, "/", None, MS_REC | MS_PRIVATE)  # never propagate our mounts to the host
        for path in PRIVATE_TMP_DIRS:
            if os.path.isdir(path):
                _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmp_mb}m,mode=1777")
        info["private_tmp"] = True
        info["hidden"] = _hide(hide_paths, keep_paths)
        info["filesystem"] = "mountns (private tmpfs on /tmp, /var/tmp, /dev/shm; hidden paths)"
    except OSError as exc:
        if mode == "require":
            raise
        info["filesystem"] = f"partial ({exc.strerror})"
    os.chdir("/")  # never keep a cwd inside a hidden tree
    return info


def _hide(hide_paths: list[str], keep_paths: list[str]) -> list[str]:
    hidden = []
    for hide in sorted({os.path.realpath(p) for p in hide_paths if p and os.path.isdir(p)}):
        if hide == "/" or any(hide == h or hide.startswith(h + "/") for h in hidden):
            continue
        keeps = [k for k in {os.path.realpath(p) for p in keep_paths} if k.startswith(hide + "/")]
        keeps = [k for k in keeps if not any(k.startswith(o + "/") for o in keeps)]  # outermost only
        keep_fds = {k: os.open(k, os.O_PATH | os.O_DIRECTORY) for k in keeps if os.path.isdir(k)}
        try:
            _mount("tmpfs", hide, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
            for keep, fd in keep_fds.items():
                os.makedirs(keep, mode=0o755, exist_ok=True)
                _mount(f"/proc/self/fd/{fd}", keep, None, MS_BIND | MS_REC)
                _mount(None, keep, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID)
            _mount(None, hide, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        finally:
            for fd in keep_fds.values():
                os.close(fd)
        hidden.append(hide)
    return hidden


def default_hide_paths() -> list[str]:
    """The project checkout, its offline data folder and the invoking user's home directory."""
    repo = Path(__file__).resolve().parent.parent
    paths = [str(repo), str(Path.home())]
    data = os.environ.get("CODEA1_DATA_DIR") or str(repo.parent / "shared")
    paths.append(data)
    return paths


def python_keep_paths() -> list[str]:
    """Directories the child's interpreter needs to import modules (kept visible, read-only)."""
    import sys
    import sysconfig

    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.update(p for p in sysconfig.get_paths().values() if p)
    return sorted(os.path.realpath(p) for p in paths)


# --------------------------------------------------------------------------------------------------
# Child-level limits (once per forked child)
# --------------------------------------------------------------------------------------------------


def apply_child_limits(limits: ExecLimits, cpu_s: float, uid: int | None) -> None:
    """Apply rlimits, then drop to ``uid`` (gid = uid) when given; call in the forked child.

    Raises:
        OSError: a limit or the uid change could not be applied (the child must then exit).
    """
    mem = limits.memory_mb * 1024 * 1024
    cpu = max(1, math.ceil(cpu_s))
    fsize = limits.max_file_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.max_open_files, limits.max_open_files))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # too-large writes fail with EFBIG instead of killing
    if uid is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after setuid: a uid change clears it


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
