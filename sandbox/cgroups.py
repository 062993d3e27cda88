"""cgroups: one per worker, holding one program at a time, with a memory and a process limit.

What it does: :func:`setup_worker_cgroup` (cgroup v2 where its memory and pids controllers can be
delegated, else the v1 hierarchies, else nothing); :func:`oom_kills` (OOM kills recorded so far);
:func:`peak_reset_fds` (v1 high-water marks reset after each program); :func:`remove_cgroups` (a dead
worker's groups removed).

What it does not: put processes in a group (each child writes ``0`` into the ``cgroup.procs`` files
returned, ``sandbox/zygote.py``), or limit anything per call. Linux only; needs root or a delegated
subtree. Tested by ``tests/sandbox/test_sandbox.py`` (memory and process limits).
"""

from __future__ import annotations

import errno
import os
import time

from sandbox.linux import write_file


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
    write_file(f"{parent}/cgroup.subtree_control", "+memory +pids")
    _remove_stale_groups(parent)
    group = f"{parent}/{name}"
    os.mkdir(group)
    try:
        write_file(f"{group}/memory.max", str(mem))
        if os.path.exists(f"{group}/memory.swap.max"):
            write_file(f"{group}/memory.swap.max", "0")  # no swapping around the limit
        write_file(f"{group}/pids.max", str(pids))
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
            write_file(f"{group}/{setting}", str(value))
        if os.path.exists(f"{made[0]}/memory.memsw.limit_in_bytes"):
            write_file(f"{made[0]}/memory.memsw.limit_in_bytes", str(mem))  # no swapping around the limit
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
