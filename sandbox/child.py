"""The sandbox worker (trusted): entry point of one warm worker process, and of a Docker one-shot run.

What it does: :func:`worker_main` is the entry point of one warm worker process started by
``ProcessExecutor`` (a fresh interpreter, never a fork of the caller). The worker isolates itself once
(``namespaces.setup_worker_isolation``, ``cgroups.setup_worker_cgroup``), pre-imports common modules, then
forks a :class:`~sandbox.zygote.Zygote` BEFORE its first job. The zygote forks each child ahead of time
(after the previous one is reaped and cleaned up) and puts it in its own process group and the worker's
cgroup; the child waits for its job on its own pipe; the worker takes it, writes the job (and only its
job), and the child confines itself and runs the harness (``sandbox/harness.py``): define the program,
evaluate each call expression under a per-call ``setitimer``, encode each result with
``codea1_core.values`` and send one authenticated frame per call over a private pipe. The worker
(``sandbox/supervision.py``) enforces the same limits from outside with a wall clock, validates every
frame (token, kind, strictly increasing call index, the program's result-byte cap), has the zygote kill
and reap the child and its descendants and replace the private tmpfs the program used
(``sandbox/zygote.py``), and restarts a child after a hard per-call time-out so one slow call fails only
itself (D3).

The pieces, by responsibility: this file (the worker's job loop, :func:`run_program`), the harness (what
runs the program and its calls), supervision (the worker's reading and limits of a running child), the
zygote (each child's set-up and clean-up); the isolation primitives: ``sandbox/namespaces.py``,
``sandbox/mounts.py``, ``sandbox/cgroups.py``, ``sandbox/confinement.py``, ``sandbox/credentials.py``.

What it does not do: compare values (the trusted parent does, D2), or decode untrusted values.
The threat model is in ``sandbox/executor.py``. Not meant to be run by hand.
"""

from __future__ import annotations

import marshal
import os
import struct
import time

from sandbox import cgroups as _cgroups
from sandbox import credentials as _credentials
from sandbox import landlock as _landlock
from sandbox import limits as _limits
from sandbox import linux as _linux
from sandbox import mounts as _mounts
from sandbox import namespaces as _namespaces
from sandbox import syscall_filter as _syscalls
from sandbox.harness import _TOKEN_BYTES
from sandbox.supervision import _exit_reason, _host_oom_kills, _judge_call_deaths, _supervise
from sandbox.zygote import Zygote

_PRELOAD = (
    "math re collections itertools functools heapq bisect string operator typing random statistics "
    "fractions decimal datetime json copy hashlib array cmath numbers textwrap unicodedata"
).split()


# --------------------------------------------------------------------------------------------------
# Length-prefixed marshal messages on the worker <-> parent pipes (both ends trusted)
# --------------------------------------------------------------------------------------------------


def write_msg(fd: int, obj: object) -> None:
    """Write one length-prefixed marshal message (blocking, handles partial writes)."""
    body = marshal.dumps(obj)
    view = memoryview(struct.pack(">Q", len(body)) + body)
    while view:
        view = view[os.write(fd, view) :]


def read_msg(fd: int) -> object | None:
    """Read one message written by :func:`write_msg`; None on a clean EOF."""
    head = _read_exact(fd, 8)
    if head is None:
        return None
    body = _read_exact(fd, struct.unpack(">Q", head)[0])
    if body is None:
        raise EOFError("pipe closed in the middle of a message")
    return marshal.loads(body)


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


# --------------------------------------------------------------------------------------------------
# Worker
# --------------------------------------------------------------------------------------------------


