"""RayExecutor: the sandbox spread over a Ray cluster, behind the same interface as ``ProcessExecutor``.

What it does: ``RayExecutor.run_many(jobs)`` returns one list of :class:`CallOutcome` per job, in the order
of ``jobs``, like :class:`sandbox.executor.ProcessExecutor`. It keeps warm per-node pools: on every alive
Ray node with CPUs it starts ``actors_per_node`` actors (pinned to the node), each owning ONE
``ProcessExecutor`` of ``workers_per_actor`` fork-server workers that stays warm across steps. A step's
jobs go out in chunks (guided self-scheduling: big chunks first, small ones at the end so no actor
straggles) with at most two chunks in flight per actor (back-pressure: the driver never queues a whole
step's programs in Ray's object store), and results are put back in order.

Isolation is the process sandbox's, inside each actor, unchanged: namespaces, uid drop, rlimits, the
private result channel with its per-run token (see ``sandbox/executor.py`` for what is and is not
covered). Values are decoded inside the actor's ``ProcessExecutor`` (our trusted code, never the
program's) and travel to the driver as plain data.

Infrastructure failures (docs/method.md D4): an actor or node lost mid-step (killed, out of memory, node
removed, watchdog expired) loses no job: its chunks are re-queued for the other actors (and a replacement
actor is started on the node while the node is alive); a job lost more than ``infra_retries`` times is
reported as ``infra_error`` — never as a failed call — and ``tasks/execute.py`` aborts the step only past
``sandbox.max_infra_failure_frac``. Outcomes the actor's own pool reports as ``infra_error`` pass through
unchanged (that pool already retried them).

What it does not: ship the code to the nodes. Every node must have this project importable at the same
path with the same Python (one container image for the cluster, the usual Ray practice); actors get
``PYTHONPATH`` set to this checkout. Actors reserve no Ray CPUs (``num_cpus=0``): size
``actors_per_node * workers_per_actor`` to the nodes' cores.

Config (``codea1_core.config.SandboxConfig``): ``backend: ray``, ``ray_address`` (empty = start a local
Ray runtime; ``auto`` or ``ray://host:10001`` = an existing cluster), ``ray_actors_per_node``,
``ray_workers_per_actor``. Install: ``pip install -e '.[ray]'``. Tests: ``pytest tests/sandbox/test_ray_executor.py``
(a real two-node ``ray.cluster_utils.Cluster`` on this machine); benchmark: ``python bench/sandbox_bench.py
--ray``.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from codea1_core.types import CallOutcome
from sandbox.errors import SandboxUnavailable
from sandbox.executor import _REPO_ROOT
from sandbox.limits import ExecLimits

Job = tuple[str, list[str]]
_INFLIGHT_PER_ACTOR = 2
_START_TIMEOUT_S = 180.0
_FRESH_ACTOR_GRACE_S = 60.0


class _SandboxActor:
    """Runs inside a Ray worker process on one node: owns one warm ``ProcessExecutor``."""

    def __init__(self, executor_kwargs: dict) -> None:
        from sandbox.executor import ProcessExecutor

        self.ex = ProcessExecutor(**executor_kwargs)

    def describe(self) -> dict:
        """Where this actor runs and what isolation its pool got (checked by the driver at start-up)."""
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "worker_pids": [w.proc.pid for w in self.ex._workers],
            "isolation": dict(self.ex.isolation),
        }

    def run_chunk(self, jobs: list[Job]) -> tuple[list[list[CallOutcome]], list[bytes]]:
        """One chunk of a step on this actor's pool: outcomes and captured output, in order."""
        results = self.ex.run_many(jobs)
        return results, list(self.ex.last_outputs)

    def close(self) -> None:
        self.ex.close()


@dataclass
class _Slot:
    """One actor place on a node; ``generation`` tells a replaced actor's late failures from new ones."""

    node_id: str
    actor: Any
    generation: int = 0
    busy_until: float = 0.0
    fresh: bool = True
    inflight: int = 0
    alive: bool = True


