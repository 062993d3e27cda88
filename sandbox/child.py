"""The sandbox worker (trusted) and the harness it forks for each program (runs UNTRUSTED code).

What it does: :func:`worker_main` is the entry point of one warm worker process started by
``ProcessExecutor`` (a fresh interpreter, never a fork of the caller). The worker isolates itself once
(``limits.setup_worker_isolation``), pre-imports common modules, then for each program forks a child
that applies rlimits, drops to the worker's dedicated uid and runs :func:`_harness`: define the
program, evaluate each call expression under a per-call ``setitimer``, encode each result with
``codea1_core.values`` and send one authenticated frame per call over a private pipe. The worker
(:func:`_supervise`) enforces the same limits from outside with a wall clock, validates every frame
(token, kind, strictly increasing call index), kills the child and its descendants, and restarts
a child after a hard per-call time-out so one slow call fails only itself (D3).

What it does not do: compare values (the trusted parent does, D2), or decode untrusted values.
The threat model is in ``sandbox/executor.py``. Not meant to be run by hand.
"""

from __future__ import annotations

import fcntl
import gc
import hmac
import io
import marshal
import os
import secrets
import select
import shutil
import signal
import struct
import sys
import time

from codea1_core import values
from sandbox import limits as _limits

STATUS_CODES = ("ok", "error", "timeout", "memory", "unsupported_output")
_HDR = struct.Struct(">I")
_FRAME = struct.Struct(">cBid")  # kind, status code, call index, child-measured seconds (after the token)
_TOKEN_BYTES = 16
_ERROR_CHARS = 1000
_SETUP_S = 10.0  # generous: a child that cannot even start on a loaded machine is an infra failure
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
    try:
        isolation = _limits.setup_worker_isolation(
            settings["mode"],
            settings["hide_paths"],
            settings["keep_paths"],
            settings["limits"]["max_file_mb"],
        )
        _limits.prctl(_limits.PR_SET_CHILD_SUBREAPER, 1)  # orphans of a program become our children
    except OSError as exc:
        write_msg(wfd, ("fail", f"isolation unavailable: {exc}"))
        return
    uid = settings["uid"]
    isolation["uid"] = uid if uid is not None else "not dropped"
    for name in _PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    lim = _limits.ExecLimits(**settings["limits"])
    gc.collect()
    gc.freeze()  # fewer copy-on-write page faults in forked children
    write_msg(wfd, ("hello", isolation))
    ctx = {"lim": lim, "uid": uid, "devnull": devnull, "private_tmp": isolation["private_tmp"], "n": 0}
    while True:
        msg = read_msg(rfd)
        if msg is None or msg[0] == "exit":
            return
        _, job_id, source, exprs = msg
        try:
            calls, output = run_program(source, exprs, ctx)
        except Exception as exc:  # our machinery failed (fork, mkdir, ...): the parent retries
            write_msg(wfd, ("infra", job_id, f"{type(exc).__name__}: {exc}"))
            continue
        write_msg(wfd, ("result", job_id, calls, output))


def oneshot_main(root: str) -> None:
    """Docker backend entry point: run ``<root>/job.marshal`` and write ``<root>/out/result.marshal``.

    The job file holds ``(settings, source, exprs)``; the container provides network/filesystem
    isolation, so namespaces are not set up here, but rlimits and the uid drop still apply.
    """
    with open(os.path.join(root, "job.marshal"), "rb") as fh:
        settings, source, exprs = marshal.load(fh)
    lim = _limits.ExecLimits(**settings["limits"])
    devnull = os.open(os.devnull, os.O_RDWR)
    ctx = {"lim": lim, "uid": settings["uid"], "devnull": devnull, "private_tmp": False, "n": 0}
    try:
        result: tuple = ("result", 0, *run_program(source, exprs, ctx))
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
    start = 0
    while start < n:
        got, end, detail = _run_child(source, exprs, start, deadline, ctx, output)
        for index, item in got.items():
            calls[index] = item
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
                else:
                    calls[i] = ("error", b"", detail, 0.0)
        break
    return calls, bytes(output)  # type: ignore[return-value]


