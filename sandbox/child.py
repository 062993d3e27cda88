"""The sandbox worker (trusted) and the harness it forks for each program (runs UNTRUSTED code).

What it does: :func:`worker_main` is the entry point of one warm worker process started by
``ProcessExecutor`` (a fresh interpreter, never a fork of the caller). The worker isolates itself once
(``limits.setup_worker_isolation``, ``limits.setup_worker_cgroup``), pre-imports common modules, then
forks a :class:`Zygote` BEFORE its first job. The zygote forks each child ahead of time (after the
previous one is reaped and cleaned up) and puts it in its own process group and the worker's cgroup;
the child waits for its job on its own pipe; the worker takes it, writes the job (and only its job), and the child applies rlimits,
drops to the worker's dedicated uid and runs the harness (:func:`_make_harness`): define the
program, evaluate each call expression under a per-call ``setitimer``, encode each result with
``codea1_core.values`` and send one authenticated frame per call over a private pipe. The worker
(:func:`_supervise`) enforces the same limits from outside with a wall clock, validates every frame
(token, kind, strictly increasing call index, the program's result-byte cap), has the zygote kill and
reap the child and its descendants and replace the private tmpfs the program used, and restarts a child
after a hard per-call time-out so one slow call fails only itself (D3).

What it does not do: compare values (the trusted parent does, D2), or decode untrusted values.
The threat model is in ``sandbox/executor.py``. Not meant to be run by hand.
"""

from __future__ import annotations

import _random
import _signal
import fcntl
import gc
import hmac
import io
import marshal
import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable

from codea1_core import values
from sandbox import limits as _limits

STATUS_CODES = ("ok", "error", "timeout", "memory", "unsupported_output")
_HDR = struct.Struct(">I")
_FRAME = struct.Struct(">cBid")  # kind, status code, call index, child-measured seconds (after the token)
_TOKEN_BYTES = 16
_ERROR_CHARS = 1000
_SETUP_S = 10.0  # generous: a child that cannot even start on a loaded machine is an infra failure
_COALESCE_MS = 1  # see _supervise: how long the worker lets small frames gather before reading them
_COALESCE_BYTES = 4096
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
    """Serve jobs from the parent: ``("job", id, source, exprs)`` -> ``("result", id, calls, output)``."""
    rfd, wfd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)  # nothing may ever print into the protocol pipe
    settings = read_msg(rfd)
    if settings is None:
        return
    lim = _limits.ExecLimits(**settings["limits"])
    try:
        isolation = _limits.setup_worker_isolation(
            settings["mode"], settings["hide_paths"], settings["keep_paths"], lim.max_file_mb
        )
        _limits.prctl(_limits.PR_SET_CHILD_SUBREAPER, 1)  # orphans of a zygote become our children
    except OSError as exc:
        write_msg(wfd, ("fail", f"isolation unavailable: {exc}"))
        return
    uid = settings["uid"]
    isolation["uid"] = uid if uid is not None else "not dropped"
    cgroup_fds: list[int] = []
    if settings["mode"] != "off" and os.geteuid() == 0:
        name = f"codea1-{os.getpid()}-{os.urandom(4).hex()}"
        isolation["cgroup"], procs, isolation["cgroup_dirs"] = _limits.setup_worker_cgroup(
            lim.memory_mb, lim.max_processes, name
        )
        cgroup_fds = [os.open(path, os.O_WRONLY | os.O_CLOEXEC) for path in procs]
    else:
        isolation["cgroup"], isolation["cgroup_dirs"] = "off (needs root and namespaces)", []
    _preload()
    ctx = {
        "lim": lim,
        "uid": uid,
        "devnull": devnull,
        "private_tmp": isolation["private_tmp"],
        "cgroup_fds": cgroup_fds,
        "cgroup_dirs": isolation["cgroup_dirs"],
        "ipc": isolation["ipc"].startswith("ipcns per worker and per program"),
        "n": 0,
        "oom_seen": 0,
    }
    # The zygote is forked now, before any job exists in this process: every child forks from it, so
    # nothing of an earlier program (results, outputs, job data, frames, freed buffers) is reachable.
    ctx["zygote"] = Zygote(ctx, close_fds=(rfd, wfd))
    write_msg(wfd, ("hello", isolation))
    while True:
        msg = read_msg(rfd)
        if msg is None or msg[0] == "exit":  # (None: the parent is gone and cannot clean up for us)
            ctx["zygote"].close()
            _limits.remove_cgroups(ctx["cgroup_dirs"])
            return
        _, job_id, source, exprs = msg
        try:
            calls, output = run_program(source, exprs, ctx)
        except Exception as exc:  # our machinery failed (fork, mount, ...): the parent replaces us
            write_msg(wfd, ("infra", job_id, f"{type(exc).__name__}: {exc}"))
            continue
        write_msg(wfd, ("result", job_id, calls, output))


