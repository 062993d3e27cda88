"""``make_executor``: build the configured sandbox backend from ``codea1_core.config.SandboxConfig``.

It sits in its own module so that the backends never import each other: this module depends on them
(Docker and Ray lazily: their SDKs are optional), none of them on it. Import it as
``from sandbox import make_executor``.
"""

from __future__ import annotations

from typing import Any

from sandbox.executor import ProcessExecutor
from sandbox.limits import ExecLimits


def make_executor(sandbox_cfg: Any) -> Any:
    """Build the configured executor (``sandbox.backend``: process, docker or ray)."""
    limits = ExecLimits(
        call_timeout_s=sandbox_cfg.call_timeout_s,
        program_timeout_s=sandbox_cfg.program_cap_s,
        memory_mb=sandbox_cfg.memory_mb,
        max_output_bytes=sandbox_cfg.max_output_bytes,
        isolate_calls=getattr(sandbox_cfg, "isolate_calls", True),
    )
    common = {
        "workers": sandbox_cfg.workers,
        "limits": limits,
        "network_isolation": sandbox_cfg.network_isolation,
        "drop_privileges": sandbox_cfg.drop_privileges,
        "infra_retries": sandbox_cfg.infra_retries,
    }
    if sandbox_cfg.backend == "docker":
        from sandbox.docker_executor import DockerExecutor

        return DockerExecutor(image=sandbox_cfg.docker_image, **common)
    if sandbox_cfg.backend == "ray":
        from sandbox.ray_executor import RayExecutor

        common.pop("workers")
        return RayExecutor(
            address=sandbox_cfg.ray_address,
            actors_per_node=sandbox_cfg.ray_actors_per_node,
            workers_per_actor=sandbox_cfg.ray_workers_per_actor,
            **common,
        )
    if sandbox_cfg.backend != "process":
        raise ValueError(f"sandbox.backend: expected process, docker or ray, got {sandbox_cfg.backend!r}")
    return ProcessExecutor(**common)
