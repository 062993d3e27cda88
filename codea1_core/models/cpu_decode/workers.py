"""Warm worker processes that run a function on a model's current weights, tensors passed through shared memory.

What it does: :class:`DecodePool` forks ``workers`` processes from the caller once, each with its own anonymous
shared-memory arena (``mmap``, created before the fork, so nothing has to be sent to map it) and a socket pair
for small messages. :meth:`DecodePool.submit` copies a job's tensors into a worker's arena — and the model's
parameters and buffers, only when they changed since that worker last saw them (torch's in-place version
counters: an optimizer step or ``load_state_dict`` changes them) — and sends a short pickled description;
the worker copies the parameters into its own (forked) copy of the model, runs the job function, writes the
output tensors after the inputs and answers with their description; :meth:`DecodePool.result` reads them
back. ``shared`` uses it to decode part of a rollout's prompts on every spare core, so the pool only
moves bytes: the same function on the same values gives the same bits in any process.

Why not a fork per call: a training process is large, so forking it costs milliseconds before the child runs
and again to tear the child down, and every page either side writes afterwards is copied — more than the
second core saves on the lab's small code rollout, which then gets slower.

Lifetime and faults: one pool per model object (:func:`pool_for`), closed when the model is garbage collected,
at interpreter exit, or when the model's parameters change shape (then it is forked anew). Workers ignore
SIGINT (Ctrl-C reaches the caller, which stops them) and exit when the caller closes their socket or is gone
(a thread of each worker looks every :data:`PARENT_POLL_S`, in a job too: a killed run leaves none). A worker
that errs, dies or does not answer in time is killed and reaped; :meth:`DecodePool.result` returns None and the
caller runs that part itself: a failure costs time, never a result. The next submit forks a replacement.

What it does not: share a model across processes for writing, run on GPUs, or work for models whose behaviour
depends on Python state changed after the fork (e.g. a PEFT adapter switched off): callers pass plain
modules whose numbers depend only on their tensors and config (checked: a config change refreshes the pool).
Weights written through ``tensor.data`` bypass torch's version counter and would not be resent; nothing in
this project does that (optimizer steps and ``load_state_dict`` write in place, counted).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import mmap
import os
import pickle
import resource
import select
import signal
import socket
import struct
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

log = logging.getLogger(__name__)

ARENA_BYTES = 64 << 20
"""Initial shared memory per worker; a job that needs more restarts its worker with twice what it needs."""

PARENT_POLL_S = 0.5
"""How often a worker looks whether its caller is still alive, busy or idle."""

_ALIGN = 64
_HEADER = struct.Struct("<Q")

Job = Callable[
    [torch.nn.Module, dict[str, torch.Tensor], dict[str, Any]], tuple[dict[str, torch.Tensor], Any]
]
"""``job(model, tensors, meta) -> (output tensors, small picklable result)``: what a worker runs."""


# ------------------------------------------------------------------------------------------------
# Arena: tensors laid out in an mmap
# ------------------------------------------------------------------------------------------------


def _place(arena: mmap.mmap, start: int, tensors: Mapping[Any, torch.Tensor]) -> tuple[dict[str, tuple], int]:
    """Copy ``tensors`` into ``arena`` from ``start``; returns their descriptions and the end offset."""
    out, offset = {}, start
    for name, tensor in tensors.items():
        offset = -(-offset // _ALIGN) * _ALIGN
        flat = tensor.detach().contiguous().reshape(-1)
        nbytes = flat.numel() * flat.element_size()
        if nbytes:
            _view(arena, offset, tuple(flat.shape), flat.dtype).copy_(flat)
        out[name] = (offset, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))
        offset += nbytes
    return out, offset


def _view(arena: mmap.mmap, offset: int, shape: tuple, dtype: torch.dtype | str) -> torch.Tensor:
    """A tensor over ``arena`` at ``offset`` (no copy)."""
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    count = 1
    for size in shape:
        count *= size
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(arena, dtype=dtype, count=count, offset=offset).view(shape)


def _views(arena: mmap.mmap, described: dict[str, tuple]) -> dict[str, torch.Tensor]:
    return {name: _view(arena, offset, shape, dtype) for name, (offset, shape, dtype) in described.items()}


def _nbytes(tensors: Mapping[Any, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() + _ALIGN for t in tensors.values())


# ------------------------------------------------------------------------------------------------
# Messages
# ------------------------------------------------------------------------------------------------


def _send(sock: socket.socket, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("decode worker connection closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> Any:
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    return pickle.loads(_recv_exact(sock, size))


# ------------------------------------------------------------------------------------------------
# The worker
# ------------------------------------------------------------------------------------------------


def _state_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer, in a fixed order (the same in the caller and in a forked worker)."""
    return [*model.parameters(), *model.buffers()]


