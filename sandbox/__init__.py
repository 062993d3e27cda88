"""The only place untrusted code runs: isolated executors returning :class:`CallOutcome` per call.

``ProcessExecutor`` (fork-server pool, Linux) and ``DockerExecutor`` (container per program) share one
interface; ``make_executor(cfg.sandbox)`` builds the configured one. Guarantees and limits are listed
in ``sandbox/executor.py``.
"""

from codea1_core.types import CallOutcome
from sandbox.executor import ProcessExecutor, SandboxUnavailable, make_executor
from sandbox.limits import ExecLimits

__all__ = [
    "CallOutcome",
    "DockerExecutor",
    "ExecLimits",
    "ProcessExecutor",
    "SandboxUnavailable",
    "make_executor",
]


def __getattr__(name: str):
    if name == "DockerExecutor":  # imported lazily: it pulls the docker SDK only when used
        from sandbox.docker_executor import DockerExecutor

        return DockerExecutor
    raise AttributeError(f"module 'sandbox' has no attribute {name!r}")
