"""Execution limits and the Linux primitives the sandbox uses to apply them (namespaces, rlimits, uids).

What it does: :class:`ExecLimits` (the knobs of one program run); :func:`setup_worker_isolation` (run
once in a fresh worker process: new network + mount + IPC namespace, host mounts read-only, IPC objects
disabled, project paths hidden behind tmpfs, private tmpfs on the world-writable directories);
:func:`setup_worker_cgroup` (a memory + pids cgroup per worker, v2 or v1); :func:`wipe_private_tmp`
(fresh tmpfs after a program); :func:`apply_zygote_limits` (once per zygote: no-new-privs, no core
dumps, inherited by every child); :func:`child_confiner` (built once per zygote, run in each forked child:
rlimits, uid/gid drop, parent-death signal); :func:`sweep_uid` (kill every process of a dedicated uid).

What it does not do: talk to the parent or run untrusted code itself (only :func:`sweep_uid` forks).
Linux only; the namespace and cgroup parts need root (CAP_SYS_ADMIN). Not a security boundary on its own: see ``sandbox/executor.py``.
"""

from __future__ import annotations

import ctypes
import errno
import math
import os
import resource
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
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
MNT_DETACH = 2
_KEPT_MOUNT_FLAGS = MS_NOSUID | MS_NODEV | 0x8 | 0x400 | 0x800  # nosuid nodev noexec noatime nodiratime

PRIVATE_TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock", "/run/shm", "/dev/mqueue")
"""Well-known world-writable directories replaced by a private, size-limited tmpfs in each worker, wiped
after every program (so writes never reach the host or the next program). Every other host mount is made
read-only in the worker's mount namespace, so a world-writable directory missing here is still covered."""
_NOT_REMOUNTED = ("/proc", "/sys")
"""Kernel interfaces left as they are (root-only where writable; the worker needs its cgroup files)."""


@dataclass(frozen=True)
class ExecLimits:
    """Limits of one program run (docs/method.md D3)."""

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
    max_result_bytes: int = 256 * 1024 * 1024
    """Largest total of encoded results of one program (all its calls): a call that would pass it is
    ``unsupported_output`` "result too large". With the decode budget (``sandbox/decoding.py``) this bounds
    the parent's memory per program, hence per batch, whatever the programs return. The default keeps
    every EvalPlus reference whole: prepare's 100-call chunks of HumanEval/15 plus inputs total ~145 MB."""
    isolate_calls: bool = False
    """Each call runs in its own forked copy of the defined program, so no call can change what
    another returns (a call whose argument rebinds the function under test, patches a builtin or
    leaves state in the program's objects); False: all calls in one namespace, in order. Only calls
    that bring code of their own are forked (``sandbox/harness.py``, ``plain``): a call of a function
    the program defined, on constants, runs in the program's process (dataset inputs cost no fork).
    The project's executors turn it on (``sandbox.isolate_calls``, default true, ``sandbox/factory.py``)."""
    max_decode_s: float = 60.0
    """CPU seconds the trusted parent may spend decoding one program's results; calls past it are
    ``unsupported_output`` (``sandbox/decoding.py``). Not lower: HumanEval/130's plus inputs
    (``tri(1000002)``..., a million numbers each) took over 10 s in one program on a loaded machine
    (``pytest -m slow tests/sandbox/test_sandbox_allowlist.py``)."""

    def __post_init__(self) -> None:
        for name in (
            "call_timeout_s",
            "program_timeout_s",
            "memory_mb",
            "max_output_bytes",
            "max_result_bytes",
            "max_decode_s",
        ):
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

# dlopen(NULL): the interpreter's own symbols, libc's included. Not ctypes.util.find_library, which
# imports subprocess, hence threading (an at-fork handler in every zygote: ~0.6 ms CPU per child).
_libc = ctypes.CDLL(None, use_errno=True)
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


_bare_prctl = ctypes.CDLL(None)["prctl"]  # its own function pointer: no argtypes, no errno copy
_SIGKILL = int(signal.SIGKILL)


