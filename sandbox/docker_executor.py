"""DockerExecutor: the same interface as ``ProcessExecutor``, one container per program.

What it does: for each program, creates a container from ``image`` with the network disabled, a
memory limit (``memory_mb``, no swap), a pids limit, ``no-new-privileges`` and all capabilities
dropped except those the in-container worker needs to drop to an unprivileged uid and clean up
(SETUID, SETGID, KILL, CHOWN); copies in the sandbox worker (``sandbox/child.py`` and the modules it
imports, ``codea1_core/values.py``) and the job, starts it, waits (program cap + margin), fetches the result
file and removes the container. Inside, the same child/harness/frame protocol as the process backend
applies (per-call limits, verdict integrity); the trusted parent decodes values.

What it does not do: build images (the image only needs ``python3`` >= 3.11 on PATH), keep warm
containers (one container per program is slow: seconds, not milliseconds), or work without a
reachable engine: then it raises ``SandboxUnavailable`` naming the process backend. ``import docker``
happens lazily, so the SDK is optional.
"""

from __future__ import annotations

import io
import marshal
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from codea1_core.types import CallOutcome
from sandbox.decoding import outcomes_of
from sandbox.errors import SandboxUnavailable
from sandbox.limits import ExecLimits

_ROOT_IN_CONTAINER = "/codea1"
_BOOT = "import sys; sys.path.insert(0, sys.argv[1]); from sandbox.child import oneshot_main; oneshot_main(sys.argv[1])"
_REPO = Path(__file__).resolve().parent.parent
_SHIPPED = (
    "codea1_core/values.py",
    "sandbox/child.py",
    "sandbox/harness.py",
    "sandbox/supervision.py",
    "sandbox/zygote.py",
    "sandbox/limits.py",
    "sandbox/linux.py",
    "sandbox/namespaces.py",
    "sandbox/mounts.py",
    "sandbox/cgroups.py",
    "sandbox/confinement.py",
    "sandbox/credentials.py",
    "sandbox/landlock.py",
    "sandbox/pinning.py",
    "sandbox/syscall_filter.py",
)