def _preload() -> None:
    """Import the modules programs commonly use, once per worker, without their at-fork handlers.

    Only ``random`` registers one (``os.register_at_fork`` reseeding its generator in every forked
    process, ~0.2 ms of CPU per child in page faults through the Python method); the zygote reseeds it
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


def _reseed_random() -> None:
    """Fresh OS entropy for ``random``'s shared generator, as its at-fork handler would give; the
    zygote calls it just before each fork, so every child starts from its own seed (the gauss cache
    is already empty: no trusted code draws from the generator)."""
    module = sys.modules.get("random")
    if module is not None:
        _random.Random.seed(module._inst)


def oneshot_main(root: str) -> None:
    """Docker backend entry point: run ``<root>/job.marshal`` and write ``<root>/out/result.marshal``.

    The job file holds ``(settings, source, exprs)``; the container provides network/filesystem
    isolation, so namespaces are not set up here, but rlimits and the uid drop still apply. The zygote
    starts before the job is read (one container runs one program, so there is nothing else to hide).
    """
    with open(os.path.join(root, "job.marshal"), "rb") as fh:
        settings, source, exprs = marshal.load(fh)
    lim = _limits.ExecLimits(**settings["limits"])
    devnull = os.open(os.devnull, os.O_RDWR)
    ctx = {
        "lim": lim,
        "uid": settings["uid"],
        "devnull": devnull,
        "private_tmp": [],
        "cgroup_fds": [],
        "cgroup_dirs": [],
        "ipc": False,
        "n": 0,
        "oom_seen": 0,
    }
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
    pid, _tmp, job_w, chan_r, out_r = zygote.take()
    token = os.urandom(_TOKEN_BYTES)
    cpu_s = max(deadline - time.monotonic(), 0.0) + 1.0
    try:
        try:  # the child's own job, and only it; a child that died before reading it is seen below
            write_msg(job_w, (source, exprs, start, token, lim.max_result_bytes - used, cpu_s))
        except OSError:
            pass
        os.close(job_w)
        got, end, detail = _supervise(
            pid, chan_r, out_r, token, len(exprs), start, used, deadline, lim, output
        )
    finally:
        os.close(chan_r)
        os.close(out_r)
        status = zygote.reap(pid)  # kills what is left, wipes the private tmpfs; raises if it could not
    if end == "died":
        end, detail = _exit_reason(status, *detail, ctx)
    return got, end, detail


_Q = struct.Struct(">q")
_FDS = struct.Struct("3i")  # three descriptors as SCM_RIGHTS data (what socket.send_fds builds, less work)
_SOL_SOCKET, _SCM_RIGHTS = socket.SOL_SOCKET, socket.SCM_RIGHTS
_QQ = struct.Struct(">qq")
_FD = struct.Struct("i")
_FDS_SPACE = socket.CMSG_LEN(_FDS.size)


def _recv_fds(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One message and the descriptors that came with it (as ``socket.recv_fds(sock, 4096, 3)``, whose
    Python wrapper builds an ``array`` per call: this is the worker's path for every program)."""
    msg, ancdata, _flags, _addr = sock.recvmsg(4096, _FDS_SPACE)
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == _SOL_SOCKET and kind == _SCM_RIGHTS:
            fds += [fd for (fd,) in _FD.iter_unpack(data[: len(data) - len(data) % _FD.size])]
    return msg, fds


class Zygote:
    """The process every program's child is forked from (trusted; worker side and zygote side).

    Forked from the worker before the first job, it never receives job data. It forks each child ahead
    of time (after cleaning up the previous one) and hands the worker the child's temp dir and the
    worker's ends of its three pipes (job in, result channel, output) BEFORE the fork, so the child
    never holds them, then the child's pid; the child joins the cgroup, then waits for its job on its
    own pipe. So the fork is off the worker's critical path and one round trip
    per program remains: ``reap``. The zygote is a subreaper: it reaps each child and any descendant
    left, and replaces the private tmpfs, before it forks the next child.
    """

    def __init__(self, ctx: dict, close_fds: tuple[int, ...]) -> None:
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        worker = os.getpid()
        pid = os.fork()
        if pid == 0:  # ---- zygote: never returns
            code = 0
            try:
                self.sock.close()
                for fd in close_fds:  # the worker's protocol pipes: only the worker talks to the parent
                    os.close(fd)
                _limits.prctl(_limits.PR_SET_PDEATHSIG, signal.SIGKILL)
                if os.getppid() == worker:
                    _limits.prctl(_limits.PR_SET_CHILD_SUBREAPER, 1)
                    _prepare_zygote(ctx)
                    gc.collect()
                    gc.freeze()  # fewer copy-on-write page faults in forked children
                    _zygote_loop(theirs, ctx)
            except BaseException:
                code = 70
            os._exit(code)
        theirs.close()
        self.pid = pid

    def take(self) -> tuple[int, str, int, int, int]:
        """The next child, waiting for its job: ``(pid, tmp, job_w, chan_r, out_r)``."""
        msg, fds = _recv_fds(self.sock)
        if msg[:1] == b"C" and len(fds) == 3:
            tmp, msg = msg[1:].decode(), self.sock.recv(16)  # then the pid (or why the fork failed)
            if msg[:1] == b"P" and len(msg) == 9:
                return _Q.unpack_from(msg, 1)[0], tmp, *fds
        for fd in fds:
            os.close(fd)
        err = _Q.unpack_from(msg, 1)[0] if msg[:1] == b"E" else 0
        raise OSError(err, f"sandbox zygote could not prepare a child: {os.strerror(err) if err else 'gone'}")

    def close(self) -> None:
        """Stop the zygote (it drops the child it had ready and that child's temp dir).

        The offer of that child is read first (its pipe ends closed unused): closing the socket with it
        unread made the zygote's next read fail (ECONNRESET) before it could clean up.
        """
        try:
            self.sock.send(b"Q")
            self.sock.settimeout(5.0)
            for _ in range(3):  # offer, pid, then our "Q" back
                msg, fds, _flags, _addr = socket.recv_fds(self.sock, 4096, 3)
                for fd in fds:
                    os.close(fd)
                if msg in (b"Q", b""):
                    break
        except OSError:
            pass
        self.sock.close()

    def reap(self, pid: int) -> int:
        """Kill the child ``pid`` with its descendants, wait for it, clean up; returns its wait status."""
        self.sock.send(b"R" + _Q.pack(pid))
        reply = self.sock.recv(32)
        if len(reply) != _QQ.size:
            raise OSError(f"sandbox zygote died ({len(reply)}-byte reply)")
        status, err = _QQ.unpack(reply)
        if err:
            raise OSError(err, f"sandbox clean-up failed: {os.strerror(err)}")
        return status


