"""The sandbox's own exception, shared by every backend (``executor``, ``docker_executor``, ``ray_executor``).

It lives apart so that backends depend on this small module, never on each other.
"""

from __future__ import annotations


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot provide what the configuration requires (fail closed, at start-up)."""
