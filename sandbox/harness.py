"""The harness: what runs inside each forked child, after its confinement (runs UNTRUSTED code).

What it does: :func:`_make_harness` (built once in the zygote) returns ``harness(source, exprs, start,
chan, token, budget)``: define the program, evaluate each call expression under a per-call
``setitimer``, encode each result with ``codea1_core.values`` and send one authenticated frame per call
over the child's private pipe. The frame format (:data:`_HDR`, :data:`_FRAME`, the token) is defined
here and checked by the worker (``sandbox/supervision.py``).

What it does not do: confine the process (``sandbox/zygote.py`` does, before calling it), or judge its
own results (the worker re-checks every limit). The threat model is in ``sandbox/executor.py``.
"""

from __future__ import annotations

import _signal
import gc
import os
import select
import signal
import struct
import time
from collections.abc import Callable

from codea1_core import values
from sandbox import limits as _limits

STATUS_CODES = ("ok", "error", "timeout", "memory", "unsupported_output")
_HDR = struct.Struct(">I")
_FRAME = struct.Struct(">cBid")  # kind, status code, call index, child-measured seconds (after the token)
_TOKEN_BYTES = 16
_ERROR_CHARS = 1000
_RESULT = struct.Struct(">BdQ")  # one isolated call's outcome to its parent: code, seconds, payload size


def _too_large(cap: int) -> str:
    return f"UnsupportedValue: result too large (the program's results exceed {cap} bytes)"


class _CallTimeout(BaseException):
    pass


def _on_alarm(signum, frame):  # noqa: ARG001
    raise _CallTimeout