def _prepare_zygote(ctx: dict) -> None:
    """Once, in the zygote: every step of a child's set-up that is the same for all children.

    Why here: a forked child pays a copy-on-write page fault for each page it writes, and every Python
    object it touches is written (its reference count), so each Python step in a child costs tens of
    microseconds of CPU; what the zygote does once, every child inherits for free. Inherited by each
    child exactly as if it had done it itself: no-new-privs, RLIMIT_CORE 0 and SIGXFSZ ignored
    (``limits.apply_zygote_limits``); default SIGINT/SIGTERM/SIGALRM/SIGCHLD (SIGPIPE stays ignored);
    unbuffered text streams on descriptors 1 and 2 (each child dup2s its output pipe onto them, so
    output reaches the pipe even when the child is killed); the scrubbed environment (HOME and TMPDIR
    are set by :func:`_zygote_loop`); the trusted modules dropped from ``sys.modules``.
    """
    _limits.apply_zygote_limits()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), "utf-8", "backslashreplace", write_through=True
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), "utf-8", "backslashreplace", write_through=True
    )
    os.environ.clear()
    os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"})
    # Dropped here, once, so no child can import them, and no child pays for dropping them (a pop per
    # module in each child wrote ~11 pages, each a copy-on-write fault); this reference keeps each module
    # alive (the zygote's own code still runs from them; it imports nothing after this).
    ctx["trusted_modules"] = {
        m: v for m, v in sys.modules.items() if m.split(".")[0] in ("sandbox", "codea1_core")
    }
    for name in ctx["trusted_modules"]:
        del sys.modules[name]
    ctx["harness"] = _make_harness(ctx["lim"])
    ctx["rlimits"] = _limits.child_rlimits(ctx["lim"], ctx["uid"] is not None)
    ctx["child_main"] = _make_child_main(ctx)
    ctx["tmp_prefix"] = f"/tmp/codea1-run-{os.getpid()}-"
    ctx["environ_store"] = os.environ._data  # bytes -> bytes on POSIX; see _prepare_child


