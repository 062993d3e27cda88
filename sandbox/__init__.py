"""The only place untrusted code runs: isolated executors returning :class:`CallOutcome` per call.

``ProcessExecutor`` (fork-server pool, Linux), ``DockerExecutor`` (container per program) and
``RayExecutor`` (process pools in warm actors on a Ray cluster, ``pip install -e '.[ray]'``) share one
interface, :class:`Executor`; ``make_executor(cfg.sandbox)`` builds the configured one. Guarantees and
limits are listed in ``sandbox/executor.py``.
"""

from __future__ import annotations

from typing import Protocol

from codea1_core.types import CallOutcome
from sandbox.executor import ProcessExecutor, SandboxUnavailable, make_executor
from sandbox.limits import ExecLimits


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


def __getattr__(name: str):
    if name == "DockerExecutor":  # imported lazily: it pulls the docker SDK only when used
        from sandbox.docker_executor import DockerExecutor

        return DockerExecutor
    if name == "RayExecutor":  # imported lazily: Ray is an optional extra
        from sandbox.ray_executor import RayExecutor

        return RayExecutor
    raise AttributeError(f"module 'sandbox' has no attribute {name!r}")