def _next_message(sock: socket.socket, parent: int) -> Any:
    """The next message, or ``"stop"`` on EOF or once the caller is gone (checked every second while idle).

    Not ``PR_SET_PDEATHSIG``: it fires when the *thread* that forked exits, and Prefect runs tasks in threads.
    """
    while True:
        ready, _, _ = select.select([sock], [], [], 1.0)
        if ready:
            try:
                return _recv(sock)
            except EOFError:
                return "stop"
        if os.getppid() != parent:
            return "stop"


def _exit_with_parent(parent: int) -> None:
    """In a worker, on a thread of its own: end the worker once the caller is gone, even in the middle of a job
    (:func:`_next_message` only looks between jobs, and a long decode must not outlive a killed run)."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _detach(keep: int) -> None:
    """In a new worker: close every inherited descriptor but ``keep``; stdin/stdout/stderr become /dev/null.

    A fork copies every open file of the caller: sandbox pipes, sockets, the terminal or a pipe a parent reads
    to its end (``make run | tee``). Held open by a worker they would keep peers from seeing their end.
    """
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, keep)
    os.closerange(keep + 1, max(keep + 2, resource.getrlimit(resource.RLIMIT_NOFILE)[0]))


def _worker_main(
    sock: socket.socket, arena: mmap.mmap, model: torch.nn.Module, job: Job, parent: int
) -> None:
    """A worker's loop: one job per message until ``stop`` or EOF; never returns (``os._exit``)."""
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
        torch.set_num_threads(1)
        state = _state_tensors(model)
        with torch.no_grad():
            while True:
                message = _next_message(sock, parent)
                if message == "stop":
                    break
                try:
                    if message["params"] is not None:
                        for tensor, view in zip(
                            state, _views(arena, message["params"]).values(), strict=True
                        ):
                            tensor.copy_(view.view(tensor.shape))
                    outputs, result = job(model, _views(arena, message["inputs"]), message["meta"])
                    if _nbytes(outputs) > len(arena) - message["end"]:
                        raise MemoryError(f"outputs need {_nbytes(outputs)} bytes past the inputs' end")
                    placed, _ = _place(arena, message["end"], outputs)
                    _send(sock, ("ok", placed, result))
                except Exception as exc:  # reported; the caller runs the part itself
                    _send(sock, ("error", f"{type(exc).__name__}: {exc}"))
    except BaseException:
        code = 1
    finally:
        os._exit(code)


# ------------------------------------------------------------------------------------------------
# The pool
# ------------------------------------------------------------------------------------------------


@dataclass
class _Worker:
    pid: int
    sock: socket.socket
    arena: mmap.mmap
    versions: tuple | None = None  # the parameter versions it holds (None: none yet)
    pending: bool = False