def _zygote_loop(sock: socket.socket, ctx: dict) -> None:
    """Offer a child, then serve reap requests (each followed by the next offer); exits with the worker.

    One flat loop with every name bound to a local first. Why: each fork write-protects every page of the
    zygote, so each page its loop then writes (the reference count of a global looked up, the frame of a
    helper called) is a page fault per program.
    """
    recv, send, sendmsg, close, fork = sock.recv, sock.send, sock.sendmsg, os.close, os.fork
    unpack, pack_q, pack_status, pack_fds = _Q.unpack_from, _Q.pack, _QQ.pack, _FDS.pack
    reap, clean, prepare, child_main = _reap, _clean_tmp, _prepare_child, ctx["child_main"]
    uid, sock_fd, sol_socket, scm_rights = ctx["uid"], sock.fileno(), _SOL_SOCKET, _SCM_RIGHTS
    setpgid, write, cgroup_fds = os.setpgid, os.write, tuple(ctx["cgroup_fds"])
    tmp, reaping, offered = "", 0, -1
    while True:
        if reaping:  # the child the worker took ran its program: kill, reap, clean up
            status, err = reap(reaping, uid), 0
            try:
                clean(tmp, ctx)
            except OSError as exc:
                err = exc.errno or 5
            send(pack_status(status, err))
            if err:
                return  # the worker reports infra and is replaced
        try:
            tmp, job_r, job_w, chan_r, chan_w, out_r, out_w = prepare(ctx)
        except OSError as exc:
            send(b"E" + pack_q(exc.errno or 5))
            offered = -1
        else:
            # The worker's ends leave before the fork: the child never holds them (so a worker that dies
            # means EOF on the child's job pipe), and there is less to do while the child shares our pages.
            try:
                sendmsg([b"C" + tmp.encode()], [(sol_socket, scm_rights, pack_fds(job_w, chan_r, out_r))])
            finally:
                close(job_w)
                close(chan_r)
                close(out_r)
            try:
                offered = fork()
            except OSError as exc:
                offered = -(exc.errno or 11)
            if offered == 0:
                child_main(sock_fd, job_r, chan_w, out_w, tmp)
            close(job_r)
            close(chan_w)
            close(out_w)
            if offered > 0:  # its own group (_reap kills the group with every descendant) and the
                try:  # worker's cgroup (memory.max, pids.max), both before the worker can send its job:
                    setpgid(offered, offered)  # done here, where these paths are warm, they cost the
                    for fd in cgroup_fds:  # child no page faults (~20 when it did them itself)
                        write(fd, b"%d" % offered)
                except OSError as exc:
                    reap(offered, uid)
                    remove_tree(tmp)
                    offered = -(exc.errno or 5)
            send((b"P" + pack_q(offered)) if offered > 0 else (b"E" + pack_q(-offered)))
        msg = recv(64)
        if msg == b"Q":  # the worker stops: drop the waiting child and its temp dir (a host dir when
            if offered > 0:  # there are no namespaces)
                reap(offered, uid)
            remove_tree(tmp)
            send(b"Q")
            return
        if len(msg) != 9 or msg[:1] != b"R":
            return
        reaping = unpack(msg, 1)[0]


def _prepare_child(ctx: dict) -> tuple[str, int, int, int, int, int, int]:
    """The per-child steps that need no job, done in the zygote just before the fork: the child's own
    temp dir (a fresh path, owned by its uid; empty, so an unused tmpfs still needs no remount) as HOME
    and TMPDIR, fresh entropy for ``random`` (as its at-fork handler would give), and the three pipes,
    the child's result channel already moved to a random descriptor >= 1024 (it cannot be
    ``dup2``-ed over once RLIMIT_NOFILE is lower).

    HOME and TMPDIR are written straight into ``os.environ``'s store and the C environment, as
    ``os.environ[...] = ...`` does without its encoder calls (fewer pages written after each fork).

    Returns ``(tmp, job_r, job_w, chan_r, chan_w, out_r, out_w)``; raises OSError (nothing left open).
    """
    ctx["n"] += 1
    tmp = ctx["tmp_prefix"] + str(ctx["n"])
    raw, store, putenv = tmp.encode(), ctx["environ_store"], os.putenv
    putenv(b"HOME", raw)
    putenv(b"TMPDIR", raw)
    store[b"HOME"] = store[b"TMPDIR"] = raw  # the rest of the environment: _prepare_zygote
    os.mkdir(tmp, 0o700)
    if ctx["uid"] is not None:
        os.chown(tmp, ctx["uid"], ctx["uid"])
    _reseed_random()
    fds: list[int] = []
    try:
        for _ in range(3):
            fds += os.pipe()
        # In [1024, 1280): above RLIMIT_NOFILE, and the descriptor table stays at 2,048 slots, which fork
        # copies and close_range walks in every child (anywhere up to 9,215, as before, grew it to up to
        # 16,384: ~0.05 ms of CPU per program).
        high = 1024 + os.urandom(1)[0]
        chan_w = fcntl.fcntl(fds[3], fcntl.F_DUPFD_CLOEXEC, high)
        os.close(fds[3])
        fds[3] = chan_w
    except OSError:
        for fd in fds:
            os.close(fd)
        os.rmdir(tmp)
        raise
    return (tmp, *fds)  # type: ignore[return-value]