def _run_child(
    source: str, exprs: list[str], start: int, deadline: float, ctx: dict, output: bytearray
) -> tuple[dict, str, object]:
    lim: _limits.ExecLimits = ctx["lim"]
    uid = ctx["uid"]
    ctx["n"] += 1
    tmp = f"/tmp/codea1-run-{os.getpid()}-{ctx['n']}"
    os.mkdir(tmp, 0o700)
    if uid is not None:
        os.chown(tmp, uid, uid)
    token = secrets.token_bytes(_TOKEN_BYTES)
    chan_r, chan_w = os.pipe()
    out_r, out_w = os.pipe()
    cpu_s = max(deadline - time.monotonic(), 0.0) + 1.0
    pid = os.fork()
    if pid == 0:  # ---- child: never returns
        try:
            os.close(chan_r)
            os.close(out_r)
            chan = _enter_child(lim, cpu_s, uid, ctx["devnull"], out_w, chan_w, tmp)
            _harness(source, exprs, start, chan, token, lim)
        except BaseException:
            pass
        os._exit(71)
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass
    os.close(chan_w)
    os.close(out_w)
    try:
        return _supervise(pid, chan_r, out_r, token, len(exprs), start, deadline, lim, output)
    finally:
        _reap(pid, uid)
        os.close(chan_r)
        os.close(out_r)
        _clean_tmp(tmp, ctx["private_tmp"])


def _enter_child(
    lim: _limits.ExecLimits, cpu_s: float, uid: int | None, devnull: int, out_w: int, chan_w: int, tmp: str
) -> int:
    os.setpgid(0, 0)
    os.dup2(devnull, 0)
    os.dup2(out_w, 1)
    os.dup2(out_w, 2)
    chan = _hide_fd(chan_w)  # before RLIMIT_NOFILE: the high descriptor must stay above it
    # Unbuffered text streams: output reaches the pipe even when the child is killed.
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), "utf-8", "backslashreplace", write_through=True
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), "utf-8", "backslashreplace", write_through=True
    )
    os.chdir(tmp)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM, signal.SIGCHLD):  # SIGPIPE stays ignored
        signal.signal(sig, signal.SIG_DFL)
    _limits.apply_child_limits(lim, cpu_s, uid)
    os.environ.clear()
    os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8"})
    return chan


def _hide_fd(fd: int) -> int:
    """Move the result channel to a random high descriptor and close every other descriptor above 2."""
    high = 1024 + secrets.randbelow(8192)
    chan = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, high)
    os.close(fd)
    os.closerange(3, chan)
    os.closerange(chan + 1, 1 << 16)
    return chan


def _reap(pid: int, uid: int | None) -> None:
    for target in (-pid, pid):
        try:
            os.kill(target, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    # We are a child subreaper: any descendant still alive is (or will become) our child.
    for _ in range(100):
        try:
            wpid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if wpid == 0:
            if uid is not None:
                _limits.sweep_uid(uid)
            else:
                _kill_children()
            time.sleep(0.001)


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


def _clean_tmp(tmp: str, private_tmp: bool) -> None:
    shutil.rmtree(tmp, ignore_errors=True)
    if not private_tmp:
        return
    for root in _limits.PRIVATE_TMP_DIRS:  # our private tmpfs: leave nothing for the next program
        try:
            entries = list(os.scandir(root))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                pass


# --------------------------------------------------------------------------------------------------
# Supervision (worker side, trusted)
# --------------------------------------------------------------------------------------------------


class _Progress:
    """Worker-side view of one child: the frames accepted so far."""

    def __init__(self, start: int) -> None:
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
    deadline: float,
    lim: _limits.ExecLimits,
    output: bytearray,
) -> tuple[dict, str, object]:
    """Read frames until every call reported, the child died, or a deadline passed.

    Returns ``(results, end, detail)``; ``end`` in done / program_error / violation / call_timeout /
    program_cap / exited / infra.
    """
    st = _Progress(start)
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    for fd in (chan_r, out_r, pidfd):
        poller.register(fd, select.POLLIN)
    try:
        while True:
            limit_s = (
                lim.call_timeout_s if st.defined else lim.effective_define_timeout_s if st.ready else _SETUP_S
            )
            hard = st.t_last + limit_s + 0.25 + 0.1 * limit_s
            until = min(hard, deadline)
            before, exited = st.mark(), False
            for fd, _ev in poller.poll(max(0, int((until - time.monotonic()) * 1000) + 1)):
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
            late = time.monotonic() >= until
            if exited or late:  # before judging, take whatever is already in the pipe
                st.buf += _read_available(chan_r)
            end = _accept_frames(st, token, n, lim)
            if end is not None:
                return st.results, *end
            if exited:
                return st.results, *_exit_reason(pid, pidfd, st.ready, st.defined)
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
            st.results[index] = _call_result(code, payload, arrival - st.t_last, child_s, lim)
            st.t_last, st.expect = arrival, st.expect + 1
            if st.expect == n:
                return "done", None
        else:
            return "violation", f"unexpected frame {kind!r} index {index} (expected {st.expect})"
    return None