@dataclass
class DecodePool:
    """``workers`` forked processes running ``job`` on ``model``'s current tensors (see the module docstring)."""

    model_ref: weakref.ref
    size: int
    job: Job
    workers: list[_Worker | None] = field(default_factory=list)
    signature: tuple = ()
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.workers = [None] * self.size

    def grow(self, size: int) -> None:
        """At least ``size`` worker slots (a job uses the first ones it needs; each is forked on first use)."""
        if size > self.size:
            self.workers.extend([None] * (size - self.size))
            self.size = size

    # -- use ----------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def claim(self) -> Iterator[bool]:
        """True when this thread may use the pool now (another thread decoding with it: False, go alone)."""
        got = self.lock.acquire(blocking=False)
        try:
            yield got
        finally:
            if got:
                self.lock.release()

    def submit(
        self, index: int, inputs: dict[str, torch.Tensor], meta: dict[str, Any], out_bytes: int
    ) -> bool:
        """Hand worker ``index`` a job; False when it cannot take one (the caller runs it itself)."""
        model = self.model_ref()
        if model is None:
            return False
        state = _state_tensors(model)
        signature = _signature(model, state)
        if signature != self.signature:  # another shape or config: every worker's copy is stale
            self.close()
            self.signature = signature
        versions = tuple((t.data_ptr(), t._version) for t in state)
        need = _nbytes(inputs) + out_bytes + _nbytes(dict(enumerate(state)))
        worker = self.workers[index]
        if worker is not None and worker.pending:  # an answer nobody read: its worker cannot be trusted
            self._stop(index)
            worker = None
        if worker is None or len(worker.arena) < need:
            self._stop(index)
            worker = self._fork(index, model, max(ARENA_BYTES, 2 * need))
            if worker is None:
                return False
        try:
            end = 0
            params = None
            if worker.versions != versions:
                params, end = _place(worker.arena, 0, dict(enumerate(state)))
            placed, end = _place(worker.arena, end, inputs)
            _send(worker.sock, {"params": params, "inputs": placed, "end": end, "meta": meta})
        except OSError as exc:
            log.warning("decode worker %d: cannot send a job (%s); restarting it", index + 1, exc)
            self._stop(index)
            return False
        worker.versions, worker.pending = versions, True
        return True

    def abandon(self) -> None:
        """Kill every worker with a job in flight (the caller will not read its answer, e.g. after Ctrl-C)."""
        for index, worker in enumerate(self.workers):
            if worker is not None and worker.pending:
                self._stop(index)

    def result(self, index: int, timeout: float) -> tuple[dict[str, torch.Tensor], Any] | None:
        """Worker ``index``'s answer to its job (copies), or None after logging why there is none."""
        worker = self.workers[index]
        if worker is None or not worker.pending:
            return None
        worker.pending = False
        try:
            ready, _, _ = select.select([worker.sock], [], [], max(0.0, timeout))
            if not ready:
                raise TimeoutError(f"no answer within {timeout:.0f} s")
            status, placed, result = _recv(worker.sock)
        except (OSError, EOFError, TimeoutError, ValueError, pickle.UnpicklingError) as exc:
            log.warning("decode worker %d failed (%s); its part runs in the caller", index + 1, exc)
            self._stop(index)
            return None
        if status != "ok":
            log.warning("decode worker %d: %s; its part runs in the caller", index + 1, placed)
            return None
        return {name: t.clone() for name, t in _views(worker.arena, placed).items()}, result

    # -- processes -----------------------------------------------------------------------------------

    def _fork(self, index: int, model: torch.nn.Module, arena_bytes: int) -> _Worker | None:
        arena = mmap.mmap(-1, arena_bytes)  # MAP_SHARED | MAP_ANONYMOUS: the child sees the same pages
        mine, theirs = socket.socketpair()
        parent = os.getpid()
        try:
            with warnings.catch_warnings():  # 3.12+: "this process is multi-threaded, fork() may deadlock the
                warnings.simplefilter("ignore", DeprecationWarning)  # child": it runs no code of the others
                pid = os.fork()
        except OSError as exc:
            log.warning("decode worker %d: fork failed (%s); decoding in one process", index + 1, exc)
            mine.close()
            theirs.close()
            arena.close()
            return None
        if pid == 0:  # the worker
            try:
                _detach(theirs.fileno())
            finally:
                _worker_main(theirs, arena, model, self.job, parent)
        theirs.close()
        worker = _Worker(pid, mine, arena)
        self.workers[index] = worker
        return worker

    def _stop(self, index: int, graceful: bool = False) -> None:
        """Stop worker ``index`` (``stop`` message and a short wait when graceful, else SIGKILL) and reap it."""
        worker, self.workers[index] = self.workers[index], None
        if worker is None:
            return
        _stop_worker(worker, graceful)

    def close(self) -> None:
        """Stop every worker (they exit on ``stop``; killed if they do not within a second)."""
        for index in range(self.size):
            self._stop(index, graceful=True)