def _make_child_main(ctx: dict) -> Callable[[int, int, int, int, str], None]:
    """Build, once in the zygote, what each forked child runs: ``child_main(sock_fd, job_r, chan, out_w,
    tmp)`` sets its death signal (and enters an IPC namespace where needed), waits for the job, confines
    itself and runs the harness; it never returns. (Its process group and cgroup are set by the zygote
    before the worker learns its pid, so before any job can reach it.)

    Why a closure: every function, constant and setting it needs is bound here, so a child looks up no
    module global and no ``ctx`` key (each look-up writes the reference count of what it finds, and a
    written page is a copy-on-write fault: ~2.5 us of CPU each). Whatever is the same for every child
    was done once by the zygote (:func:`_prepare_zygote`), or for this child just before the fork
    (:func:`_prepare_child`: its temp dir, ``random``'s seed, its result channel ``chan`` at a random
    high descriptor).
    """
    close, readv, dup2, closerange, chdir, exit_ = (
        os.close,
        os.readv,
        os.dup2,
        os.closerange,
        os.chdir,
        os._exit,
    )
    death_signal, enter_ipc, read_rest, loads, view, size_of = (
        _limits.set_death_signal,
        _limits.enter_private_ipc if ctx["ipc"] else None,
        _read_job_rest,
        marshal.loads,
        memoryview,
        int.from_bytes,
    )
    devnull, harness = ctx["devnull"], ctx["harness"]
    buffers = [bytearray(65536)]  # the job lands here: no allocation (a 64 KiB bytes object was ~6 faults)
    buffer = view(buffers[0])
    confine = _limits.child_confiner(ctx["rlimits"], ctx["uid"])

    def child_main(sock_fd: int, job_r: int, chan: int, out_w: int, tmp: str) -> None:
        try:
            close(sock_fd)
            death_signal()  # until the uid drop sets it again
            # (the zygote has put us in our own process group and in the worker's cgroup)
            if enter_ipc is not None and not enter_ipc():
                exit_(72)
            # The job, usually in one read (see _read_job_rest for the rest); reads of 1 MiB to EOF, as
            # before, were an mmap + mremap + munmap per child.
            n = readv(job_r, buffers)
            if n >= 8 and n == 8 + size_of(buffer[:8], "big"):
                job = loads(buffer[8:n])
            else:
                job = read_rest(job_r, bytes(buffer[:n]))
            source, exprs, start, token, budget, cpu_s = job
            # Output on 1 and 2, no descriptor above 2 but the channel, in tmp, limited, unprivileged.
            dup2(devnull, 0)
            dup2(out_w, 1)  # sys.stdout/sys.stderr (made by the zygote) write to descriptors 1 and 2
            dup2(out_w, 2)
            closerange(3, chan)  # the job pipe, the cgroup files, /dev/null, the output pipe's original
            closerange(chan + 1, 65536)
            chdir(tmp)
            confine(cpu_s)
            harness(source, exprs, start, chan, token, budget)
        except BaseException:
            pass
        exit_(71)

    return child_main


def _read_job_rest(fd: int, data: bytes) -> tuple:
    """A job that did not come in one read (large, or written in pieces); a short one raises EOFError."""
    buf = bytearray(data)
    while len(buf) < 8 or len(buf) < 8 + int.from_bytes(buf[:8], "big"):
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            raise EOFError("the job pipe closed before the whole job came")
        buf += chunk
    if len(buf) != 8 + int.from_bytes(buf[:8], "big"):
        raise EOFError("the job pipe held more than one job")
    return marshal.loads(memoryview(buf)[8:])


def _reap(pid: int, uid: int | None) -> int:
    """Kill ``pid``'s process group and ``pid``, wait for it, then reap every orphan; returns its status."""
    for target in (-pid, pid):
        try:
            os.kill(target, signal.SIGKILL)
        except OSError:
            pass
    try:
        status = os.waitpid(pid, 0)[1]
    except ChildProcessError:
        status = -1
    # We are a child subreaper: any descendant still alive is (or will become) our child.
    for _ in range(100):
        try:
            wpid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if wpid == 0:
            if uid is not None:
                _limits.sweep_uid(uid)
            else:
                _kill_children()
            time.sleep(0.001)
    return status


def _kill_children() -> None:
    me = str(os.getpid())
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
                if fields[1].decode() == me:
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, IndexError):
                continue


def _clean_tmp(tmp: str, ctx: dict) -> None:
    """Leave nothing of the program for the next one, without walking what it built when possible.

    With private tmpfs (namespaces on) each is replaced by a fresh one; otherwise the program's own temp
    dir is removed by an iterative walk (no recursion, so no tree shape can make it raise).

    Raises:
        OSError: a private tmpfs could not be replaced (the worker reports infra and is replaced).
    """
    if ctx["private_tmp"]:
        try:
            os.rmdir(tmp)  # empty (the usual case): /tmp may then need no remount at all
        except OSError:
            pass
        _limits.wipe_private_tmp(ctx["private_tmp"], ctx["lim"].max_file_mb)
    else:
        remove_tree(tmp)