def worker_main() -> None:
    """Serve batches of jobs from the parent: ``("jobs", [(id, source, exprs), ...])`` -> one
    ``("result", id, calls, output, killed)`` per job, in order, as each ends."""
    rfd, wfd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)  # nothing may ever print into the protocol pipe
    settings = read_msg(rfd)
    if settings is None:
        return
    lim = _limits.ExecLimits(**settings["limits"])
    try:
        isolation = _namespaces.setup_worker_isolation(
            settings["mode"], settings["hide_paths"], settings["keep_paths"], lim.max_file_mb
        )
        _linux.prctl(_linux.PR_SET_CHILD_SUBREAPER, 1)  # orphans of a zygote become our children
    except OSError as exc:
        write_msg(wfd, ("fail", f"isolation unavailable: {exc}"))
        return
    uid = settings["uid"]
    isolation["uid"] = uid if uid is not None else "not dropped"
    cgroup_fds: list[int] = []
    if settings["mode"] != "off" and os.geteuid() == 0:
        name = f"codea1-{os.getpid()}-{os.urandom(4).hex()}"
        isolation["cgroup"], procs, isolation["cgroup_dirs"] = _cgroups.setup_worker_cgroup(
            lim.memory_mb, lim.max_processes, name
        )
        cgroup_fds = [os.open(path, os.O_WRONLY | os.O_CLOEXEC) for path in procs]
    else:
        isolation["cgroup"], isolation["cgroup_dirs"] = "off (needs root and namespaces)", []
    _preload()
    ctx = {
        "lim": lim,
        "uid": uid,
        "private_tmp": isolation["private_tmp"],
        "cgroup_fds": cgroup_fds,
        "cgroup_dirs": isolation["cgroup_dirs"],
        "ipc": isolation["ipc"].startswith("ipcns per worker and per program"),
        "pidns": isolation["pid"].startswith("pidns"),
        "n": 0,
        "oom_seen": 0,
        "host_oom_seen": _host_oom_kills(),
        "peak_fds": _cgroups.peak_reset_fds(isolation["cgroup_dirs"]),
    }
    isolation["accounting"] = (
        "memory high-water mark reset after every program (v1)"
        if ctx["peak_fds"]
        else "v2 memory.peak cannot be reset for other readers: unreadable to programs under Landlock"
        if isolation["cgroup_dirs"]
        else "no cgroup"
    )
    _deny_layers(settings, isolation, ctx)
    # The zygote is forked now, before any job exists in this process: every child forks from it, so
    # nothing of an earlier program (results, outputs, job data, frames, freed buffers) is reachable.
    ctx["zygote"] = Zygote(ctx, close_fds=(rfd, wfd))
    write_msg(wfd, ("hello", isolation))
    while True:
        msg = read_msg(rfd)
        if msg is None or msg[0] == "exit":  # (None: the parent is gone and cannot clean up for us)
            ctx["zygote"].close()
            _cgroups.remove_cgroups(ctx["cgroup_dirs"])
            return
        for job_id, source, exprs in msg[1]:  # ("jobs", batch): each job in order, each reported alone
            ctx["killed"] = (
                None  # (why, host_oom) of a death by a signal from outside (sandbox/supervision.py)
            )
            try:
                calls, output = run_program(source, exprs, ctx)
            except Exception as exc:  # our machinery failed (fork, mount, ...): the parent replaces us
                write_msg(wfd, ("infra", job_id, f"{type(exc).__name__}: {exc}"))
                break
            write_msg(wfd, ("result", job_id, calls, output, ctx["killed"]))


