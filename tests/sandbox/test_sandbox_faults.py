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

import sys

import pytest

from sandbox import ExecLimits, ProcessExecutor
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