def remove_tree(path: str) -> None:
    """Remove ``path`` and everything under it: iterative, via directory descriptors (any depth, no
    path-length limit, symlinks never followed, each directory visited once); what cannot be removed
    (e.g. past the descriptor limit) is left in place, never raised."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        top = os.open(path, flags)
    except OSError:
        try:
            os.unlink(path)
        except OSError:
            pass
        return
    stack, names = [(top, iter(_entries(top)))], [path]
    while stack:
        fd, entries = stack[-1]
        entry = next(entries, None)
        if entry is None:  # directory emptied: close it and remove it from its parent
            os.close(fd)
            stack.pop()
            name = names.pop()
            try:
                os.rmdir(name, dir_fd=stack[-1][0]) if stack else os.rmdir(name)
            except OSError:
                pass
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                sub = os.open(entry.name, flags, dir_fd=fd)
                stack.append((sub, iter(_entries(sub))))
                names.append(entry.name)
            else:
                os.unlink(entry.name, dir_fd=fd)
        except OSError:
            continue


def _entries(fd: int) -> list:
    try:
        return list(os.scandir(fd))
    except OSError:
        return []


# --------------------------------------------------------------------------------------------------
# Supervision (worker side, trusted)
# --------------------------------------------------------------------------------------------------


class _Progress:
    """Worker-side view of one child: the frames accepted so far."""

    def __init__(self, start: int, used: int) -> None:
        self.used = used  # encoded result bytes of the program so far (earlier children included)
        self.ready = self.defined = False  # "set-up done" / "program defined" frames seen
        self.expect = start  # next call index
        self.t_last = time.monotonic()  # arrival of the last accepted frame (our clock)
        self.results: dict[int, tuple] = {}
        self.buf = bytearray()

    def mark(self) -> tuple:
        return (self.ready, self.defined, self.expect)


def _supervise(
    pid: int,
    chan_r: int,
    out_r: int,
    token: bytes,
    n: int,
    start: int,
    used: int,
    deadline: float,
    lim: _limits.ExecLimits,
    output: bytearray,
) -> tuple[dict, str, object]:
    """Read frames until every call reported, the child died, or a deadline passed.

    Returns ``(results, end, detail)``; ``end`` in done / program_error / violation / call_timeout /
    program_cap / infra, or died with ``detail = (still_alive, ready, defined)`` (the reason needs
    the wait status, known once the zygote reaped the child).

    Small frames coming fast are taken together: first, and after a wake-up that brought fewer than
    :data:`_COALESCE_BYTES` before the program was defined or within :data:`_COALESCE_MS` of the
    previous ones, the wait is on the child's exit only, for at most :data:`_COALESCE_MS` (never past a deadline), then whatever arrived is read
    at once. Why: every frame woke the worker (a context switch, often a cross-CPU wake-up, and a pass
    of this loop), three per trivial program and one per call; a frame's arrival time is then known to
    within that window, which no time limit (seconds) can notice. A window that brings nothing ends the
    coalescing, so slow calls still cost one wake-up per frame, as before.
    """
    st = _Progress(start, used)
    pidfd = os.pidfd_open(pid)
    poller, exit_poller = select.poll(), select.poll()
    for fd in (chan_r, out_r, pidfd):
        poller.register(fd, select.POLLIN)
    exit_poller.register(pidfd, select.POLLIN)
    coalesce = True  # the child needs its set-up anyway: its first frames are read together too
    last_data = time.monotonic()
    try:
        while True:
            limit_s = (
                lim.call_timeout_s if st.defined else lim.effective_define_timeout_s if st.ready else _SETUP_S
            )
            hard = st.t_last + limit_s + 0.25 + 0.1 * limit_s
            until = min(hard, deadline)
            before, exited, got = st.mark(), False, len(st.buf)
            wait_ms = max(0, int((until - time.monotonic()) * 1000) + 1)
            if coalesce:
                exited = bool(exit_poller.poll(min(wait_ms, _COALESCE_MS)))
                # (bounded: a child writing without pause must not fill our memory before a frame is
                # checked; more than a window's worth turns coalescing off, and the rest is read as before)
                st.buf += _read_available(chan_r, 1 << 20)
                _drain_output(out_r, output, lim.max_output_bytes, None)
            for fd, _ev in () if coalesce else poller.poll(wait_ms):
                if fd == out_r:
                    _drain_output(out_r, output, lim.max_output_bytes, poller)
                elif fd == chan_r:
                    try:
                        data = os.read(chan_r, 1 << 20)
                    except BlockingIOError:
                        continue
                    if not data:
                        poller.unregister(chan_r)
                        exited = True  # nothing more can arrive: treat like an exit
                    st.buf += data
                else:
                    exited = True
            now, new = time.monotonic(), len(st.buf) - got
            # a window that brought small frames is followed by another; so is a wake-up before the
            # program is defined (the next frames are near), or one whose frame came soon after the
            # previous ones (so slow calls still cost one wake-up per frame, as before)
            soon = coalesce or not st.defined or now - last_data < _COALESCE_MS / 1000
            coalesce = 0 < new < _COALESCE_BYTES and soon
            if new:
                last_data = now
            late = now >= until
            if exited or late:  # before judging, take whatever is already in the pipe
                st.buf += _read_available(chan_r)
            end = _accept_frames(st, token, n, lim)
            if end is not None:
                return st.results, *end
            if exited:  # the channel may close just before the exit is visible
                alive = not select.select([pidfd], [], [], 0.2)[0]
                return st.results, "died", (alive, st.ready, st.defined)
            if late and st.mark() == before:
                if not st.ready:  # our own set-up never finished: not the program's doing
                    return st.results, "infra", f"sandbox child did not start within {limit_s} s"
                if not st.defined and hard <= deadline:
                    return st.results, "program_error", f"Timeout: program top level exceeded {limit_s} s"
                return st.results, ("call_timeout", "program_cap")[deadline < hard], st.expect
    finally:
        _drain_output(out_r, output, lim.max_output_bytes, None)
        os.close(pidfd)


def _accept_frames(st: _Progress, token: bytes, n: int, lim: _limits.ExecLimits) -> tuple[str, object] | None:
    """Consume complete frames from ``st.buf``; returns ``(end, detail)`` when the child is finished."""
    arrival = time.monotonic()
    while len(st.buf) >= 4:
        size = _HDR.unpack_from(st.buf)[0]
        if size > lim.max_value_bytes + 4096 or size < _TOKEN_BYTES + _FRAME.size:
            return "violation", f"bad frame size {size}"
        if len(st.buf) < 4 + size:
            return None
        frame = bytes(st.buf[4 : 4 + size])
        del st.buf[: 4 + size]
        if not hmac.compare_digest(frame[:_TOKEN_BYTES], token):
            return "violation", "frame without the run token"
        kind, code, index, child_s = _FRAME.unpack_from(frame, _TOKEN_BYTES)
        payload = frame[_TOKEN_BYTES + _FRAME.size :]
        if kind == b"S" and not st.ready:
            st.ready, st.t_last = True, arrival
        elif kind == b"R" and st.ready and not st.defined:
            st.defined, st.t_last = True, arrival
        elif kind == b"P" and st.ready and not st.defined:
            return "program_error", payload.decode("utf-8", "replace")
        elif kind == b"C" and st.defined and index == st.expect and code < len(STATUS_CODES):
            st.results[index] = _call_result(code, payload, arrival - st.t_last, child_s, lim, st.used)
            st.used += len(st.results[index][1])
            st.t_last, st.expect = arrival, st.expect + 1
            if st.expect == n:
                return "done", None
        else:
            return "violation", f"unexpected frame {kind!r} index {index} (expected {st.expect})"
    return None


def _call_result(
    code: int, payload: bytes, dur_s: float, child_s: float, lim: _limits.ExecLimits, used: int
) -> tuple:
    """One reported call. The harness judged its own time-out and result budget; our clock (``dur_s``)
    and byte count (``used``) are the backstop: a result arriving after our hard limit, or passing the
    program's result cap, is never ``ok``."""
    status = STATUS_CODES[code]
    if status == "ok" and dur_s > lim.call_timeout_s * 1.1 + 0.25:  # past our hard limit: never "ok"
        return ("timeout", b"", f"Timeout: call exceeded {lim.call_timeout_s} s", dur_s)
    if status == "ok" and used + len(payload) > lim.max_result_bytes:
        status, payload = "unsupported_output", _too_large(lim.max_result_bytes).encode()
    # Frames read in one batch share an arrival time; the child's measurement is finer when plausible.
    shown_s = child_s if 0.0 <= child_s <= dur_s + 0.01 or dur_s == 0.0 else dur_s
    shown_s = min(max(shown_s, 0.0), lim.call_timeout_s + 0.1)
    if status == "ok":
        return ("ok", payload, "", shown_s)
    return (status, b"", payload.decode("utf-8", "replace")[:_ERROR_CHARS], shown_s)


