"""Supervision: the worker's (trusted) side of one running child.

What it does: :func:`_supervise` reads the child's frames until every call reported, the child died
or a deadline passed, enforcing the limits from outside with a wall clock and validating every frame
(token, kind, strictly increasing call index; per call its status code and size; the program's
result-byte cap); :func:`_exit_reason` says why a child stopped reporting, from its wait status (a
cgroup OOM kill is the program's memory), and with :func:`_judge_call_deaths` notes a death by a signal
that may have come from outside the sandbox, for the parent to run the job again (the rule:
"Killed from outside" in ``sandbox/executor.py``).

What it does not do: decode values (the trusted parent does, ``sandbox/decoding.py``), or kill and
reap the child (the zygote does, ``sandbox/zygote.py``). The threat model is in ``sandbox/executor.py``.
"""

from __future__ import annotations

import hmac
import os
import select
import signal
import time

from sandbox import cgroups as _cgroups
from sandbox import limits as _limits
from sandbox.harness import _ERROR_CHARS, _FRAME, _HDR, _TOKEN_BYTES, STATUS_CODES, _too_large

_SETUP_S = 10.0  # generous: a child that cannot even start on a loaded machine is an infra failure
_COALESCE_MS = 1  # see _supervise: how long the worker lets small frames gather before reading them
_COALESCE_BYTES = 4096
_HEAD_BYTES = _TOKEN_BYTES + _FRAME.size  # a frame's body starts with the token and the frame header
_OUTSIDE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
"""Signals an operator, a shutdown or the host's OOM killer sends (as a program may itself); a death by
any other signal (a fault the process raised by what it ran: SIGSEGV, SIGABRT, SIGFPE, SIGBUS, SIGSYS,
SIGXCPU, ...) is the program's own."""
_OVERSIZED = -1  # status code of a call whose frame passed the size cap (a frame's own code is 0..255)


class _Progress:
    """Worker-side view of one child: the frames accepted so far."""

    def __init__(self, start: int, used: int) -> None:
        self.used = used  # encoded result bytes of the program so far (earlier children included)
        self.ready = self.defined = False  # "set-up done" / "program defined" frames seen
        self.expect = start  # next call index
        self.t_last = time.monotonic()  # arrival of the last accepted frame (our clock)
        self.results: dict[int, tuple] = {}
        self.buf = bytearray()
        self.skip = 0  # bytes of an oversized frame still to drop (its call already failed)

    def mark(self) -> tuple:
        return (self.ready, self.defined, self.expect)


