"""The worker's namespaces: a new network, mount, IPC and PID namespace, entered once per worker process.

What it does: :func:`setup_worker_isolation` (run once in a fresh, single-threaded worker: new network +
mount + IPC namespace, and a PID namespace whose init is the worker's zygote; in the mount namespace the
filesystem view of ``sandbox/mounts.py``: host mounts read-only, a minimal ``/dev``, ``/run`` covered,
private tmpfs on the world-writable directories, project paths hidden; IPC objects disabled);
:func:`enter_private_ipc` (a child's own IPC namespace, where the worker's could not be disabled);
:func:`mount_own_proc` (the zygote's own mount namespace with a /proc of the worker's PID namespace: a
program sees only the zygote and its own processes).

What it does not: talk to the parent, run untrusted code, or limit resources (``sandbox/cgroups.py``,
``sandbox/confinement.py``). Linux only; needs root (CAP_SYS_ADMIN). Not a security boundary on its own:
see ``sandbox/executor.py``. Tested by ``tests/sandbox/test_sandbox.py`` and the hostile corpus.
"""

from __future__ import annotations

import os

from sandbox.linux import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_REC,
    libc,
    mount,
    unshare,
    write_file,
)
from sandbox.mounts import cover_run, hide, minimal_dev, mount_private_tmp, remount_host_readonly


def setup_worker_isolation(mode: str, hide_paths: list[str], keep_paths: list[str], tmp_mb: int) -> dict:
    """Isolate the calling (fresh, single-threaded) worker process; children inherit it.

    Args:
        mode: ``off`` (nothing), ``auto`` (best available) or ``require`` (raise if unavailable).
        hide_paths: directories covered by an empty read-only tmpfs (the project, its data, $HOME).
        keep_paths: directories under a hidden one that stay visible read-only (the Python install).
        tmp_mb: size of each private tmpfs (:data:`PRIVATE_TMP_DIRS`).

    Returns:
        ``{"network": ..., "filesystem": ..., "ipc": ..., "pid": ..., "hidden": [...], "private_tmp": [...]}``;
        ``private_tmp`` lists the directories to wipe after each program (empty: nothing private);
        ``pid`` starts with ``pidns`` when the worker's next fork (its zygote) is the init of a new PID
        namespace (the worker itself stays outside it).

    Raises:
        OSError: ``mode == "require"`` and a namespace could not be created.
    """
    info: dict = {"network": "none", "filesystem": "none", "ipc": "none", "hidden": [], "private_tmp": []}
    info["dev"] = info["run"] = "host's (no mount namespace)"
    info["pid"] = "host's (no PID namespace)"
    if mode == "off":
        info["network"] = info["filesystem"] = info["ipc"] = info["pid"] = "off"
        return info
    try:
        unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID)
    except OSError as exc:
        if mode == "require":
            raise
        info["network"] = info["filesystem"] = info["ipc"] = info["pid"] = f"unavailable ({exc.strerror})"
        return info
    info["pid"] = PID_NAMESPACE
    info["network"] = "netns (loopback down, no interfaces)"
    info["ipc"] = (
        IPC_DISABLED
        if _disable_ipc()
        else "ipcns per worker and per program (SysV shm/sem/msg, POSIX mqueues)"
    )
    try:
        mount(None, "/", None, MS_REC | MS_PRIVATE)  # never propagate our mounts to the host
        readonly = remount_host_readonly()
        info["dev"] = minimal_dev()
        info["run"] = cover_run()
        info["private_tmp"] = mount_private_tmp(tmp_mb)
        info["hidden"] = hide(hide_paths, keep_paths)
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


PID_NAMESPACE = "pidns per worker (the zygote is its init; its own /proc: no other process visible)"


def mount_own_proc() -> None:
    """In the zygote (the init of the worker's PID namespace, before its filter): its own mount namespace,
    a copy of the worker's, with a fresh /proc of this PID namespace on top. So every child's /proc lists
    only the zygote and the program's own processes (no host or other worker's ``comm``, ``environ``,
    ``net``; ``/proc/1/net`` is the zygote's, i.e. the sandbox's own network namespace). The worker keeps
    the host's /proc (it finds its children's pids there)."""
    unshare(CLONE_NEWNS)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


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
            write_file(path, value)
    except OSError:
        return False
    return True


def enter_private_ipc() -> bool:
    """Give the calling (forked, still privileged) child its own IPC namespace; False if not allowed."""
    return libc.unshare(CLONE_NEWIPC) == 0