def _too_large(cap: int) -> str:
    return f"UnsupportedValue: result too large (the program's results exceed {cap} bytes)"


def _exit_reason(status: int, alive: bool, ready: bool, defined: bool, ctx: dict) -> tuple[str, object]:
    """Why a child stopped reporting, from its wait status (``alive``: it had not exited by itself)."""
    if alive:
        what = "closed its result channel"
    elif status == -1:
        what = "unknown status"
    elif os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        what = f"signal {signal.Signals(sig).name}" if sig in signal.valid_signals() else f"signal {sig}"
        if sig == signal.SIGXCPU:
            return "program_cap", ""
        if sig == signal.SIGKILL and ready and _oom_killed(ctx):
            detail = "MemoryError: the program's processes exceeded the memory limit (cgroup OOM kill)"
            return ("exited" if defined else "program_error"), detail
    elif os.WIFEXITED(status):
        what = f"code {os.WEXITSTATUS(status)}"
    else:
        what = "unknown status"
    if not ready:  # died before the harness ran any untrusted code: our machinery failed
        return "infra", f"sandbox child failed during set-up ({what})"
    if not defined:
        return "program_error", f"ProgramExited: program exited during definition ({what})"
    return "exited", f"ChildExited: child exited before reporting this call ({what})"


def _oom_killed(ctx: dict) -> bool:
    """Whether the worker's cgroup counted a new OOM kill (read only after a SIGKILL death)."""
    kills = _limits.oom_kills(ctx["cgroup_dirs"])
    new, ctx["oom_seen"] = kills > ctx["oom_seen"], kills
    return new


def _drain_output(fd: int, output: bytearray, cap: int, poller: select.poll | None) -> None:
    try:
        data = os.read(fd, 1 << 16) if poller is not None else _read_available(fd, 1 << 20)
    except OSError:
        data = b""
    if not data and poller is not None:
        poller.unregister(fd)
    room = cap - len(output)
    if room > 0:
        output += data[:room]


def _read_available(fd: int, limit: int | None = None) -> bytes:
    """What ``fd`` holds now (to EOF or until it would block), at most about ``limit`` bytes when given."""
    os.set_blocking(fd, False)
    chunks, got = [], 0
    try:
        while limit is None or got < limit:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except (BlockingIOError, OSError):
        pass
    return b"".join(chunks)