def set_death_signal(_bare=_bare_prctl, _option=PR_SET_PDEATHSIG, _signal=_SIGKILL) -> None:
    """SIGKILL when our parent dies (PR_SET_PDEATHSIG), through a bare ctypes call with plain ints.

    Why not :func:`prctl`: each forked child calls this twice, and the argument converters and errno
    handling of a full ctypes call touch ~4x more pages (each a copy-on-write fault, ~0.1 ms of CPU
    per child); a failure is retried through :func:`prctl` for its errno. The defaults bind the names
    once (no global look-ups in the child).
    """
    if _bare(_option, _signal, 0, 0, 0) != 0:
        prctl(_option, _signal)


# --------------------------------------------------------------------------------------------------
# Worker-level isolation (once per worker process)
# --------------------------------------------------------------------------------------------------


def setup_worker_isolation(mode: str, hide_paths: list[str], keep_paths: list[str], tmp_mb: int) -> dict:
    """Isolate the calling (fresh, single-threaded) worker process; children inherit it.

    Args:
        mode: ``off`` (nothing), ``auto`` (best available) or ``require`` (raise if unavailable).
        hide_paths: directories covered by an empty read-only tmpfs (the project, its data, $HOME).
        keep_paths: directories under a hidden one that stay visible read-only (the Python install).
        tmp_mb: size of each private tmpfs (:data:`PRIVATE_TMP_DIRS`).

    Returns:
        ``{"network": ..., "filesystem": ..., "ipc": ..., "hidden": [...], "private_tmp": [...]}``;
        ``private_tmp`` lists the directories to wipe after each program (empty: nothing private).

    Raises:
        OSError: ``mode == "require"`` and a namespace could not be created.
    """
    info: dict = {"network": "none", "filesystem": "none", "ipc": "none", "hidden": [], "private_tmp": []}
    info["dev"] = info["run"] = "host's (no mount namespace)"
    if mode == "off":
        info["network"] = info["filesystem"] = info["ipc"] = "off"
        return info
    try:
        _unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC)
    except OSError as exc:
        if mode == "require":
            raise
        info["network"] = info["filesystem"] = info["ipc"] = f"unavailable ({exc.strerror})"
        return info
    info["network"] = "netns (loopback down, no interfaces)"
    info["ipc"] = (
        IPC_DISABLED
        if _disable_ipc()
        else "ipcns per worker and per program (SysV shm/sem/msg, POSIX mqueues)"
    )
    try:
        _mount(None, "/", None, MS_REC | MS_PRIVATE)  # never propagate our mounts to the host
        readonly = _remount_host_readonly()
        info["dev"] = _minimal_dev()
        info["run"] = _cover_run()
        info["private_tmp"] = _mount_private_tmp(tmp_mb)
        info["hidden"] = _hide(hide_paths, keep_paths)
        info["filesystem"] = (
            f"mountns ({readonly} host mounts read-only; private tmpfs on "
            f"{', '.join(info['private_tmp'])}; hidden paths)"
        )
    except OSError as exc:
        if mode == "require":
            raise
        info["filesystem"] = f"partial ({exc.strerror})"
    os.chdir("/")  # never keep a cwd inside a hidden tree
    return info


def _mount_points() -> list[str]:
    """Mount points of this mount namespace, parents first (from /proc/self/mountinfo, octal-unescaped)."""
    points = []
    with open("/proc/self/mountinfo", "rb") as fh:
        for line in fh:
            raw = line.split(b" ")[4]
            points.append(raw.decode("unicode_escape").encode("latin-1").decode("utf-8", "replace"))
    return points


def _remount_host_readonly() -> int:
    """Make every mount but /proc and /sys read-only in this namespace: no host path stays writable,
    whatever world-writable directory the host has (the private tmpfs go on top afterwards)."""
    count = 0
    for point in _mount_points():
        if any(point == k or point.startswith(k + "/") for k in _NOT_REMOUNTED):
            continue
        try:
            kept = os.statvfs(point).f_flag & _KEPT_MOUNT_FLAGS  # ST_* equal MS_* for these
            _mount(None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | kept)
            count += 1
        except OSError:
            continue  # shadowed or vanished mount points cannot be written through either
    return count