def _make_harness(
    lim: _limits.ExecLimits,
    confine_call: Callable[[], int] | None = None,
    sweep: Callable[[], None] | None = None,
) -> Callable[..., None]:
    """Build the harness once, in the zygote, with everything it needs bound as closure variables.

    ``confine_call`` (``sandbox/confinement.py``, ``call_confiner``) is run by each isolated call's
    process before the call: its own identity and signal scope; ``sweep`` (``sandbox/credentials.py``,
    ``call_sweeper``) by this process after a call whose process left others running.

    Bound before any untrusted code exists, so patching builtins, modules or ``sys.modules`` afterwards
    cannot change what is sent (see the threat model); and bound once, so a child writes (hence copies)
    only the pages of the objects its program's path actually uses (binding them in every child would
    write to each of them: a page fault apiece).
    """
    write, pack_hdr, pack_frame, exit_ = os.write, _HDR.pack, _FRAME.pack, os._exit
    encode, unsupported = values.encode, values.UnsupportedValue
    # _signal.signal, not signal.signal: the latter's Python wrapper converts the previous handler to a
    # Handlers enum member, and for our own handler that conversion fails and formats a ValueError (an
    # enum look-up, an exception and a repr in every child: page faults and their CPU).
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
    isolate, freeze = lim.isolate_calls, gc.freeze
    waitid, p_all, leftovers = os.waitid, os.P_ALL, os.WEXITED | os.WNOHANG | os.WNOWAIT
    child_error = ChildProcessError
    code_type, function_type = type(_on_alarm.__code__), type(_on_alarm)
    pipe_, fork_, close_, read_, kill_, waitpid_ = os.pipe, os.fork, os.close, os.read, os.kill, os.waitpid
    pidfd_open, poll_, pollin, set_blocking = os.pidfd_open, select.poll, select.POLLIN, os.set_blocking
    wifsignaled, wtermsig, wexitstatus, sigkill = (
        os.WIFSIGNALED,
        os.WTERMSIG,
        os.WEXITSTATUS,
        int(signal.SIGKILL),
    )
    blocking_exc, os_error = BlockingIOError, OSError
    pack_result, unpack_result, result_head = _RESULT.pack, _RESULT.unpack_from, _RESULT.size
    limit_bytes = max_bytes + 4096 + _RESULT.size
    n_codes, error_bytes = len(STATUS_CODES), 4 * _ERROR_CHARS  # (UTF-8: at most 4 bytes a character)

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

    def plain(expr: str, namespace: dict) -> object:
        """The compiled call if it only calls a function the program defined, on constants (``f(1, [2])``,
        ``f(g(3))``: one name, no attribute, no other name, no lambda or comprehension), else None. Such
        a call brings no code of its own: whatever it changes, the program's own code changed, as in a
        script (its memo, a mutable default); every other call runs in its own process."""
        try:
            code = compile_(expr, "<call>", "eval")
        except base_exc:  # noqa: BLE001 - reported by the call's own process
            return None
        names = code.co_names
        if len_(names) > 1:
            return None
        for const in code.co_consts:
            if type_(const) is code_type:
                return None
        if names:
            fn = namespace.get(names[0])
            if type_(fn) is not function_type or fn.__globals__ is not namespace:
                return None
        return code

    def evaluate(expr: object, namespace: dict) -> tuple[int, bytes, float]:
        """One call (its text or compiled code): ``(status code, payload, seconds)``; the payload is
        capped, not yet budgeted."""
        code, payload, t0 = 0, b"", now()
        try:
            try:
                sig(alarm, on_alarm)
                t0 = now()
                setitimer(real, call_s)
                if type_(expr) is str_:
                    expr = compile_(expr, "<call>", "eval")
                payload = encode(eval_(expr, namespace))
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
        except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt included
            code, payload = 1, describe(exc).encode("utf-8", "replace")
        return code, payload, now() - t0

    def received(got: bytearray, elapsed: float) -> tuple[int, bytes, float]:
        """A call's process's self-reported outcome, checked field by field before it is framed: a status
        code outside :data:`STATUS_CODES` or a result over ``max_value_bytes`` fails this call alone (with
        the reason), an error message is cut to its cap and an implausible duration replaced by ours, so
        nothing a call's process sends can make a frame the worker refuses (which voids every call)."""
        code, seconds, size = unpack_result(got)
        if code >= n_codes:
            return 1, f"SandboxViolation: the call's process reported status code {code}".encode(), elapsed
        if code == 0 and size > max_bytes:
            return 1, f"SandboxViolation: the call's process reported {size} result bytes".encode(), elapsed
        if not 0.0 <= seconds <= elapsed:  # (NaN included)
            seconds = elapsed
        return code, bytes(got[result_head : result_head + (size if code == 0 else error_bytes)]), seconds

    def evaluate_apart(expr: str, namespace: dict, chan: int) -> tuple[int, bytes, float]:
        """One call in its own forked copy of the defined program, so nothing it does (rebinding a
        name, patching a builtin or a module, state in the program's objects) reaches another call.
        The copy has no result channel (it cannot write frames), runs as the worker's call uid (it
        cannot signal, ``prlimit``, renice or re-pin this process, nor hold its process slots) in a
        Landlock domain of its own where the kernel scopes signals, and sends its outcome on a private
        pipe; this process frames it. What the call leaves running is killed before the next call."""
        r, w = pipe_()
        t0 = now()
        pid = fork_()
        if pid == 0:
            try:
                close_(r)
                close_(chan)
                if confine_call is not None and confine_call() != 0:
                    exit_(77)
                code, payload, seconds = evaluate(expr, namespace)
                view = view_(pack_result(code, seconds, len_(payload)) + payload)
                while view:
                    view = view[write(w, view) :]
            except base_exc:  # noqa: BLE001
                pass
            exit_(0)
        close_(w)
        got, exited = bytearray(), False
        try:
            pidfd = pidfd_open(pid)
            poller = poll_()
            poller.register(r, pollin)
            poller.register(pidfd, pollin)
            while not exited and len_(got) <= limit_bytes:
                for fd, _ev in poller.poll():
                    if fd == pidfd:
                        exited = True
                    else:
                        data = read_(r, 1 << 20)
                        if not data:
                            poller.unregister(r)
                        got += data
            set_blocking(r, False)
            try:  # whatever it wrote before it exited
                while len_(got) <= limit_bytes:
                    data = read_(r, 1 << 20)
                    if not data:
                        break
                    got += data
            except blocking_exc:
                pass
            close_(pidfd)
        finally:
            close_(r)
            try:
                kill_(pid, sigkill)  # (a copy past its own output cap)
            except os_error:
                pass
            status = waitpid_(pid, 0)[1]
            if sweep is not None:
                try:  # any process left (the call's, reparented to us): kill them all
                    waitid(p_all, 0, leftovers)
                    sweep()
                except child_error:
                    pass
        if len_(got) >= result_head and len_(got) == result_head + unpack_result(got)[2]:
            return received(got, now() - t0)
        if not exited:  # past its output cap, killed by this process: never "CallKilled" (see supervision)
            return 1, b"SandboxViolation: the call's process wrote more than a result may hold", now() - t0
        if wifsignaled(status):
            return 1, f"CallKilled: signal {wtermsig(status)}".encode(), now() - t0
        if got:
            return 1, b"SandboxViolation: the call's process wrote a malformed result", now() - t0
        return 1, f"ChildExited: the call's process exited (code {wexitstatus(status)})".encode(), now() - t0

    def harness(source: str, exprs: list[str], start: int, chan: int, token: bytes, budget: int) -> None:
        """Define ``source``, evaluate ``exprs[start:]``, one authenticated frame each on ``chan``
        (each call in its own copy of the defined program with ``ExecLimits.isolate_calls``)."""

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
        if isolate:
            freeze()  # the copies then write fewer of the defined program's pages
        for index in range_(start, len_(exprs)):
            call = plain(exprs[index], namespace) if isolate else exprs[index]
            if call is None:
                code, payload, seconds = evaluate_apart(exprs[index], namespace, chan)
            else:
                code, payload, seconds = evaluate(call, namespace)
            if code == 0:
                if len_(payload) > budget:
                    code, payload = 4, too_large
                else:
                    budget -= len_(payload)
            send(b"C", code, index, payload, seconds)
        exit_(0)

    return harness