# --------------------------------------------------------------------------------------------------
# Harness (in the child, after limits and the uid drop; untrusted code runs from here on)
# --------------------------------------------------------------------------------------------------


class _CallTimeout(BaseException):
    pass


def _on_alarm(signum, frame):  # noqa: ARG001
    raise _CallTimeout


def _make_harness(lim: _limits.ExecLimits) -> Callable[..., None]:
    """Build the harness once, in the zygote, with everything it needs bound as closure variables.

    Bound before any untrusted code exists, so patching builtins, modules or ``sys.modules`` afterwards
    cannot change what is sent (see the threat model); and bound once, so a child writes (hence copies)
    only the pages of the objects its program's path actually uses (binding them in every child wrote
    to each of them, ~35 page faults).
    """
    write, pack_hdr, pack_frame, exit_ = os.write, _HDR.pack, _FRAME.pack, os._exit
    encode, unsupported = values.encode, values.UnsupportedValue
    # _signal.signal, not signal.signal: the latter's Python wrapper converts the previous handler to a
    # Handlers enum member, and for our own handler that conversion fails and formats a ValueError (an
    # enum look-up, an exception and a repr in every child: ~25 page faults and their CPU).
    setitimer, real, now, sig, alarm = (
        signal.setitimer,
        signal.ITIMER_REAL,
        time.monotonic,
        _signal.signal,
        int(signal.SIGALRM),
    )
    compile_, eval_, exec_, len_, range_, view_ = compile, eval, exec, len, range, memoryview
    type_, str_, base_exc, error_chars = type, str, BaseException, _ERROR_CHARS
    timeout_exc, memory_exc, on_alarm = _CallTimeout, MemoryError, _on_alarm
    call_s, define_s, max_bytes = lim.call_timeout_s, lim.effective_define_timeout_s, lim.max_value_bytes
    too_large = _too_large(lim.max_result_bytes).encode()
    builtins_ = __builtins__

    def describe(exc: BaseException) -> str:
        """``"Type: message"`` without trusting the exception (its ``__str__`` is untrusted code)."""
        try:
            name = type_(exc).__name__
        except base_exc:
            name = "Exception"
        try:
            setitimer(real, 0.5)
            try:
                msg = str_(exc)
            finally:
                setitimer(real, 0)
            if type_(msg) is not str_:
                msg = "<unprintable>"
        except base_exc:
            msg = "<unprintable>"
        return f"{name}: {msg}"[:error_chars]

    def harness(source: str, exprs: list[str], start: int, chan: int, token: bytes, budget: int) -> None:
        """Define ``source``, evaluate ``exprs[start:]``, one authenticated frame each on ``chan``."""

        def send(kind: bytes, code: int, index: int, payload: bytes, seconds: float = 0.0) -> None:
            body = token + pack_frame(kind, code, index, seconds) + payload
            view = view_(pack_hdr(len_(body)) + body)
            while view:
                view = view[write(chan, view) :]

        namespace: dict = {"__name__": "program", "__builtins__": builtins_}
        send(b"S", 0, -1, b"")  # set-up done: from here on, a death is the program's doing
        try:
            try:
                sig(alarm, on_alarm)
                setitimer(real, define_s)
                exec_(compile_(source, "<program>", "exec"), namespace)
            finally:
                setitimer(real, 0)
        except timeout_exc:
            send(b"P", 0, -1, f"Timeout: program top level exceeded {define_s} s".encode())
            exit_(0)
        except BaseException as exc:  # noqa: BLE001 - any top-level failure is a program error
            send(b"P", 0, -1, describe(exc).encode("utf-8", "replace"))
            exit_(0)
        send(b"R", 0, -1, b"")  # defined
        for index in range_(start, len_(exprs)):
            code, payload, t0 = 0, b"", now()
            try:
                try:
                    sig(alarm, on_alarm)
                    t0 = now()
                    setitimer(real, call_s)
                    payload = encode(eval_(compile_(exprs[index], "<call>", "eval"), namespace))
                finally:
                    setitimer(real, 0)
                if now() - t0 > call_s:
                    code, payload = 2, f"Timeout: call exceeded {call_s} s".encode()
                elif len_(payload) > max_bytes:
                    code, payload = 4, f"UnsupportedValue: result larger than {max_bytes} bytes".encode()
                elif len_(payload) > budget:
                    code, payload = 4, too_large
                else:
                    budget -= len_(payload)
            except timeout_exc:
                code, payload = 2, f"Timeout: call exceeded {call_s} s".encode()
            except memory_exc:
                code, payload = 3, b"MemoryError: memory limit reached"
            except unsupported as exc:
                code, payload = 4, f"UnsupportedValue: {exc.args[0] if exc.args else ''}".encode()
            except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt included
                code, payload = 1, describe(exc).encode("utf-8", "replace")
            send(b"C", code, index, payload, now() - t0)
        exit_(0)

    return harness
