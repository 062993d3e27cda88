"""What one call or one program can spoil, and what counts as infrastructure: hostile values a call's
process reports, and a program's process killed from outside the sandbox.

* A call can only spoil its own result: every value an isolated call's process sends to the process that
  reports the calls (status code, size, duration) and every call frame the worker reads is checked per call;
  an out-of-range one fails that call alone, with its reason (``sandbox/harness.py``, ``received``;
  ``sandbox/supervision.py``, ``_accept_frames``).
* A program's process killed by a signal the program did not send (an operator's or the host OOM killer's
  SIGKILL, a SIGTERM) is infrastructure: retried, counted, logged, never scored; one that kills itself is
  scored as its own failure (``sandbox/supervision.py``, ``_exit_reason``; ``sandbox/executor.py``).

Run: ``pytest tests/sandbox/test_sandbox_faults.py`` (starts sandbox workers; a few seconds).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

import pytest

from sandbox import ExecLimits, ProcessExecutor, supervision
from sandbox.harness import _FRAME, _HDR, _TOKEN_BYTES
from sandbox.supervision import _accept_frames, _Progress

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the process sandbox needs Linux"
)

LIMITS = ExecLimits(call_timeout_s=2.0, program_timeout_s=10.0, max_value_bytes=1000, isolate_calls=True)
REFERENCE = "def f(x):\n    return x + 1\n"


def _forged_report(code: int, size: int) -> str:
    """A test's call expression whose process writes its own outcome record (status ``code``, a payload of
    ``size`` bytes) on every descriptor it holds, then exits before the harness in it can write the real one."""
    source = (
        "import os, struct\n"
        f"record = struct.pack('>BdQ', {code}, 0.0, {size}) + b'i' + bytes({size - 1})\n"
        "for fd in range(3, 1024):\n"
        "    try:\n"
        "        os.write(fd, record)\n"
        "    except OSError:\n"
        "        pass\n"
        "os._exit(0)\n"
    )
    return f"exec({source!r})"


@pytest.mark.parametrize(
    ("code", "size", "reason"),
    [
        (200, 9, "SandboxViolation: the call's process reported status code 200"),
        (0, 6000, "SandboxViolation: the call's process reported 6000 result bytes"),
        (1, 6000, "i"),  # an error message over its cap: cut, still this call's own error
    ],
)
def test_a_calls_out_of_range_report_fails_that_call_alone(code, size, reason):
    """An isolated call's process reporting an out-of-range status code, or more bytes than a frame may
    hold, made the worker mark every call of the job (the reference's expected values of every test) as
    ``error``; now only that call fails, with its reason, and the other calls keep their values."""
    with ProcessExecutor(workers=1, limits=LIMITS) as ex:
        out = ex.run(REFERENCE, ["f(1)", _forged_report(code, size), "f(2)"])
    assert [(o.status, o.value) for o in out] == [("ok", 2), ("error", None), ("ok", 3)], out
    assert out[1].error.startswith(reason) and len(out[1].error) <= 1000, out[1].error


def _frame(
    token: bytes, kind: bytes, code: int, index: int, payload: bytes, size: int | None = None
) -> bytes:
    body = token + _FRAME.pack(kind, code, index, 0.0) + payload
    return _HDR.pack(len(body) if size is None else size) + body


def test_the_worker_fails_an_out_of_range_call_frame_alone():
    """Authenticated call frames in order, one with a status code outside the known ones and one larger
    than a frame may be (sent in pieces): each fails its own call; the frames after them are read as usual.
    A frame without the token still voids the program (only its own process can write one)."""
    token, lim = b"t" * _TOKEN_BYTES, LIMITS
    ok = b"i" + (7).to_bytes(8, "big")
    oversized = _frame(token, b"C", 0, 2, b"x" * 6000)
    st = _Progress(0, 0)
    st.buf += _frame(token, b"S", 0, -1, b"") + _frame(token, b"R", 0, -1, b"")
    st.buf += _frame(token, b"C", 0, 0, ok) + _frame(token, b"C", 9, 1, b"") + oversized[:3000]
    assert _accept_frames(st, token, 4, lim) is None
    st.buf += oversized[3000:] + _frame(token, b"C", 0, 3, ok)
    assert _accept_frames(st, token, 4, lim) == ("done", None)
    got = {i: (r[0], r[2]) for i, r in st.results.items()}
    assert got == {
        0: ("ok", ""),
        1: ("error", "SandboxViolation: status code 9 out of range"),
        2: ("error", f"SandboxViolation: result frame of {len(oversized) - 4} bytes"),
        3: ("ok", ""),
    }
    assert st.results[3][1] == ok
    st = _Progress(0, 0)
    st.buf += _frame(b"u" * _TOKEN_BYTES, b"S", 0, -1, b"")
    assert _accept_frames(st, token, 1, lim) == ("violation", "frame without the run token")


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return [int(p) for p in fh.read().split()]


def _kill_later(ex: ProcessExecutor, target: str, sig: int, delay_s: float = 0.7) -> threading.Thread:
    """After ``delay_s``, send ``sig`` from this (outside) process to the worker, the program's process
    (the zygote's one running child) or the isolated call's process (that child's child)."""

    def kill() -> None:
        time.sleep(delay_s)
        pid = ex._workers[0].proc.pid
        if target != "worker":
            pid = _children(_children(pid)[0])[0]  # worker -> zygote -> the running child
        if target == "call":
            pid = _children(pid)[0]
        os.kill(pid, sig)

    thread = threading.Thread(target=kill)
    thread.start()
    return thread


SLOW = "import time\n\ndef f():\n    time.sleep(1.5)\n    return 7\n"


@pytest.mark.parametrize(
    ("target", "sig", "call"),
    [
        ("program", signal.SIGKILL, "f()"),  # the program's own function on constants: its own process
        ("program", signal.SIGTERM, "f()"),
        ("call", signal.SIGKILL, "(lambda: f())()"),  # code of its own: the call's own process
        ("worker", signal.SIGKILL, "f()"),
    ],
)
def test_a_process_killed_from_outside_is_retried_counted_logged_never_scored(target, sig, call, caplog):
    """A program's (or call's) process killed by a signal it did not send (an operator's SIGKILL or
    SIGTERM, the host's OOM killer) was scored ("ChildExited ... SIGKILL": a failed call changing the
    rewards) with no infra event counted; a killed worker was retried without a trace. Now each is an
    infrastructure event: the job runs again, the event is counted and logged in one line."""
    caplog.set_level(logging.WARNING, logger="sandbox")
    with ProcessExecutor(workers=1, limits=LIMITS, infra_retries=1) as ex:
        killer = _kill_later(ex, target, sig)
        out = ex.run(SLOW, [call])
        killer.join()
        assert [(o.status, o.value) for o in out] == [("ok", 7)], out
        assert (ex.stats["retries"], ex.stats["infra_events"], ex.stats["infra_errors"]) == (1, 1, 0)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("sandbox")]
    assert len(lines) == 1 and "runs again (retry 1 of 1)" in lines[0] and "\n" not in lines[0], lines


def test_a_worker_killed_mid_batch_charges_the_retry_to_the_running_job_alone(caplog):
    """Jobs travel to a worker in batches (``ProcessExecutor._dispatch``); a worker killed while it runs
    the first job of its batch costs that job one retry, and the jobs queued behind it run again with no
    retry charged (each still its own fresh child, each with its own result)."""
    caplog.set_level(logging.WARNING, logger="sandbox")
    jobs = [(SLOW, ["f()"])] + [(f"def f(x):\n    return x + {i}\n", ["f(1)"]) for i in range(40)]
    with ProcessExecutor(workers=1, limits=LIMITS, infra_retries=1) as ex:
        killer = _kill_later(ex, "worker", signal.SIGKILL)
        out = ex.run_many(jobs)
        killer.join()
        assert [(o.status, o.value) for r in out for o in r] == [("ok", 7)] + [
            ("ok", i + 1) for i in range(40)
        ]
        assert (ex.stats["retries"], ex.stats["infra_events"], ex.stats["infra_errors"]) == (1, 1, 0)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("sandbox")]
    assert len(lines) == 1 and lines[0].startswith("sandbox job 0 (attempt 1)"), lines


SELF_KILLING = (
    "import os, signal\n\ndef die(sig):\n    os.kill(os.getpid(), sig)\n\ndef abort():\n    os.abort()\n"
)


@pytest.mark.parametrize(
    ("call", "needle", "last", "retried"),
    [
        ("die(9)", "SIGKILL", "error", 2),  # the program's own process (its function on constants)
        ("(lambda: die(15))()", "signal 15", "ok", 2),  # the call's own process: only that call fails
        ("abort()", "SIGABRT", "error", 0),
        ("os.abort()", "signal 6", "ok", 0),
    ],
)
def test_a_program_that_kills_itself_is_scored_as_its_own_failure(call, needle, last, retried):
    """A program that kills itself is the program's doing: the same verdict as ever (an ``error`` for the
    calls it did not report). A signal someone outside could have sent is looked at again first (the job
    runs again: an outside kill does not strike every attempt); a fault it raised (SIGABRT) is not."""
    with ProcessExecutor(workers=1, limits=LIMITS, infra_retries=2) as ex:
        out = ex.run(SELF_KILLING, ["1", call, "2"])
        assert [o.status for o in out] == ["ok", "error", last], out
        assert needle in out[1].error, out[1].error
        assert (ex.stats["retries"], ex.stats["infra_events"], ex.stats["infra_errors"]) == (
            retried,
            retried,
            0,
        )


def test_only_a_kill_the_kernel_counts_outside_the_workers_cgroup_is_the_host_oom_killer(monkeypatch):
    """``host_oom`` (the job is ``infra_error`` past its retries, never scored) needs the kernel's OOM count
    to grow while the worker cgroup's does not: an OOM kill the program caused in its own cgroup (then a
    SIGTERM to itself) must not pass for the host's."""
    counts = {"host": 5, "cgroup": 1}
    monkeypatch.setattr(supervision, "_host_oom_kills", lambda: counts["host"])
    monkeypatch.setattr(supervision._cgroups, "oom_kills", lambda dirs: counts["cgroup"])
    ctx = {"cgroup_dirs": ["x"], "oom_seen": 1, "host_oom_seen": 5, "killed": None}
    counts["host"] += 1  # another process on the host
    supervision._killed_from_outside("the program's process died of signal SIGKILL", ctx)
    assert ctx["killed"] == ("the program's process died of signal SIGKILL (the host OOM killer)", True)
    ctx["killed"] = None
    counts["host"] += 1
    counts["cgroup"] += 1  # the program's own
    supervision._killed_from_outside("the program's process died of signal SIGTERM", ctx)
    assert ctx["killed"] == ("the program's process died of signal SIGTERM", False)
