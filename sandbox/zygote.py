"""The zygote and each child's set-up (trusted), up to the moment the harness runs the program.

What it does: :class:`Zygote` is forked by the worker before its first job; it forks each child ahead
of time (:func:`_prepare_child`, :func:`_zygote_loop`), puts it in its own process group and the worker's
cgroup, and after the program kills and reaps it with every descendant (:func:`_reap`) and replaces the
private tmpfs it used (:func:`_clean_tmp`). Before its first child it pins the pages a child and the
zygote write for a trivial program (:func:`_pin_child_pages`, ``sandbox/pinning.py``), so that each fork
copies them instead of both processes faulting on them. Each child (:func:`_make_child_main`) waits for
its job on its own pipe, confines itself (rlimits, uid drop: ``sandbox/confinement.py``) and calls the
harness (``sandbox/harness.py``).

What it does not do: read results (the worker does, ``sandbox/supervision.py``). Not meant to be run by
hand; the threat model is in ``sandbox/executor.py``.
"""

from __future__ import annotations

import _random
import fcntl
import gc
import io
import marshal
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable

from sandbox import confinement as _confinement
from sandbox import credentials as _credentials
from sandbox import linux as _linux
from sandbox import mounts as _mounts
from sandbox import namespaces as _namespaces
from sandbox import pinning as _pinning
from sandbox.harness import _FRAME, _HDR, _TOKEN_BYTES, _make_harness


def _reseed_random() -> None:
    """Fresh OS entropy for ``random``'s shared generator, as its at-fork handler would give; the
    zygote calls it just before each fork, so every child starts from its own seed (the gauss cache
    is already empty: no trusted code draws from the generator)."""
    module = sys.modules.get("random")
    if module is not None:
        _random.Random.seed(module._inst)


_Q = struct.Struct(">q")
_FDS = struct.Struct("4i")  # four descriptors as SCM_RIGHTS data (what socket.send_fds builds, less work)
_SOL_SOCKET, _SCM_RIGHTS = socket.SOL_SOCKET, socket.SCM_RIGHTS
_QQ = struct.Struct(">qq")
_FD = struct.Struct("i")
_FDS_SPACE = socket.CMSG_LEN(_FDS.size)