def _mount_private_tmp(tmp_mb: int) -> list[str]:
    """Mount a private size-limited tmpfs on each existing world-writable well-known directory."""
    done: list[str] = []
    for path in PRIVATE_TMP_DIRS:
        real = os.path.realpath(path)
        if real in done or not os.path.isdir(real):
            continue
        _mount("tmpfs", real, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmp_mb}m,mode=1777")
        done.append(real)
    return done


MINIMAL_DEV = ("null", "zero", "full", "random", "urandom")
"""The only device nodes a child sees (bound from the host's /dev onto a fresh read-only tmpfs, with the
``fd``/``stdin``/``stdout``/``stderr`` links and empty ``shm`` and ``mqueue`` for the private tmpfs): no
``ptmx``/``pts`` (the host's pty pool), no ``log`` socket, no ``kmsg``, ``tty``, ``fuse``, ``kvm``..."""


def _minimal_dev() -> str:
    """Cover /dev with a tmpfs holding only :data:`MINIMAL_DEV` (bind mounts of the host's nodes)."""
    keep = {}
    for name in MINIMAL_DEV:
        try:
            keep[name] = os.open(f"/dev/{name}", os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
    try:
        _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NODEV | 0x8, "size=64k,nr_inodes=64,mode=0755")
        for name, fd in keep.items():
            os.close(os.open(f"/dev/{name}", os.O_CREAT | os.O_WRONLY, 0o666))
            _mount(f"/proc/self/fd/{fd}", f"/dev/{name}", None, MS_BIND)
        for name in ("shm", "mqueue"):
            os.mkdir(f"/dev/{name}", 0o1777)
        for name, target in (
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ):
            os.symlink(target, f"/dev/{name}")
        _mount(None, "/dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | 0x8, "size=64k,mode=0755")
    finally:
        for fd in keep.values():
            os.close(fd)
    return f"minimal read-only tmpfs ({' '.join(keep)}; shm and mqueue private; no pty, log or tty)"


def _cover_run() -> str:
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
        _mount("tmpfs", real, "tmpfs", flags, "size=4k,nr_inodes=8,mode=0755")
        for d in keep:  # empty, for the private tmpfs mounted there next (PRIVATE_TMP_DIRS)
            os.mkdir(f"{real}/{d}", 0o1777)
        _mount(None, real, None, MS_REMOUNT | MS_RDONLY | flags, "size=4k,nr_inodes=8,mode=0755")
        done.append(real)
    return f"covered by a read-only tmpfs ({', '.join(done) or 'none present'}; only the private lock dirs)"


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


def peak_reset_fds(dirs: list[str]) -> list[int]:
    """Write-only descriptors of the v1 ``memory.max_usage_in_bytes`` files (a "0" written after each
    program resets the high-water mark); v2's ``memory.peak`` resets only for the writer's descriptor."""
    fds = []
    for group in dirs:
        try:
            fds.append(os.open(f"{group}/memory.max_usage_in_bytes", os.O_WRONLY | os.O_CLOEXEC))
        except OSError:
            continue
    return fds


def has_capabilities() -> bool:
    """Whether this process holds any effective or permitted capability (a child forked from it without
    a uid drop keeps them); True where it cannot tell (then assume the worst)."""
    try:
        with open("/proc/self/status") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
        return int(fields["CapEff"], 16) != 0 or int(fields["CapPrm"], 16) != 0
    except (OSError, KeyError, ValueError):
        return True


def join_fresh_keyring(keyctl_nr: int | None) -> bool:
    """Join a new anonymous session keyring (the caller then no longer possesses its parent's); False
    where the call is unavailable."""
    if keyctl_nr is None:
        return False
    return _libc.syscall(keyctl_nr, KEYCTL_JOIN_SESSION_KEYRING, None) >= 0


def wipe_private_tmp(paths: list[str], tmp_mb: int) -> int:
    """Replace each private tmpfs the program used with a fresh one: no walk over a tree the program
    shaped, so nothing it built (deep, wide, unreadable) can make the clean-up fail or last long. An
    unused tmpfs (only its root inode, no block) is left as it is: one statvfs instead of two mounts.

    Returns how many were replaced (Landlock rules name the old ones: ``sandbox/zygote.py`` renews them).

    Raises:
        OSError: a tmpfs could not be replaced (the worker is then unusable: the parent replaces it).
    """
    replaced = 0
    for path in paths:
        st = os.statvfs(path)
        if st.f_files - st.f_ffree <= 1 and st.f_blocks == st.f_bfree:
            continue
        _check(_libc.umount2(path.encode(), MNT_DETACH), f"umount {path}")
        _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmp_mb}m,mode=1777")
        replaced += 1
    return replaced


