"""Stopping a stage's process group: SIGTERM, a bounded wait, SIGKILL; and the guard that does it when the
pipeline runner dies.

What it does: :func:`stop_process_group` is how :mod:`flows.pipeline` stops ``dvc repro`` and the running stage
(on Ctrl-C or SIGTERM). Run as a script, ``python flows/guard.py PGID TIMEOUT_S RUNNER_PID``, this file is the
runner's guard: a separate process, in its own session (no signal meant for the group or the terminal reaches
it), that the kernel sends SIGTERM when the runner dies, however it dies (``PR_SET_PDEATHSIG``, armed by the
runner before the exec, with SIGTERM blocked until the handler below is in place); it then stops the group the
same way and exits. The runner kills it once the group is done.

Why a script of the standard library only: the guard starts next to every stage, and must not wait for (or
depend on) anything the project imports.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable


def group_alive(pgid: int) -> bool:
    """Whether any process (zombies included) is still in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_process_group(pgid: int, timeout_s: float, poll: Callable[[], object] = lambda: None) -> None:
    """SIGTERM group ``pgid``, wait up to ``timeout_s`` for every process in it to exit (calling ``poll``
    every 0.2 s: the caller reaps its own child there, since a zombie still counts as a member), then SIGKILL
    what is left. A KeyboardInterrupt while waiting (a second Ctrl-C) kills at once."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            poll()
            if not group_alive(pgid):
                return
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _guard(pgid: int, timeout_s: float, runner: int) -> None:
    def stop(*_: object) -> None:
        print(
            f"pipeline: the pipeline process died; stopping its stage (process group {pgid}, up to {timeout_s:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
        stop_process_group(pgid, timeout_s)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # blocked since the fork: delivered now
    if os.getppid() != runner:  # the runner died before the death signal was armed
        stop()
    while True:
        signal.pause()


if __name__ == "__main__":
    _guard(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]))