def _stop_worker(worker: _Worker, graceful: bool) -> None:
    if graceful and not worker.pending:
        with contextlib.suppress(OSError):
            _send(worker.sock, "stop")
        with contextlib.suppress(OSError, ValueError):
            select.select([worker.sock], [], [], 1.0)  # EOF once it has exited
    with contextlib.suppress(ProcessLookupError):
        if not _reaped(worker.pid):
            os.kill(worker.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(worker.pid, 0)
    worker.sock.close()
    with contextlib.suppress(BufferError):  # a caller's view still open: the mapping goes with it
        worker.arena.close()


def _reaped(pid: int) -> bool:
    """True when ``pid`` has exited and is reaped now."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return bool(done)


def _signature(model: torch.nn.Module, state: list[torch.Tensor]) -> tuple:
    """What a worker's copy must share with the model beyond tensor values: shapes, dtypes, config."""
    config = getattr(model, "config", None)
    to_json = getattr(config, "to_json_string", None)
    text = to_json(use_diff=False) if to_json is not None else repr(config)
    return (tuple((tuple(t.shape), t.dtype) for t in state), type(model), text)


# ------------------------------------------------------------------------------------------------
# One pool per model
# ------------------------------------------------------------------------------------------------

_POOLS: dict[int, DecodePool] = {}
_POOLS_LOCK = threading.Lock()


def _live_pools() -> list[DecodePool]:
    with _POOLS_LOCK:
        return list(_POOLS.values())


def pool_for(model: torch.nn.Module, workers: int, job: Job) -> DecodePool | None:
    """The pool running ``job`` for ``model``, with at least ``workers`` worker slots (made on first use; None
    without fork)."""
    if workers < 1 or not hasattr(os, "fork"):
        return None
    key = id(model)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is not None and pool.model_ref() is model and pool.job is job:
            pool.grow(workers)  # calls of other sizes share one pool; workers are forked on first use
            return pool
    if pool is not None:
        pool.close()
    pool = DecodePool(weakref.ref(model), workers, job)
    with _POOLS_LOCK:
        _POOLS[key] = pool
    weakref.finalize(model, _drop, key, pool)
    return pool


def _drop(key: int, pool: DecodePool) -> None:
    """The model is gone: stop its workers."""
    with _POOLS_LOCK:
        if _POOLS.get(key) is pool:
            del _POOLS[key]
    pool.close()


def worker_pids() -> list[int]:
    """The pids of every live worker (benchmarks add their CPU time)."""
    return [w.pid for pool in _live_pools() for w in pool.workers if w is not None]


def close_all() -> None:
    """Stop every worker of every pool (at exit; tests)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.close()


def _after_fork_in_child() -> None:
    """A process forked from the caller (a worker or anything else) owns no pool: forget them, touch nothing."""
    global _POOLS_LOCK
    _POOLS_LOCK = threading.Lock()
    _POOLS.clear()


atexit.register(close_all)
os.register_at_fork(after_in_child=_after_fork_in_child)