def _supervise(
    pidfd: int,
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
    """Read frames until every call reported, the child died (its exit seen on ``pidfd``, which the caller
    closes), or a deadline passed.

    Returns ``(results, end, detail)``; ``end`` in done / program_error / violation / call_timeout /
    program_cap / infra, or died with ``detail = (still_alive, ready, defined)`` (the reason needs
    the wait status, known once the zygote reaped the child).

    Small frames coming fast are taken together: first, and after a wake-up that brought fewer than
    :data:`_COALESCE_BYTES` before the program was defined or within :data:`_COALESCE_MS` of the
    previous ones, the wait is on the child's exit only, for at most :data:`_COALESCE_MS` (never past a
    deadline), then whatever arrived is read
    at once. Why: every frame woke the worker (a context switch, often a cross-CPU wake-up, and a pass
    of this loop), three per trivial program and one per call; a frame's arrival time is then known to
    within that window, which no time limit (seconds) can notice. A window that brings nothing ends the
    coalescing, so slow calls cost one wake-up per frame, as without it.
    """
    st = _Progress(start, used)
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
                # checked; more than a window's worth turns coalescing off; the rest is read frame by frame)
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
            # previous ones (so slow calls cost one wake-up per frame, as without coalescing)
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


def _accept_frames(st: _Progress, token: bytes, n: int, lim: _limits.ExecLimits) -> tuple[str, object] | None:
    """Consume complete frames from ``st.buf``; returns ``(end, detail)`` when the child is finished.

    Per call: an authenticated call frame in order whose status code or size is out of range fails that
    call alone (an oversized frame's rest is dropped as it arrives, :attr:`_Progress.skip`). Per program
    (``violation``): a frame without the run token, of an unknown kind or out of order, or too short to
    hold its header; only the program's own process can write those (a call's process has no channel).
    """
    arrival, cap = time.monotonic(), lim.max_value_bytes + 4096
    while True:
        if st.skip:
            dropped = min(st.skip, len(st.buf))
            del st.buf[:dropped]
            st.skip -= dropped
        if st.skip or len(st.buf) < 4:
            return None
        size = _HDR.unpack_from(st.buf)[0]
        if size < _HEAD_BYTES:
            return "violation", f"bad frame size {size}"
        if len(st.buf) < 4 + (_HEAD_BYTES if size > cap else size):
            return None
        if not hmac.compare_digest(bytes(st.buf[4 : 4 + _TOKEN_BYTES]), token):
            return "violation", "frame without the run token"
        kind, code, index, child_s = _FRAME.unpack_from(st.buf, 4 + _TOKEN_BYTES)
        if size > cap:  # its call fails; the rest of the frame is dropped as it arrives
            if kind != b"C":
                return "violation", f"bad frame size {size}"
            code, st.skip = _OVERSIZED, 4 + size
            payload = b"SandboxViolation: result frame of %d bytes" % size
        else:
            payload = bytes(st.buf[4 + _HEAD_BYTES : 4 + size])
            del st.buf[: 4 + size]
        if kind == b"S" and not st.ready:
            st.ready, st.t_last = True, arrival
        elif kind == b"R" and st.ready and not st.defined:
            st.defined, st.t_last = True, arrival
        elif kind == b"P" and st.ready and not st.defined:
            return "program_error", payload.decode("utf-8", "replace")
        elif kind == b"C" and st.defined and index == st.expect:
            st.results[index] = _call_result(code, payload, arrival - st.t_last, child_s, lim, st.used)
            st.used += len(st.results[index][1])
            st.t_last, st.expect = arrival, st.expect + 1
            if st.expect == n:
                return "done", None
        else:
            return "violation", f"unexpected frame {kind!r} index {index} (expected {st.expect})"


def _call_result(
    code: int, payload: bytes, dur_s: float, child_s: float, lim: _limits.ExecLimits, used: int
) -> tuple:
    """One reported call. The harness judged its own time-out and result budget; our clock (``dur_s``)
    and byte count (``used``) are the backstop: a result arriving after our hard limit, or passing the
    program's result cap, is never ``ok``."""
    if code == _OVERSIZED:  # (the harness never sends an out-of-range value: a forged frame fails its call)
        code = 1
    elif code >= len(STATUS_CODES):
        code, payload = 1, b"SandboxViolation: status code %d out of range" % code
    elif code == 0 and len(payload) > lim.max_value_bytes:
        code, payload = 1, b"SandboxViolation: a result of %d bytes" % len(payload)
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


def _exit_reason(status: int, alive: bool, ready: bool, defined: bool, ctx: dict) -> tuple[str, object]:
    """Why a child stopped reporting, from its wait status (``alive``: it had not exited by itself).

    A death by a signal that someone outside the sandbox may have sent, with no sign that the program
    did, is also noted in ``ctx["killed"]`` (:func:`_killed_from_outside`); the verdict returned is the
    one the program gets if every attempt of its job dies so.
    """
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
        if ready and sig in _OUTSIDE_SIGNALS:
            _killed_from_outside(f"the program's process died of {what}", ctx)
    elif os.WIFEXITED(status):
        what = f"code {os.WEXITSTATUS(status)}"
    else:
        what = "unknown status"
    if not ready:  # died before the harness ran any untrusted code: our machinery failed
        return "infra", f"sandbox child failed during set-up ({what})"
    if not defined:
        return "program_error", f"ProgramExited: program exited during definition ({what})"
    return "exited", f"ChildExited: child exited before reporting this call ({what})"


def _judge_call_deaths(got: dict[int, tuple], ctx: dict) -> None:
    """Isolated calls whose process died of a signal (``CallKilled``, reported by the harness, which
    never reports its own kill so): a SIGKILL the worker cgroup's OOM killer counted is the call's
    ``memory``; one of :data:`_OUTSIDE_SIGNALS` otherwise is noted as in :func:`_exit_reason`."""
    for index, item in got.items():
        if item[0] != "error" or not item[2].startswith("CallKilled: signal "):
            continue
        sig = item[2][len("CallKilled: signal ") :]
        if sig == "9" and _oom_killed(ctx):
            got[index] = (
                "memory",
                b"",
                "MemoryError: the call's processes exceeded the memory limit",
                item[3],
            )
        elif sig.isdigit() and int(sig) in _OUTSIDE_SIGNALS:
            _killed_from_outside(f"call {index}'s process died of signal {sig}", ctx)


def _killed_from_outside(what: str, ctx: dict) -> None:
    """Note in ``ctx["killed"]`` (first death of the job only) ``(why, host_oom)``: the program's job is
    to run again (``ProcessExecutor``), as when a worker dies. ``host_oom``: the kernel counted an OOM
    kill since the worker last looked (``/proc/vmstat``) and the worker's cgroup did not (the one kill
    from outside the sandbox the kernel counts; an OOM kill in the program's own cgroup never makes it
    one)."""
    if ctx.get("killed"):
        return
    _oom_killed(ctx)  # (a new kill in the worker's cgroup moves the baseline past every kill so far)
    kills, seen = _host_oom_kills(), ctx.get("host_oom_seen")
    ctx["host_oom_seen"] = kills
    host_oom = seen is not None and kills > seen
    ctx["killed"] = (f"{what}{' (the host OOM killer)' if host_oom else ''}", host_oom)


def _host_oom_kills() -> int:
    """The kernel's count of OOM kills since boot, every cgroup's included (0 when unreadable)."""
    try:
        with open("/proc/vmstat", "rb") as fh:
            for line in fh:
                if line.startswith(b"oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _oom_killed(ctx: dict) -> bool:
    """Whether the worker's cgroup counted a new OOM kill (read only after a SIGKILL death)."""
    kills = _cgroups.oom_kills(ctx["cgroup_dirs"])
    new, ctx["oom_seen"] = kills > ctx["oom_seen"], kills
    if new:  # (the kernel's count includes it: not the host's OOM killer)
        ctx["host_oom_seen"] = _host_oom_kills()
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