class DockerExecutor:
    """Run untrusted programs in throw-away containers (see the module docstring).

    Args:
        workers: containers running at the same time.
        limits: per-call / per-program limits.
        network_isolation: accepted for interface parity; containers always run without network.
        drop_privileges: run the program as uid 65534 inside the container (else container root).
        infra_retries: retries of a program whose container failed before reporting ``infra_error``.
        image: image with ``python3`` (>= 3.11).
        client: a docker client (default ``docker.from_env()``); tests pass a fake.
        pids_limit: process limit of the container.
    """

    def __init__(
        self,
        workers: int = 2,
        limits: ExecLimits | None = None,
        network_isolation: str = "auto",
        drop_privileges: bool = True,
        infra_retries: int = 2,
        image: str = "python:3.11-slim",
        client: Any = None,
        pids_limit: int = 64,
    ) -> None:
        if network_isolation not in ("auto", "require", "off"):
            raise ValueError(f"network_isolation: expected auto, require or off, got {network_isolation!r}")
        self.limits = limits or ExecLimits()
        self.workers, self.infra_retries, self.image, self.pids_limit = (
            workers,
            infra_retries,
            image,
            pids_limit,
        )
        self._uid = 65534 if drop_privileges else None
        self._own_client = client is None
        self.client = client if client is not None else _connect()
        self.stats: dict[str, float] = dict.fromkeys(
            ("programs", "calls", "timeouts", "infra_errors", "retries", "seconds"), 0
        )
        self.isolation = {
            "network": "container (network_disabled)",
            "filesystem": "container",
            "uid": "65534 in container" if self._uid else "container root",
            "rlimits": "AS CPU FSIZE NOFILE CORE" + (" NPROC" if self._uid else ""),
            "image": image,
        }
        self.last_outputs: list[bytes] = []
        self._code_tar = _code_tar()

    def run(self, program: str, calls: list[str]) -> list[CallOutcome]:
        """Run ``program`` then evaluate each call expression in its namespace; one outcome per call."""
        return self.run_many([(program, calls)])[0]

    def close(self) -> None:
        """Nothing runs between calls (a container lives for one program); close a client we opened."""
        if self._own_client:
            self.client.close()

    def __enter__(self) -> DockerExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_many(self, jobs: list[tuple[str, list[str]]]) -> list[list[CallOutcome]]:
        """Run many programs, ``workers`` containers at a time; results in the order of ``jobs``."""
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            pairs = list(pool.map(lambda job: self._run_with_retries(*job), jobs))
        self.last_outputs = [output for _, output in pairs]
        results = [outcomes for outcomes, _ in pairs]
        self.stats["seconds"] += time.monotonic() - t0
        self.stats["programs"] += len(jobs)
        for outcomes in results:
            self.stats["calls"] += len(outcomes)
            self.stats["timeouts"] += sum(o.status == "timeout" for o in outcomes)
            self.stats["infra_errors"] += sum(o.status == "infra_error" for o in outcomes)
        return results

    def _run_with_retries(self, program: str, calls: list[str]) -> tuple[list[CallOutcome], bytes]:
        if not calls:
            return [], b""
        why = ""
        for attempt in range(self.infra_retries + 1):
            if attempt:
                self.stats["retries"] += 1
            try:
                msg = self._run_container(program, list(calls))
            except Exception as exc:  # the engine or the container failed, not the program
                why = f"{type(exc).__name__}: {exc}"
                continue
            if msg[0] == "result":
                return outcomes_of(msg[2], self.limits), msg[3]
            why = str(msg[2])
        return [CallOutcome("infra_error", None, f"InfraError: {why}"[:2000])] * len(calls), b""

    def _run_container(self, program: str, calls: list[str]) -> tuple:
        settings = {
            "limits": {k: getattr(self.limits, k) for k in self.limits.__dataclass_fields__},
            "uid": self._uid,
        }
        container = self.client.containers.create(
            self.image,
            command=["python3", "-s", "-c", _BOOT, _ROOT_IN_CONTAINER],
            environment={"PYTHONHASHSEED": "0"},  # same set/dict orders as the process backend
            network_disabled=True,
            mem_limit=f"{self.limits.memory_mb + 128}m",  # the in-container RLIMIT_AS is memory_mb
            memswap_limit=f"{self.limits.memory_mb + 128}m",
            pids_limit=self.pids_limit,
            cap_drop=["ALL"],
            cap_add=["SETUID", "SETGID", "KILL", "CHOWN"],
            security_opt=["no-new-privileges"],
            working_dir="/",
            detach=True,
        )
        try:
            container.put_archive("/", _job_tar(self._code_tar, marshal.dumps((settings, program, calls))))
            container.start()
            container.wait(timeout=self.limits.program_timeout_s + 60)
            stream, _stat = container.get_archive(f"{_ROOT_IN_CONTAINER}/out/result.marshal")
            return _read_result(b"".join(stream))
        finally:
            try:
                container.remove(force=True)
            except Exception:
                pass


def _connect() -> Any:
    try:
        import docker
    except ImportError:
        raise SandboxUnavailable(
            "the docker SDK is not installed (pip install 'codea1[docker]'); use sandbox.backend=process"
        ) from None
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise SandboxUnavailable(
            f"no Docker engine reachable ({exc}); use sandbox.backend=process (the fork-server sandbox)"
        ) from None
    return client


def _code_tar() -> list[tuple[str, bytes]]:
    files = [(f"{_ROOT_IN_CONTAINER.lstrip('/')}/{rel}", (_REPO / rel).read_bytes()) for rel in _SHIPPED]
    for pkg in ("codea1_core", "sandbox"):  # empty packages: only the shipped modules are importable
        files.append((f"{_ROOT_IN_CONTAINER.lstrip('/')}/{pkg}/__init__.py", b""))
    return files


def _job_tar(code: list[tuple[str, bytes]], job: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in [*code, (f"{_ROOT_IN_CONTAINER.lstrip('/')}/job.marshal", job)]:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _read_result(tar_bytes: bytes) -> tuple:
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        member = tar.getmembers()[0]
        fh = tar.extractfile(member)
        if fh is None:
            raise RuntimeError("result archive holds no file")
        return marshal.loads(fh.read())