IPC_DISABLED = "ipcns per worker, SysV shm/sem/msg and POSIX mqueues disabled in it (limits 0)"
_IPC_LIMITS = (
    ("/proc/sys/kernel/shmmni", "0"),
    ("/proc/sys/kernel/shmall", "0"),
    ("/proc/sys/kernel/msgmni", "0"),
    ("/proc/sys/kernel/sem", "0 0 0 0"),
    ("/proc/sys/fs/mqueue/queues_max", "0"),
)


def _disable_ipc() -> bool:
    """Forbid new IPC objects in our fresh IPC namespace (nothing can then cross programs, at no
    per-program cost); False if a limit could not be set (children then get an IPC namespace each)."""
    try:
        for path, value in _IPC_LIMITS:
            _write(path, value)
    except OSError:
        return False
    return True


def enter_private_ipc() -> bool:
    """Give the calling (forked, still privileged) child its own IPC namespace; False if not allowed."""
    return _libc.unshare(CLONE_NEWIPC) == 0


# --------------------------------------------------------------------------------------------------
# cgroups: one per worker, holding one program at a time
# --------------------------------------------------------------------------------------------------


def setup_worker_cgroup(memory_mb: int, max_processes: int, name: str) -> tuple[str, list[str], list[str]]:
    """Create a cgroup for one worker with a memory and a process limit for the program tree it holds.

    cgroup v2 when its memory and pids controllers can be delegated; else the v1 memory and pids
    hierarchies; else nothing. Processes leave when the program is reaped, so the group is "reset" per
    program without any per-program work.

    Returns:
        ``(description, procs_files, dirs)``: what ``ex.isolation["cgroup"]`` shows, the ``cgroup.procs``
        files a child writes ``0`` into to join, and the directories to remove when the worker is gone.
    """
    mem = memory_mb * 1024 * 1024
    why = []
    for attempt in (_cgroup_v2, _cgroup_v1):
        try:
            return attempt(mem, max_processes, name)
        except OSError as exc:
            why.append(f"{attempt.__name__[1:]}: {exc.strerror or exc}")
    return f"unavailable ({'; '.join(why)}); RLIMIT_AS and NPROC only", [], []


def _own_cgroup(controller: str) -> str:
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _, names, path = line.rstrip("\n").split(":", 2)
            if controller in names.split(","):
                return path
    raise OSError(f"no {controller or 'unified'} cgroup in /proc/self/cgroup")


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _cgroup_v2(mem: int, pids: int, name: str) -> tuple[str, list[str], list[str]]:
    root = next(
        (
            r
            for r in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")
            if os.path.exists(f"{r}/cgroup.controllers")
        ),
        None,
    )
    if root is None:
        raise OSError("no cgroup2 mount")
    parent = root + _own_cgroup("").rstrip("/")
    with open(f"{parent}/cgroup.controllers") as fh:
        if not {"memory", "pids"} <= set(fh.read().split()):
            raise OSError("memory/pids controllers not available in cgroup v2")
    _write(f"{parent}/cgroup.subtree_control", "+memory +pids")
    _remove_stale_groups(parent)
    group = f"{parent}/{name}"
    os.mkdir(group)
    try:
        _write(f"{group}/memory.max", str(mem))
        if os.path.exists(f"{group}/memory.swap.max"):
            _write(f"{group}/memory.swap.max", "0")  # no swapping around the limit
        _write(f"{group}/pids.max", str(pids))
    except OSError:
        os.rmdir(group)
        raise
    return f"v2 per worker (memory.max {mem >> 20} MB, pids.max {pids})", [f"{group}/cgroup.procs"], [group]


