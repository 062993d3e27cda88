"""How the train flow runs its steps: as named Prefect task runs, timed, and stopped between steps by SIGTERM.

What it does: :func:`as_task` runs a step as a task run (``rollout_code[it=3]`` in the Prefect UI) under
``orchestration.task_timeout_s``, :func:`as_function` as its plain function (rank > 0, the bench's baseline);
:func:`timed_steps` wraps either so each step's wall time lands in ``time/<step>_s`` and a set stop event
raises :class:`Stopped` before the next step; :func:`stop_on_sigterm` is where that event comes from: SIGTERM
sets it (the run stops after its current task, the last checkpoint stands), a second SIGTERM exits at once.
What it does not: decide the steps (``flows/train.py``) or how a stopped run ends (``flows/run_endings.py``).

Tests: ``tests/flows/test_fail_fast.py`` (SIGTERM), ``tests/flows/test_train_flow.py`` (task runs).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from codea1_core.config import Config
from flows.common import PLAIN, quoted

log = logging.getLogger("codea1.train")


class Stopped(Exception):
    """SIGTERM arrived: the run stops before its next task (the last checkpoint stands)."""


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[threading.Event]:
    """While inside: SIGTERM sets the returned event (a second SIGTERM exits at once with 143).

    Why: Prefect's own SIGTERM bridge tears the run down from wherever it is (minutes, with tracebacks);
    stopping between tasks keeps the workspace resumable. Only the main thread can install a handler.
    """
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise SystemExit(143)
        stop.set()
        log.warning("train: SIGTERM received: stopping after the current task (send it again to stop now)")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, previous)


def timed_steps(call: Callable[..., Any], times: dict[str, float], stop: threading.Event | None):
    """``timed(name, task, *args)``: ``call(task, *args)`` timed into ``times["time/<name>_s"]``; raises
    :class:`Stopped` instead when ``stop`` is set (SIGTERM: the run stops between tasks)."""

    def timed(name: str, task: Any, *args: Any, **kwargs: Any) -> Any:
        if stop is not None and stop.is_set():
            raise Stopped(name)
        t0 = time.perf_counter()
        out = call(task, *args, **kwargs)
        times[f"time/{name}_s"] = time.perf_counter() - t0
        return out

    return timed


def as_task(task: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a Prefect task (a named task run in the UI) under ``orchestration.task_timeout_s``; arguments as
    :func:`flows.common.quoted` gives them (the ``Config`` too is passed as it is)."""
    cfg = kwargs.get("cfg") or next((a for a in args if isinstance(a, Config)), None)
    if cfg is not None and cfg.orchestration.task_timeout_s > 0:
        task = task.with_options(timeout_seconds=cfg.orchestration.task_timeout_s)
    args, kwargs = quoted(args, kwargs, (*PLAIN, Config))
    return task(*args, **kwargs)


def as_function(task: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a task's plain function (no Prefect): the baseline of ``bench/iteration_bench.py``."""
    return getattr(task, "fn", task)(*args, **kwargs)