class RayExecutor:
    """Warm ``ProcessExecutor`` pools in Ray actors, one or more per node; see the module docstring.

    Args:
        address: Ray cluster address; empty starts a local Ray runtime (when this process is not
            already connected to one, in which case that connection is used).
        actors_per_node: actors started on each alive node with CPUs.
        workers_per_actor: fork-server workers of each actor's ``ProcessExecutor``.
        limits, network_isolation, drop_privileges, hide_paths: as for ``ProcessExecutor`` (per actor).
        infra_retries: times a job lost with its actor is re-queued before it is ``infra_error``;
            also passed to each actor's pool for its own worker crashes.
        max_chunk_jobs: largest chunk sent to one actor at once (default ``32 * workers_per_actor``: an actor
            runs one chunk at a time, so its workers idle at the end of each chunk; fewer, bigger chunks
            idle less, and the chunks shrink at the end of a step anyway).
    """

    def __init__(
        self,
        address: str = "",
        actors_per_node: int = 1,
        workers_per_actor: int = 2,
        limits: ExecLimits | None = None,
        network_isolation: str = "auto",
        drop_privileges: bool = True,
        infra_retries: int = 2,
        hide_paths: list[str] | None = None,
        max_chunk_jobs: int | None = None,
    ) -> None:
        if actors_per_node < 1 or workers_per_actor < 1 or infra_retries < 0:
            raise ValueError(
                "actors_per_node and workers_per_actor must be >= 1 and infra_retries >= 0, got "
                f"{actors_per_node}, {workers_per_actor}, {infra_retries}"
            )
        self.limits = limits or ExecLimits()
        self.infra_retries = infra_retries
        self.workers_per_actor = workers_per_actor
        self.max_chunk_jobs = max_chunk_jobs or 32 * workers_per_actor
        self._executor_kwargs = {
            "workers": workers_per_actor,
            "limits": self.limits,
            "network_isolation": network_isolation,
            "drop_privileges": drop_privileges,
            "infra_retries": infra_retries,
            "hide_paths": hide_paths,
        }
        self.stats: dict[str, float] = dict.fromkeys(
            ("programs", "calls", "timeouts", "infra_errors", "retries", "actor_losses", "seconds"), 0
        )
        self.last_outputs: list[bytes] = []
        """Captured stdout+stderr (truncated) of each program of the last ``run``/``run_many``."""
        self.last_loss = ""
        self._slots: list[_Slot] = []
        self._ray = _import_ray()
        self._owns_ray = _connect(self._ray, address)
        self._actor_cls = self._ray.remote(_SandboxActor)
        try:
            self._start_actors(actors_per_node)
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------------------------------------
    # Actors

    def _new_actor(self, node_id: str) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return self._actor_cls.options(
            num_cpus=0,
            max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
            runtime_env={"env_vars": {"PYTHONPATH": _REPO_ROOT}},
        ).remote(self._executor_kwargs)

    def _start_actors(self, actors_per_node: int) -> None:
        """One ``actors_per_node`` group per alive node with CPUs; fail closed if any cannot start."""
        nodes = _alive_nodes(self._ray)
        if not nodes:
            raise SandboxUnavailable("sandbox.backend=ray: the Ray cluster has no alive node with CPUs")
        self._slots = [_Slot(n, self._new_actor(n)) for n in nodes for _ in range(actors_per_node)]
        refs = [s.actor.describe.remote() for s in self._slots]
        try:
            info = self._ray.get(refs, timeout=_START_TIMEOUT_S)
        except Exception as exc:
            raise SandboxUnavailable(
                f"sandbox.backend=ray: an actor could not start: {_cause(exc)}"
            ) from None
        self.actor_info = info
        self.isolation: dict = dict(info[0]["isolation"])
        differs = any(i["isolation"] != info[0]["isolation"] for i in info)
        self.isolation.update(
            backend="ray", nodes=len(nodes), actors=len(self._slots), differs_by_node=differs
        )
        for slot in self._slots:
            slot.fresh = False

    def _replace(self, slot: _Slot, why: str, budget: list[int]) -> None:
        """Retire ``slot``'s actor; start a new one on its node while the node lives and ``budget`` lasts."""
        try:
            self._ray.kill(slot.actor, no_restart=True)
        except Exception:
            pass  # already gone
        self.stats["actor_losses"] += 1
        slot.generation += 1
        slot.inflight, slot.busy_until = 0, 0.0
        if budget[0] > 0 and slot.node_id in _alive_nodes(self._ray):
            budget[0] -= 1
            slot.actor, slot.fresh = self._new_actor(slot.node_id), True
        else:
            slot.alive = False
        self.last_loss = why

    # ---------------------------------------------------------------------------------------------
    # Jobs

    def run(self, program: str, calls: list[str]) -> list[CallOutcome]:
        """Run ``program`` then evaluate each call expression in its namespace; one outcome per call."""
        return self.run_many([(program, calls)])[0]

    def run_many(self, jobs: list[Job]) -> list[list[CallOutcome]]:
        """Run many programs across the cluster's actors; results in the order of ``jobs``."""
        if not self._slots:
            raise RuntimeError("RayExecutor is closed")
        t0 = time.monotonic()
        jobs = [(str(p), [str(c) for c in calls]) for p, calls in jobs]
        results = self._dispatch(jobs)
        self.stats["seconds"] += time.monotonic() - t0
        self.stats["programs"] += len(jobs)
        for outcomes in results:
            self.stats["calls"] += len(outcomes)
            for o in outcomes:
                self.stats["timeouts"] += o.status == "timeout"
                self.stats["infra_errors"] += o.status == "infra_error"
        return results

    def _dispatch(self, jobs: list[Job]) -> list[list[CallOutcome]]:
        """Chunks out, results back in order; lost chunks re-queued (see the module docstring)."""
        results: list[list[CallOutcome] | None] = [[] if not calls else None for _, calls in jobs]
        self.last_outputs = [b""] * len(jobs)
        pending = deque((i, 0) for i, (_, calls) in enumerate(jobs) if calls)
        inflight: dict[Any, tuple[_Slot, int, list[tuple[int, int]], float]] = {}
        budget = [len(self._slots) * (self.infra_retries + 1)]  # actor replacements in this call
        while pending or inflight:
            self._submit(jobs, pending, inflight)
            if not inflight:  # no actor left anywhere: what remains is infrastructure's failure
                for j, _ in pending:
                    results[j] = _infra(len(jobs[j][1]), f"no sandbox actor left ({self.last_loss})")
                break
            wait_s = max(0.0, min(d for *_, d in inflight.values()) - time.monotonic())
            ready, _ = self._ray.wait(list(inflight), num_returns=1, timeout=wait_s + 0.05)
            for ref in ready:
                slot, gen, chunk, _ = inflight.pop(ref)
                try:
                    outcomes, outputs = self._ray.get(ref)
                except Exception as exc:  # actor/node died, or the actor's code failed
                    self._lost(slot, gen, chunk, f"{type(exc).__name__}: {_cause(exc)}", budget)
                    self._requeue(chunk, results, pending, jobs)
                    continue
                if gen == slot.generation:
                    slot.inflight -= 1
                    slot.fresh = False
                for (j, _), out, text in zip(chunk, outcomes, outputs, strict=True):
                    results[j], self.last_outputs[j] = out, text
            now = time.monotonic()
            for ref, (slot, gen, chunk, deadline) in list(inflight.items()):
                if now > deadline:
                    del inflight[ref]
                    self._lost(slot, gen, chunk, "sandbox actor watchdog expired", budget)
                    self._requeue(chunk, results, pending, jobs)
        return results  # type: ignore[return-value]

    def _submit(self, jobs: list[Job], pending: deque, inflight: dict) -> None:
        """Fill every live actor up to two chunks; chunk = remaining / (2 * actors), capped."""
        live = [s for s in self._slots if s.alive]
        for slot in live:
            while pending and slot.inflight < _INFLIGHT_PER_ACTOR:
                size = max(1, min(self.max_chunk_jobs, math.ceil(len(pending) / (2 * len(live)))))
                chunk = [pending.popleft() for _ in range(min(size, len(pending)))]
                ref = slot.actor.run_chunk.remote([jobs[j] for j, _ in chunk])
                budget_s = (self.limits.program_timeout_s + 30.0) * math.ceil(
                    len(chunk) / self.workers_per_actor
                )
                start = max(slot.busy_until, time.monotonic())
                slot.busy_until = start + budget_s + (_FRESH_ACTOR_GRACE_S if slot.fresh else 0.0)
                slot.inflight += 1
                inflight[ref] = (slot, slot.generation, chunk, slot.busy_until)

    def _lost(self, slot: _Slot, gen: int, chunk: list, why: str, budget: list[int]) -> None:
        """A chunk came back failed: the first failure of an actor generation replaces that actor."""
        if gen == slot.generation and slot.alive:
            self._replace(slot, why, budget)

    def _requeue(self, chunk: list[tuple[int, int]], results: list, pending: deque, jobs: list[Job]) -> None:
        """Jobs of a lost chunk go back to the front of the queue, or become ``infra_error`` past retries."""
        for j, attempt in reversed(chunk):
            if attempt < self.infra_retries:
                self.stats["retries"] += 1
                pending.appendleft((j, attempt + 1))
            else:
                results[j] = _infra(len(jobs[j][1]), f"sandbox actor lost ({self.last_loss})")

    # ---------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the actors' pools, kill the actors, and stop Ray if this executor started it."""
        slots, self._slots = getattr(self, "_slots", []), []
        if not hasattr(self, "_ray") or not self._ray.is_initialized():
            return  # never touch the Ray API without a connection: it would start a new runtime
        if slots:
            self._stop_actors(slots)
        if getattr(self, "_owns_ray", False):
            self._owns_ray = False
            self._ray.shutdown()

    def _stop_actors(self, slots: list[_Slot]) -> None:
        refs = [s.actor.close.remote() for s in slots if s.alive]
        try:
            self._ray.wait(refs, num_returns=len(refs), timeout=30)
        except Exception:
            pass  # a dead actor's pool is gone with it
        for slot in slots:
            try:
                self._ray.kill(slot.actor, no_restart=True)
            except Exception:
                pass

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


# -------------------------------------------------------------------------------------------------


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise SandboxUnavailable(
            "sandbox.backend=ray needs Ray: pip install -e '.[ray]' (or use backend=process)"
        ) from None
    return ray


def _connect(ray: Any, address: str) -> bool:
    """Connect to ``address`` (empty: ``RAY_ADDRESS`` or a new local runtime); True when we started Ray."""
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address:
        kwargs["address"] = address
    try:
        ray.init(**kwargs)
    except Exception as exc:
        raise SandboxUnavailable(
            f"sandbox.ray_address={address!r}: cannot connect to Ray: {type(exc).__name__}: {exc}"
        ) from None
    return True


def _alive_nodes(ray: Any) -> list[str]:
    return [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]


def _cause(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__


def _infra(n_calls: int, why: str) -> list[CallOutcome]:
    return [CallOutcome("infra_error", None, f"InfraError: {why}"[:2000])] * n_calls