def _cgroup_v1(mem: int, pids: int, name: str) -> tuple[str, list[str], list[str]]:
    mounts = {}
    with open("/proc/self/mounts") as fh:
        for line in fh:
            _, point, fstype, opts, *_ = line.split()
            for controller in ("memory", "pids"):
                if fstype == "cgroup" and controller in opts.split(","):
                    mounts[controller] = point
    if set(mounts) != {"memory", "pids"}:
        raise OSError("no v1 memory and pids hierarchies")
    made: list[str] = []
    try:
        for controller, setting, value in (
            ("memory", "memory.limit_in_bytes", mem),
            ("pids", "pids.max", pids),
        ):
            parent = mounts[controller] + _own_cgroup(controller).rstrip("/")
            _remove_stale_groups(parent)
            group = f"{parent}/{name}"
            os.mkdir(group)
            made.append(group)
            _write(f"{group}/{setting}", str(value))
        if os.path.exists(f"{made[0]}/memory.memsw.limit_in_bytes"):
            _write(f"{made[0]}/memory.memsw.limit_in_bytes", str(mem))  # no swapping around the limit
    except OSError:
        for group in reversed(made):
            _rmdir_quietly(group)
        raise
    desc = f"v1 memory + pids per worker (memory.limit_in_bytes {mem >> 20} MB, pids.max {pids})"
    return desc, [f"{g}/cgroup.procs" for g in made], made


def _remove_stale_groups(parent: str) -> None:
    """Remove empty groups of dead workers (``codea1-<pid>-...`` whose pid is gone): a worker killed
    with its parent (e.g. a killed Ray actor) cannot remove its own. Once per worker start."""
    try:
        names = [n for n in os.listdir(parent) if n.startswith("codea1-")]
    except OSError:
        return
    for n in names:
        pid = n.split("-")[1]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _rmdir_quietly(f"{parent}/{n}")


def oom_kills(dirs: list[str]) -> int:
    """OOM kills recorded in a worker's memory cgroup so far (0 when unknown); read only after a SIGKILL."""
    for group in dirs:
        for name in ("memory.events", "memory.oom_control"):
            try:
                with open(f"{group}/{name}") as fh:
                    for line in fh:
                        if line.startswith("oom_kill "):
                            return int(line.split()[1])
            except (OSError, ValueError):
                continue
    return 0


def remove_cgroups(dirs: list[str], wait_s: float = 0.5) -> None:
    """Remove a dead worker's cgroup directories; its zygote and children die with it (parent-death
    signal) but may take a moment to leave, so EBUSY is retried for up to ``wait_s`` (then left)."""
    deadline = time.monotonic() + wait_s
    for group in reversed(dirs):
        while True:
            try:
                os.rmdir(group)
            except OSError as exc:
                if exc.errno == errno.EBUSY and time.monotonic() < deadline:
                    time.sleep(0.005)
                    continue
            break


def _rmdir_quietly(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


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
    """The project checkout, its offline data folder and the invoking user's home directory — both ``$HOME``
    and the account's home from the password database: with ``HOME`` pointed elsewhere (CI's fresh home) the
    real one (e.g. a 0700 ``/root`` holding a pyenv interpreter) must still be covered, since only a hidden
    folder gets the interpreter's own directories re-exposed to the unprivileged child."""
    import pwd

    repo = Path(__file__).resolve().parent.parent
    paths = [str(repo), str(Path.home())]
    try:
        account_home = pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:  # a uid without a passwd entry (some containers)
        account_home = ""
    if account_home and os.path.realpath(account_home) != os.path.realpath(paths[1]):
        paths.append(account_home)
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
    bare_prctl = _bare_prctl

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
            bare_prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no process of the uid may open our /proc files
        death_signal()  # after setuid: a uid change clears it

    return confine


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
