"""The only place untrusted code runs: isolated executors returning :class:`CallOutcome` per call.

``ProcessExecutor`` (fork-server pool, Linux), ``DockerExecutor`` (container per program) and
``RayExecutor`` (process pools in warm actors on a Ray cluster, ``pip install -e '.[ray]'``) share one
interface, :class:`Executor`; ``make_executor(cfg.sandbox)`` builds the configured one. Guarantees and
limits are listed in ``sandbox/executor.py``.

Every other name here is imported on first use, none when the package is imported: each sandbox worker
imports ``sandbox.child``, hence this file, and whatever it imported would live in every zygote and be
copied into every forked child (``sandbox.executor`` pulls ``subprocess``, hence ``threading``, whose
at-fork handler alone costs CPU in every child; Docker and Ray are optional SDKs).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from codea1_core.types import CallOutcome
    from sandbox.docker_executor import DockerExecutor
    from sandbox.errors import SandboxUnavailable
    from sandbox.executor import ProcessExecutor
    from sandbox.factory import make_executor
    from sandbox.limits import ExecLimits
    from sandbox.ray_executor import RayExecutor


class Executor(Protocol):
    """What every executor guarantees: ordered outcomes, and ``close()`` (also as a ``with`` block).

    ``close`` releases the workers, actors or client; callers always call it (``with make_executor(...) as
    ex:``), so no caller asks whether an executor has one.
    """

    def run(self, program: str, calls: list[str]) -> list[CallOutcome]: ...

    def run_many(self, jobs: list[tuple[str, list[str]]]) -> list[list[CallOutcome]]: ...

    def close(self) -> None: ...

    def __enter__(self) -> Executor: ...

    def __exit__(self, *exc: object) -> None: ...


_HOME = {
    "CallOutcome": "codea1_core.types",
    "DockerExecutor": "sandbox.docker_executor",
    "ExecLimits": "sandbox.limits",
    "ProcessExecutor": "sandbox.executor",
    "RayExecutor": "sandbox.ray_executor",
    "SandboxUnavailable": "sandbox.errors",
    "make_executor": "sandbox.factory",
}
__all__ = [
    "CallOutcome",
    "DockerExecutor",
    "Executor",
    "ExecLimits",
    "ProcessExecutor",
    "RayExecutor",
    "SandboxUnavailable",
    "make_executor",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'sandbox' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value