def _deny_layers(settings: dict, isolation: dict, ctx: dict) -> None:
    """Prepare, once per worker, the deny-by-default layers the zygote and each child apply
    (``sandbox/zygote.py``): a fresh anonymous session keyring (the worker joins one first, so not even
    it possesses the trusted parent's), the Landlock ruleset and what each call's process runs to join a
    scope ruleset of its own
    (``sandbox/landlock.py``), the seccomp allow-list's two filters (``sandbox/syscall_filter.py``).
    ``settings["deny"]``: ``on`` (default), ``off`` (the
    benchmark's baseline) or ``kill`` (the allow-list's measurement: a denied call kills the process).
    ``isolation`` gets one line per layer: active, or why not."""
    deny = settings.get("deny", "on")
    ctx.update(join_keyring=None, restrict=_landlock.restrict_function(), landlock_fd=-1, scope_join=None)
    ctx["seccomp_load"] = ctx["seccomp_zygote"] = None
    if deny == "off":
        for layer in ("seccomp", "landlock", "keyring"):
            isolation[layer] = "off (deny='off')"
        return
    keyctl = _syscalls.syscall_number("keyctl") or _credentials.KEYCTL_NR.get(os.uname().machine)
    fresh = _credentials.join_fresh_keyring(keyctl)  # the worker's own: the parent's is possessed no more
    try:
        # Children that keep capabilities (no uid drop, running as root) could use the set-up calls the
        # zygote's filter allows with its own arguments: they also load a short filter denying them.
        privileged = ctx["uid"] is None and _credentials.has_capabilities()
        zygote_filter, child_filter = _syscalls.build_filters(
            "kill" if deny == "kill" else "eperm", uid=ctx["uid"], children_privileged=privileged
        )
        ctx["seccomp_zygote"] = _syscalls.loader(zygote_filter)
        ctx["seccomp_load"] = _syscalls.loader(child_filter) if child_filter else None
        per_child = (
            f"{len(child_filter) // 8} more by each program (it keeps privileges)"
            if child_filter
            else "none per program"
        )
        isolation["seccomp"] = (
            f"on (allow-list: {len(zygote_filter) // 8} BPF instructions loaded once by the zygote, "
            f"{per_child}; default {'kill' if deny == 'kill' else 'EPERM'}; libseccomp)"
        )
    except OSError as exc:
        isolation["seccomp"] = f"unavailable ({exc}; install libseccomp2)"
        if settings.get("mode") == "require":
            raise
    # A fresh keyring per program costs its creation and the kernel's collection of it (a sizeable share
    # of a trivial program's CPU, bench/sandbox_bench.py): where the allow-list denies every keyring call
    # (keyctl, add_key, request_key) no program can put, find or read a key, so the worker's fresh
    # keyring, shared by its children and unusable by them, is enough; without the filter each program
    # joins its own.
    if not fresh:
        isolation["keyring"] = "unavailable (no keyctl here): the parent's session keyring stays possessed"
    elif ctx["seccomp_zygote"] is not None:
        isolation["keyring"] = (
            "a fresh anonymous session keyring per worker; keyring calls denied to programs"
        )
    else:
        ctx["join_keyring"] = _credentials.keyring_joiner(keyctl)
        isolation["keyring"] = "a fresh anonymous session keyring per program (no syscall filter)"
    tmp = isolation.get("private_tmp") or ["/tmp"]  # (no private tmpfs: the children's dirs are in /tmp)
    try:
        # (the hidden paths' covering tmpfs are empty but for the interpreter bound back: listing
        # them shows what it showed before Landlock)
        read = [
            *(settings.get("keep_paths") or []),
            *_mounts.python_keep_paths(),
            *isolation.get("hidden", []),
        ]
        ctx["landlock_fd"], abi = _landlock.make_ruleset(read, tmp)

        def refresh(fd: int = ctx["landlock_fd"]) -> None:  # same descriptor, rules for the new tmpfs
            new = _landlock.make_ruleset(read, tmp)[0]
            os.dup2(new, fd)
            os.close(new)

        ctx["landlock_refresh"] = refresh
        ctx["scope_join"] = _landlock.scope_joiner(abi)
        isolation["landlock"] = (
            f"on (ABI {abi}: read-only interpreter and system dirs, read-write {', '.join(tmp)}"
            + ("; TCP, abstract sockets and signals scoped" if abi >= 6 else "")
            + ")"
            if abi
            else "unavailable (the kernel has no Landlock, or it is disabled)"
        )
    except OSError as exc:
        isolation["landlock"] = f"unavailable ({exc})"


def _preload() -> None:
    """Import the modules programs commonly use, once per worker, without their at-fork handlers.

    Only ``random`` registers one (``os.register_at_fork`` reseeding its generator in every forked
    process, paid in page faults through the Python method in every child); the zygote reseeds it
    for each child just before the fork instead (:func:`_reseed_random`, same entropy source). Suppressing the
    registration here is safe: the worker is single-threaded and nothing else is imported meanwhile.
    """
    register = os.register_at_fork
    os.register_at_fork = lambda **_hooks: None
    try:
        for name in _PRELOAD:
            try:
                __import__(name)
            except ImportError:
                pass
    finally:
        os.register_at_fork = register