def _call_result(code: int, payload: bytes, dur_s: float, child_s: float, lim: _limits.ExecLimits) -> tuple:
    """One reported call. The harness judged its own time-out; our clock (``dur_s``) is the backstop:
    a result arriving after our hard limit is never ``ok``."""
    status = STATUS_CODES[code]
    if status == "ok" and dur_s > lim.call_timeout_s * 1.1 + 0.25:  # past our hard limit: never "ok"
        return ("timeout", b"", f"Timeout: call exceeded {lim.call_timeout_s} s", dur_s)
    # Frames read in one batch share an arrival time; the child's measurement is finer when plausible.
    shown_s = child_s if 0.0 <= child_s <= dur_s + 0.01 or dur_s == 0.0 else dur_s
    shown_s = min(max(shown_s, 0.0), lim.call_timeout_s + 0.1)
    if status == "ok":
        return ("ok", payload, "", shown_s)
    return (status, b"", payload.decode("utf-8", "replace")[:_ERROR_CHARS], shown_s)


def _exit_reason(pid: int, pidfd: int, ready: bool, defined: bool) -> tuple[str, object]:
    select.select([pidfd], [], [], 0.2)  # the channel may close just before the exit is visible
    try:
        wpid, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        wpid, status = -1, 0
    if wpid == 0:
        what = "closed its result channel"
    elif os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        what = f"signal {signal.Signals(sig).name}" if sig in signal.valid_signals() else f"signal {sig}"
        if sig == signal.SIGXCPU:
            return "program_cap", ""
    elif os.WIFEXITED(status):
        what = f"code {os.WEXITSTATUS(status)}"
    else:
        what = "unknown status"
    if not ready:  # died before the harness ran any untrusted code: our machinery failed
        return "infra", f"sandbox child failed during set-up ({what})"
    if not defined:
        return "program_error", f"ProgramExited: program exited during definition ({what})"
    return "exited", f"ChildExited: child exited before reporting this call ({what})"


def _drain_output(fd: int, output: bytearray, cap: int, poller: select.poll | None) -> None:
    try:
        data = os.read(fd, 1 << 16) if poller is not None else _read_available(fd)
    except OSError:
        data = b""
    if not data and poller is not None:
        poller.unregister(fd)
    room = cap - len(output)
    if room > 0:
        output += data[:room]


def _read_available(fd: int) -> bytes:
    os.set_blocking(fd, False)
    chunks = []
    try:
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
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


def _harness(
    source: str, exprs: list[str], start: int, chan: int, token: bytes, lim: _limits.ExecLimits
) -> None:
    # Everything the harness needs is bound to locals before untrusted code runs, so patching builtins,
    # modules or sys.modules afterwards cannot change what is sent (see the threat model).
    write, pack_hdr, pack_frame, exit_ = os.write, _HDR.pack, _FRAME.pack, os._exit
    encode, unsupported = values.encode, values.UnsupportedValue
    setitimer, real, now, sig, alarm = (
        signal.setitimer,
        signal.ITIMER_REAL,
        time.monotonic,
        signal.signal,
        signal.SIGALRM,
    )
    compile_, eval_, exec_, len_, range_, view_ = compile, eval, exec, len, range, memoryview
    type_, str_, base_exc, error_chars = type, str, BaseException, _ERROR_CHARS
    timeout_exc, memory_exc, on_alarm = _CallTimeout, MemoryError, _on_alarm
    call_s, define_s, max_bytes = lim.call_timeout_s, lim.effective_define_timeout_s, lim.max_value_bytes

    def send(kind: bytes, code: int, index: int, payload: bytes, seconds: float = 0.0) -> None:
        body = token + pack_frame(kind, code, index, seconds) + payload
        view = view_(pack_hdr(len_(body)) + body)
        while view:
            view = view[write(chan, view) :]

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

    for name in [m for m in sys.modules if m.split(".")[0] in ("sandbox", "codea1_core")]:
        del sys.modules[name]
    namespace: dict = {"__name__": "program", "__builtins__": __builtins__}
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
        except timeout_exc:
            code, payload = 2, f"Timeout: call exceeded {call_s} s".encode()
        except memory_exc:
            code, payload = 3, b"MemoryError: memory limit reached"
        except unsupported as exc:
            code, payload = 4, f"UnsupportedValue: {exc.args[0] if exc.args else ''}".encode()
        except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt included: a failed call
            code, payload = 1, describe(exc).encode("utf-8", "replace")
        send(b"C", code, index, payload, now() - t0)
    exit_(0)