def _recv_fds(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One message and the descriptors that came with it (as ``socket.recv_fds(sock, 4096, 4)``, whose
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
    of time (after cleaning up the previous one), puts it in its group and the worker's cgroup, and
    hands the worker, in one message, the child's temp dir, the worker's ends of its three pipes (job
    in, result channel, output), which the child closes first thing, and a pidfd of the child; the
    child waits for its job on its own pipe. So the fork is off the worker's critical path and one
    round trip per program remains: ``reap``. The zygote is a subreaper: it reaps each child and any
    descendant left, and replaces the private tmpfs, before it forks the next child.
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
                _linux.prctl(_linux.PR_SET_PDEATHSIG, signal.SIGKILL)
                # (the init of the worker's PID namespace sees its parent, outside it, as pid 0)
                if os.getppid() == (0 if ctx["pidns"] else worker):
                    _linux.prctl(_linux.PR_SET_CHILD_SUBREAPER, 1)
                    _prepare_zygote(ctx)
                    gc.collect()
                    gc.freeze()  # fewer copy-on-write page faults in forked children
                    _pin_child_pages(ctx, theirs.fileno())
                    # last: no-new-privs is set, and the filter denies the pinning's calls
                    if ctx["seccomp_zygote"] is not None and ctx["seccomp_zygote"]() != 0:
                        raise OSError("the zygote could not load its syscall filter")
                    _zygote_loop(theirs, ctx)
                else:
                    os.write(2, b"sandbox zygote: its parent exited before it started\n")
            except (
                BaseException
            ) as exc:  # the reason on stderr: the worker's log, shown when it reports us gone
                code = 70
                try:
                    os.write(
                        2, f"sandbox zygote failed: {type(exc).__name__}: {exc}\n".encode(errors="replace")
                    )
                except BaseException:
                    pass
            os._exit(code)
        theirs.close()
        self.pid = pid

    def take(self) -> tuple[int, str, int, int, int]:
        """The next child, waiting for its job: ``(pidfd, tmp, job_w, chan_r, out_r)``, all descriptors
        the caller closes. A pidfd, not a pid: the zygote's pids are those of the worker's PID namespace,
        and the worker needs the child only to see its exit (the zygote kills and reaps it)."""
        msg, fds = _recv_fds(self.sock)
        if msg[:1] == b"C" and len(fds) == 4:
            return fds[3], msg[1:].decode(), *fds[:3]
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
            for _ in range(2):  # the offer, then our "Q" back
                msg, fds, _flags, _addr = socket.recv_fds(self.sock, 4096, 4)
                for fd in fds:
                    os.close(fd)
                if msg in (b"Q", b""):
                    break
        except OSError:
            pass
        self.sock.close()

    def reap(self) -> int:
        """Kill the child last taken with its descendants, wait for it, clean up; returns its wait status."""
        self.sock.send(b"R")
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
    (``confinement.apply_zygote_limits``); default SIGINT/SIGTERM/SIGALRM/SIGCHLD (SIGPIPE stays ignored);
    unbuffered text streams on descriptors 1 and 2 (each child dup2s its output pipe onto them, so
    output reaches the pipe even when the child is killed); the scrubbed environment (HOME and TMPDIR
    are set by :func:`_zygote_loop`); the trusted modules dropped from ``sys.modules``.
    """
    if ctx["pidns"]:  # our own /proc: a program sees only us and its own processes
        _namespaces.mount_own_proc()
    _confinement.apply_zygote_limits()
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
    # module in each child would write pages, each a copy-on-write fault); this reference keeps each module
    # alive (the zygote's own code still runs from them; it imports nothing after this).
    ctx["trusted_modules"] = {
        m: v for m, v in sys.modules.items() if m.split(".")[0] in ("sandbox", "codea1_core")
    }
    for name in ctx["trusted_modules"]:
        del sys.modules[name]
    lim, uid = ctx["lim"], ctx["uid"]
    call_uid = _credentials.call_uid(uid) if uid is not None and lim.isolate_calls else None
    ctx["call_uid"] = call_uid
    ctx["harness"] = _make_harness(
        lim,
        _confinement.call_confiner(call_uid, lim.max_processes, ctx["scope_join"]),
        _credentials.call_sweeper(call_uid) if call_uid is not None else None,
    )
    ctx["rlimits"] = _confinement.child_rlimits(lim, uid is not None)
    ctx["child_main"] = _make_child_main(ctx)
    ctx["tmp_prefix"] = f"/tmp/codea1-run-{os.getpid()}-"
    ctx["environ_store"] = os.environ._data  # bytes -> bytes on POSIX; see _prepare_child
    ctx["tmp_stamps"] = {}
    if ctx["private_tmp"]:  # every child's temp dir is one fixed dir of the private /tmp (_prepare_child)
        ctx["home"] = os.path.join(ctx["private_tmp"][0], "codea1-run")
        os.environ["HOME"] = os.environ["TMPDIR"] = ctx["home"]
        _clean_tmp("", ctx)
    if (ctx["pidns"] or ctx["private_tmp"]) and ctx["landlock_fd"] >= 0:
        ctx["landlock_refresh"]()  # its rules name the /proc and tmpfs replaced here


_PROBE_JOB = ("def f(x):\n    return x + 1\n", ["f(1)"])
_PIPE_PAGE, _F_SETPIPE_SZ, _FIONREAD = 4096, 1031, 0x541B


def _pin_child_pages(ctx: dict, sock_fd: int, probes: int = 2) -> None:
    """Pin (``sandbox/pinning.py``) the pages a child and the zygote write for a trivial program, so each
    later fork copies them and neither process faults on them; sets ``ctx["pinned"]`` (the ring's
    descriptor, -1 when nothing is pinned) and ``ctx["pinned_pages"]``.

    Which pages: those every one of ``probes`` probe children (:func:`_probe_pages`) and the zygote
    wrote; a page written by one probe alone (the zygote's own bookkeeping of that probe) would cost
    every later fork a copy that no child uses. Any failure leaves nothing pinned (children fault as
    before). Skipped where ``ctx["pin_pages"]`` is False (the Docker backend's zygote forks one child).
    """
    ctx["pinned"], ctx["pinned_pages"] = -1, 0
    if not ctx.get("pin_pages", True):
        return
    runs = _probe_pages(ctx, sock_fd)
    for _ in range(probes - 1):
        runs = _pinning.common_runs(runs, _probe_pages(ctx, sock_fd))
    if runs:
        try:
            ctx["pinned"] = _pinning.pin(runs)
            ctx["pinned_pages"] = sum(length for _, length in runs) // _pinning.PAGE
        except OSError:
            pass


def _probe_pages(ctx: dict, sock_fd: int) -> list[tuple[int, int]]:
    """The pages (``(address, bytes)`` runs) that a probe child and this zygote write for a trivial
    program; empty when the probe could not be run.

    How: the probe, forked and set up like every child (its own group, ``child_main``: confinement,
    harness), runs a trivial trusted program. Its result channel holds one page, filled so that its
    frames fit up to the call's own, whose write blocks: the probe then waits, at the end of its
    program, with every page it wrote its own. The pages this zygote maps alone at that moment are
    those the probe or the zygote wrote since the fork; then the probe is killed and reaped and its
    temp dir cleaned.
    """
    try:
        tmp, job_r, job_w, chan_r, chan_w, out_r, out_w, null = _prepare_child(ctx)
    except OSError:
        return []
    pid, runs = -1, []
    try:
        lim, token = ctx["lim"], os.urandom(_TOKEN_BYTES)
        body = marshal.dumps((*_PROBE_JOB, 0, token, lim.max_result_bytes, 5.0))
        os.write(job_w, _Q.pack(len(body)) + body)
        fcntl.fcntl(chan_w, _F_SETPIPE_SZ, _PIPE_PAGE)
        os.write(chan_w, bytes(_PIPE_PAGE - 2 * (_HDR.size + _TOKEN_BYTES + _FRAME.size)))  # room: S, R
        pid = os.fork()
        if pid == 0:
            ctx["child_main"](sock_fd, job_r, chan_w, out_w, null, tmp, job_w, chan_r, out_r)
        os.setpgid(pid, pid)
        if _probe_blocked(pid, chan_r):
            runs = _pinning.written_pages()
    except OSError:
        pass
    finally:
        if pid > 0:
            _reap(pid, (ctx["uid"], ctx["call_uid"]), ctx["pidns"])
        for fd in (job_r, job_w, chan_r, chan_w, out_r, out_w, null):
            os.close(fd)
    _clean_tmp(tmp, ctx)  # (raises as in the loop: the worker then sees the zygote gone)
    return runs


def _probe_blocked(pid: int, chan_r: int, timeout_s: float = 5.0) -> bool:
    """Wait until the probe child has filled its one-page channel and sleeps (in the write of its
    call's frame: nothing else after its set-up sleeps); False if it exits or the time runs out."""
    count = bytearray(4)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
        if state in (b"Z", b"X"):
            return False
        fcntl.ioctl(chan_r, _FIONREAD, count)
        if state == b"S" and int.from_bytes(count, sys.byteorder) == _PIPE_PAGE:
            return True
        time.sleep(0.0005)
    return False


def _zygote_loop(sock: socket.socket, ctx: dict) -> None:
    """Offer a child, then serve reap requests (each followed by the next offer); exits with the worker.

    One flat loop with every name bound to a local first. Why: each fork write-protects every page of the
    zygote, so each page its loop then writes (the reference count of a global looked up, the frame of a
    helper called) is a page fault per program.
    """
    recv, send, sendmsg, close, fork = sock.recv, sock.send, sock.sendmsg, os.close, os.fork
    pack_q, pack_status, pack_fds = _Q.pack, _QQ.pack, _FDS.pack
    reap, clean, prepare, child_main = _reap, _clean_tmp, _prepare_child, ctx["child_main"]
    uid, sock_fd, sol_socket, scm_rights = ctx["uid"], sock.fileno(), _SOL_SOCKET, _SCM_RIGHTS
    pidfd_open, init = os.pidfd_open, ctx["pidns"]
    uids = (uid, ctx["call_uid"])
    setpgid, write, cgroup_fds = os.setpgid, os.write, tuple(ctx["cgroup_fds"])
    peak_fds = tuple(ctx["peak_fds"])
    tmp, reaping, offered = "", 0, -1
    while True:
        if reaping:  # the child the worker took ran its program: kill, reap, clean up
            status, err = reap(reaping, uids, init), 0
            for fd in peak_fds:  # the next program must not see this one's high-water mark (v1)
                try:
                    write(fd, b"0")
                except OSError:
                    pass
            try:
                clean(tmp, ctx)
            except OSError as exc:
                err = exc.errno or 5
            send(pack_status(status, err))
            if err:
                return  # the worker reports infra and is replaced
        try:
            tmp, job_r, job_w, chan_r, chan_w, out_r, out_w, null = prepare(ctx)
        except OSError as exc:
            send(b"E" + pack_q(exc.errno or 5))
            offered = -1
        else:
            try:
                offered = fork()
            except OSError as exc:
                offered = -(exc.errno or 11)
            if offered == 0:  # (it closes the worker's ends first: _make_child_main)
                child_main(sock_fd, job_r, chan_w, out_w, null, tmp, job_w, chan_r, out_r)
            close(job_r)
            close(chan_w)
            close(out_w)
            close(null)
            pidfd = -1
            if offered > 0:  # its own group (_reap kills the group with every descendant) and the
                try:  # worker's cgroup (memory.max, pids.max), both before the worker can send its job:
                    setpgid(offered, offered)  # done here, where these paths are warm, they cost the
                    for fd in cgroup_fds:  # child no page faults (it would fault doing them itself)
                        write(fd, b"%d" % offered)
                    pidfd = pidfd_open(offered)
                except OSError as exc:
                    reap(offered, uids, init)
                    clean(tmp, ctx)
                    offered = -(exc.errno or 5)
            try:
                if offered > 0:  # the worker's ends of the three pipes and a pidfd (the worker, outside
                    # our PID namespace, watches the child's exit on it), in one message
                    sendmsg(
                        [b"C" + tmp.encode()],
                        [(sol_socket, scm_rights, pack_fds(job_w, chan_r, out_r, pidfd))],
                    )
                else:
                    send(b"E" + pack_q(-offered))
            finally:
                close(job_w)
                close(chan_r)
                close(out_r)
                if pidfd >= 0:
                    close(pidfd)
        msg = recv(64)
        if msg == b"Q":  # the worker stops: drop the waiting child and its temp dir (a host dir when
            if offered > 0:  # there are no namespaces)
                reap(offered, uids, init)
            if not ctx["private_tmp"]:
                remove_tree(tmp)
            send(b"Q")
            return
        if msg != b"R" or offered <= 0:
            return
        reaping = offered  # (the child the worker took: the one we offered)


def _prepare_child(ctx: dict) -> tuple[str, int, int, int, int, int, int, int]:
    """The per-child steps that need no job, done in the zygote just before the fork: the child's temp
    dir as HOME and TMPDIR (with private tmpfs the private /tmp itself, as fresh as a new one, see
    :func:`_clean_tmp`; else a fresh path in the host's /tmp, owned by its uid and, group-writable,
    shared with its calls' uid), fresh entropy for ``random`` (as its
    at-fork handler would give), the three pipes, the child's result channel already moved to a random
    descriptor >= 1024 (it cannot be ``dup2``-ed over once RLIMIT_NOFILE is lower), and a fresh
    ``/dev/null`` for its stdin: no open file description of the child is shared with the zygote, so no
    flag a program sets on one (``O_NONBLOCK``, ``O_APPEND``) reaches the next.

    HOME and TMPDIR are written straight into ``os.environ``'s store and the C environment, as
    ``os.environ[...] = ...`` does without its encoder calls (fewer pages written after each fork).

    Returns ``(tmp, job_r, job_w, chan_r, chan_w, out_r, out_w, null)``; raises OSError (nothing left
    open).
    """
    if ctx["private_tmp"]:  # one fixed dir, made with each fresh /tmp: no inode number counts programs
        tmp = ctx["home"]  # (HOME and TMPDIR set once, by _prepare_zygote)
    else:
        ctx["n"] += 1
        tmp = ctx["tmp_prefix"] + str(ctx["n"])
        raw, store, putenv = tmp.encode(), ctx["environ_store"], os.putenv
        putenv(b"HOME", raw)
        putenv(b"TMPDIR", raw)
        store[b"HOME"] = store[b"TMPDIR"] = raw  # the rest of the environment: _prepare_zygote
        os.mkdir(tmp)
        os.chmod(tmp, 0o770)  # (whatever the umask)
        if ctx["uid"] is not None:
            os.chown(tmp, ctx["uid"], ctx["uid"])
    _reseed_random()
    fds: list[int] = []
    try:
        fds.append(os.open("/dev/null", os.O_RDWR))
        for _ in range(3):
            fds += os.pipe()
        # In [1024, 1280): above RLIMIT_NOFILE, and the descriptor table stays at 2,048 slots, which fork
        # copies and close_range walks in every child (a descriptor anywhere up to 9,215 would grow the
        # table to 16,384 slots, more for every program to copy and walk).
        high = 1024 + os.urandom(1)[0]
        chan_w = fcntl.fcntl(fds[4], fcntl.F_DUPFD_CLOEXEC, high)
        os.close(fds[4])
        fds[4] = chan_w
    except OSError:
        for fd in fds:
            os.close(fd)
        if not ctx["private_tmp"]:
            os.rmdir(tmp)
        raise
    return (tmp, *fds[1:], fds[0])  # type: ignore[return-value]


def _make_child_main(ctx: dict) -> Callable[..., None]:
    """Build, once in the zygote, what each forked child runs: ``child_main(sock_fd, job_r, chan, out_w,
    null, tmp, *worker_ends)`` closes the zygote's socket and the worker's ends of its pipes (so a worker
    gone means EOF on its job pipe, and no program holds them), sets its death signal (and enters an IPC
    namespace where needed), waits for the job, confines itself and runs the harness; it never returns.
    (Its process group and cgroup are set by the zygote
    before the worker learns its pid, so before any job can reach it.)

    Why a closure: every function, constant and setting it needs is bound here, so a child looks up no
    module global and no ``ctx`` key (each look-up writes the reference count of what it finds, and a
    written page is a copy-on-write fault, paid in CPU by every child). Whatever is the same for every child
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
        _linux.set_death_signal,
        _namespaces.enter_private_ipc if ctx["ipc"] else None,
        _read_job_rest,
        marshal.loads,
        memoryview,
        int.from_bytes,
    )
    harness = ctx["harness"]
    buffers = [bytearray(65536)]  # the job lands here: no allocation (a fresh bytes object costs page faults)
    buffer = view(buffers[0])
    confine = _confinement.child_confiner(ctx["rlimits"], ctx["uid"], ctx["call_uid"] is not None)
    # The deny-by-default layers, all prepared by the worker (sandbox/child.py, _deny_layers): a fresh
    # keyring, the Landlock ruleset, the seccomp allow-list.
    join_keyring, restrict, ruleset = ctx["join_keyring"], ctx["restrict"], ctx["landlock_fd"]
    seccomp = ctx["seccomp_load"]

    def child_main(
        sock_fd: int, job_r: int, chan: int, out_w: int, null: int, tmp: str, *worker_ends: int
    ) -> None:
        try:
            close(sock_fd)
            for fd in worker_ends:  # the worker's ends of our pipes: a worker gone means EOF on the job
                close(fd)
            death_signal()  # until the uid drop sets it again
            # (the zygote has put us in our own process group and in the worker's cgroup)
            if enter_ipc is not None and not enter_ipc():
                exit_(72)
            if join_keyring is not None and join_keyring() < 0:  # before the uid drop (sandbox/child.py)
                exit_(73)
            # The job, usually in one read into the preallocated buffer (see _read_job_rest for the rest):
            # reads of 1 MiB to EOF would cost an mmap + mremap + munmap per child.
            n = readv(job_r, buffers)
            if n >= 8 and n == 8 + size_of(buffer[:8], "big"):
                job = loads(buffer[8:n])
            else:
                job = read_rest(job_r, bytes(buffer[:n]))
            source, exprs, start, token, budget, cpu_s = job
            # Output on 1 and 2, no descriptor above 2 but the channel, in tmp, limited, unprivileged.
            dup2(null, 0)  # its own /dev/null (_prepare_child)
            dup2(out_w, 1)  # sys.stdout/sys.stderr (made by the zygote) write to descriptors 1 and 2
            dup2(out_w, 2)
            if ruleset >= 0 and restrict(446, ruleset, 0) != 0:  # landlock_restrict_self
                exit_(74)
            closerange(3, chan)  # the job pipe, the cgroup files, /dev/null, the output pipe's original
            closerange(chan + 1, 65536)
            chdir(tmp)
            confine(cpu_s)
            if seccomp is not None and seccomp() != 0:  # last: the allow-list denies what came before
                exit_(75)
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


def _reap(pid: int, uids: tuple[int | None, int | None], init: bool) -> int:
    """Kill ``pid`` with every descendant, wait for it, reap them all; returns its wait status.

    As the init of the worker's PID namespace (``init``) one ``kill(-1)`` reaches every process in it but
    us, whatever its uid, group or session: the program's whole tree, and nothing else lives there.
    Otherwise its process group and ``pid``, then every process of the worker's uids ``uids`` (its own
    and its calls'), or without a uid drop every child of ours.
    """
    if init:
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        try:
            status = os.waitpid(pid, 0)[1]
        except ChildProcessError:
            status = -1
        while True:  # each has its SIGKILL: none can fork again, each exits
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                return status
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
    uid, call_uid = uids
    for _ in range(100):
        try:
            wpid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if wpid == 0:
            if uid is not None:
                _credentials.sweep_uid(uid)
                if call_uid is not None:
                    _credentials.sweep_uid(call_uid, uid)
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

    With private tmpfs (namespaces on) each the program used is replaced by a fresh one, and none keeps
    a time or inode number the program set (``sandbox/mounts.py``, ``wipe_private_tmp``); otherwise the
    program's own temp dir is removed by an iterative walk (no recursion, so no tree shape can make it
    raise).

    Raises:
        OSError: a private tmpfs could not be replaced (the worker reports infra and is replaced).
    """
    if ctx["private_tmp"]:
        stamps, home, root = ctx["tmp_stamps"], ctx["home"], ctx["private_tmp"][0]
        try:
            used = os.stat(home).st_ctime_ns != stamps.get(home)
        except OSError:
            used = True
        if used:  # anything made or removed in the temp dir: its tmpfs is replaced too
            stamps.pop(root, None)
        replaced = _mounts.wipe_private_tmp(ctx["private_tmp"], ctx["lim"].max_file_mb, stamps)
        if used or replaced:
            _make_home(home, root, ctx["uid"], stamps)
        if replaced and ctx["landlock_fd"] >= 0:
            ctx["landlock_refresh"]()  # its rules name the tmpfs just replaced
    else:
        remove_tree(tmp)


def _make_home(home: str, root: str, uid: int | None, stamps: dict[str, int]) -> None:
    """The children's temp dir in the private /tmp (made again after the tmpfs was replaced): owned by the
    worker's uid, shared with its calls' uid through the group; its times and its tmpfs root's are set to
    0 and recorded (``sandbox/mounts.py``, ``wipe_private_tmp``)."""
    try:
        os.mkdir(home)
    except FileExistsError:
        pass
    os.chmod(home, 0o770)  # (whatever the umask)
    if uid is not None:
        os.chown(home, uid, uid)
    for path in (home, root):
        os.utime(path, ns=(0, 0))
        stamps[path] = os.stat(path).st_ctime_ns


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