def oneshot_main(root: str) -> None:
    """Docker backend entry point: run ``<root>/job.marshal`` and write ``<root>/out/result.marshal``.

    The job file holds ``(settings, source, exprs)``; the container provides network/filesystem
    isolation, so namespaces are not set up here, but rlimits and the uid drop still apply. The zygote
    starts before the job is read (one container runs one program, so there is nothing else to hide).
    """
    with open(os.path.join(root, "job.marshal"), "rb") as fh:
        settings, source, exprs = marshal.load(fh)
    lim = _limits.ExecLimits(**settings["limits"])
    ctx = {
        "lim": lim,
        "uid": settings["uid"],
        "private_tmp": [],
        "cgroup_fds": [],
        "cgroup_dirs": [],
        "ipc": False,
        "pidns": False,
        "n": 0,
        "oom_seen": 0,
        "peak_fds": [],
        "pin_pages": False,  # one program per container: nothing to spare later forks
    }
    _deny_layers(settings, {"private_tmp": []}, ctx)
    try:
        ctx["zygote"] = Zygote(ctx, close_fds=())
        try:
            result: tuple = ("result", 0, *run_program(source, exprs, ctx))
        finally:
            ctx["zygote"].close()
    except Exception as exc:
        result = ("infra", 0, f"{type(exc).__name__}: {exc}")
    os.makedirs(os.path.join(root, "out"), exist_ok=True)
    tmp = os.path.join(root, "out", "result.tmp")
    with open(tmp, "wb") as fh:
        marshal.dump(result, fh)
    os.replace(tmp, os.path.join(root, "out", "result.marshal"))


def run_program(source: str, exprs: list[str], ctx: dict) -> tuple[list[tuple], bytes]:
    """Run one program's calls in fresh children; returns ``[(status, payload, error, dur_s)]`` and output."""
    lim: _limits.ExecLimits = ctx["lim"]
    n = len(exprs)
    calls: list[tuple | None] = [None] * n
    output = bytearray()
    deadline = time.monotonic() + lim.program_timeout_s
    start, used = 0, 0
    while start < n:
        got, end, detail = _run_child(source, exprs, start, used, deadline, ctx, output)
        for index, item in got.items():
            calls[index] = item
            used += len(item[1])
        unreported = [i for i in range(n) if calls[i] is None]
        if end == "done":
            break
        if end == "infra":
            raise RuntimeError(detail)
        if end == "violation":  # a forgery attempt taints every result of the program
            return [("error", b"", f"SandboxViolation: {detail}", 0.0)] * n, bytes(output)
        if end == "program_error":
            for i in unreported:
                calls[i] = ("program_error", b"", detail, 0.0)
            break
        if end == "call_timeout":
            calls[detail] = (
                "timeout",
                b"",
                f"Timeout: call exceeded {lim.call_timeout_s} s",
                lim.call_timeout_s,
            )
            start = detail + 1
            if time.monotonic() < deadline:
                continue
            end, detail = "program_cap", ""
        for i in range(n):
            if calls[i] is None:
                if end == "program_cap":
                    calls[i] = (
                        "timeout",
                        b"",
                        f"Timeout: program cap of {lim.program_timeout_s} s reached",
                        0.0,
                    )
                else:  # the child died: a cgroup OOM kill is the program's memory, anything else an error
                    calls[i] = ("memory" if detail.startswith("MemoryError") else "error", b"", detail, 0.0)
        break
    return calls, bytes(output)  # type: ignore[return-value]


def _run_child(
    source: str, exprs: list[str], start: int, used: int, deadline: float, ctx: dict, output: bytearray
) -> tuple[dict, str, object]:
    """Run the calls from ``start`` in the zygote's next child; ``used``: result bytes so far."""
    lim: _limits.ExecLimits = ctx["lim"]
    zygote: Zygote = ctx["zygote"]
    pidfd, _tmp, job_w, chan_r, out_r = zygote.take()
    token = os.urandom(_TOKEN_BYTES)
    cpu_s = max(deadline - time.monotonic(), 0.0) + 1.0
    try:
        try:  # the child's own job, and only it; a child that died before reading it is seen below
            write_msg(job_w, (source, exprs, start, token, lim.max_result_bytes - used, cpu_s))
        except OSError:
            pass
        os.close(job_w)
        got, end, detail = _supervise(
            pidfd, chan_r, out_r, token, len(exprs), start, used, deadline, lim, output
        )
    finally:
        os.close(chan_r)
        os.close(out_r)
        os.close(pidfd)
        status = zygote.reap()  # kills what is left, wipes the private tmpfs; raises if it could not
    if end == "died":
        end, detail = _exit_reason(status, *detail, ctx)
    _judge_call_deaths(got, ctx)  # isolated calls' processes killed: the cgroup's OOM killer, or outside?
    return got, end, detail
