"""The only place untrusted code runs: isolated executors returning :class:`CallOutcome` per call.

``ProcessExecutor`` (fork-server pool, Linux), ``DockerExecutor`` (container per program) and
``RayExecutor`` (process pools in warm actors on a Ray cluster, ``pip install -e '.[ray]'``) share one
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
