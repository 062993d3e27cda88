"""ProcessExecutor: run UNTRUSTED programs and call expressions in a pool of isolated, warm workers.

What it does: ``ProcessExecutor.run(program, calls)`` returns one :class:`CallOutcome` per call
expression, in order; ``run_many`` spreads programs over ``workers`` warm worker processes (fresh
interpreters running ``sandbox/child.py``) that fork one child per program. Values come back as
encoded plain data and are decoded here, in the trusted parent; callers compare them with
``codea1_core.values.values_equal`` (docs/method.md D2). Infrastructure failures are retried
``infra_retries`` times, then reported as ``infra_error`` — never as a failed call (D4).

This is a guard for generated code, not a security boundary (like evalplus/human-eval). As root on
Linux it provides, per program:
  * a fresh child process forked from a clean zygote: each worker forks one zygote before its first
    job, and every child is forked from it (ahead of time, so the fork is off the critical path) and
    reads only its own job from its own pipe. So no frame,
    object (``gc.get_objects``) or memory byte a child can reach holds another program's source, calls,
    results or output (the worker, which holds those, is never the parent of a child);
  * rlimits AS (``memory_mb``), CPU, FSIZE, NOFILE, CORE=0 and, with the uid drop, NPROC, plus a
    cgroup per worker holding one program tree at a time with ``memory.max`` = ``memory_mb`` and
    ``pids.max`` = ``max_processes`` for the WHOLE tree (v2 when its memory and pids controllers can be
    delegated, else the v1 memory and pids hierarchies; ``ex.isolation["cgroup"]`` says which, or
    "unavailable (...)": then only the per-process rlimits hold). A program killed by the cgroup's OOM
    killer gets ``memory`` for the calls it did not report;
  * a PID namespace per worker whose init is the zygote, with its own /proc: a program sees only the
    zygote and its own processes (no other process's ``comm``, ``environ`` or ``net``; ``/proc/*/net``
    shows only the sandbox's network namespace), and after the program the zygote kills the whole tree
    at once (``kill(-1)`` inside the namespace) and reaps it;
  * a dedicated random unprivileged uid/gid per worker (not in /etc/passwd), no-new-privs, so it
    cannot signal the parent, the worker or the zygote, read root-only files, or fork-bomb beyond NPROC;
    each isolated call's process runs under a second uid of the worker (its call uid, no capabilities),
    so by the kernel's own rules it cannot signal, ``prlimit``, renice or re-pin the process reporting
    the calls, nor hold the process slots that process needs (its NPROC is below the program's); what a
    call leaves running is killed (as the call uid) before the next call;
  * no network: each worker lives in its own network namespace (only a down loopback);
  * no IPC: each worker has its own IPC namespace in which SysV shared memory, semaphores, message
    queues and POSIX message queues are disabled (limits 0), so nothing can be left for the next
    program or the host (fallback where those limits cannot be set: a fresh IPC namespace per child;
    ``ex.isolation["ipc"]`` says which);
  * a mount namespace per worker in which EVERY host mount except /proc and /sys is read-only (so no
    world-writable host directory can be written, whatever the host has); /tmp, /var/tmp, /dev/shm,
    /run/lock (= /var/lock) and /dev/mqueue where present are private size-limited tmpfs, replaced by
    fresh ones after every program that used them (no walk over what the program built: no tree shape
    can make the clean-up fail), mounted ``noatime`` with their root's times reset after every program,
    so no inode counter or timestamp reaches the next program; the project checkout, the data folder and
    $HOME are covered by empty read-only tmpfs (only the Python installation is bound back, read-only);
  * /dev is a read-only tmpfs holding only null, zero, full, random, urandom (no host pty pool, no
    /dev/log, kmsg or tty), and /run (= /var/run, where host daemons keep their sockets) is covered by
    a read-only tmpfs holding only the private lock directories (``ex.isolation["dev"]``, ``["run"]``);
  * deny by default (``sandbox/syscall_filter.py``, ``sandbox/landlock.py``; ``ex.isolation`` reports
    each layer, or why it is off): every child runs under a seccomp-bpf allow-list its zygote loaded
    once (default ``EPERM``: the program gets a ``PermissionError``, the worker lives; keyrings, ptrace,
    the mount family, namespace creation, bpf, perf, userfaultfd, io_uring, inotify/fanotify, file
    locks, ``socket``/``connect`` and more are denied; the zygote's few set-up calls only with its own
    arguments, useless without the privileges the child dropped; the zygote's one io_uring, which only
    pins pages for ``fork`` to copy, ``sandbox/pinning.py``, is made before its filter loads and closed in
    every child before the program runs) and joins a Landlock domain (kernel
    permitting: read-only interpreter and
    system directories, read-write private tmp, nothing else, not /sys; TCP, abstract Unix sockets and
    signals scoped); the worker joins a fresh anonymous session keyring at start (the trusted parent's
    is never possessed), which its children share but cannot use (every keyring call is denied; without
    the filter each child joins its own before the uid drop); the worker cgroup's memory
    high-water mark is reset after every program (v1; v2's is unreadable under Landlock);
  * by default (``ExecLimits.isolate_calls``; ``False``, the shared namespace, is the weaker opt-in
    mode: ``sandbox.isolate_calls: false``) each call that brings code of its own (anything but the
    program's own function called on constants) runs in its own forked copy of the defined program,
    without the result channel, under the worker's call uid and in a Landlock scope of its own: no call
    can change the value of another (the reference run's expected values, the
    candidates' verdicts, the Mistake Book's replay), and such a tampering call fails only itself (the
    program's own code, e.g. a memo, still carries state from call to call, as in a script);
  * a scrubbed environment, stdin on a /dev/null each child opens itself (no open file description is
    shared with the zygote or the next program), stdout/stderr captured and truncated;
  * per-call time limits enforced twice: SIGALRM in the child and a wall clock in the worker, which
    kills the child and restarts the program at the next call, so one hang fails only its call (D3);
    the program's top level gets ``ExecLimits.define_timeout_s`` (default: the per-call limit);
  * bounded results: one call's encoding is capped by ``max_value_bytes`` and all calls of a program
    together by ``max_result_bytes`` (checked by the harness and again by the worker; past it a call
    is ``unsupported_output`` "result too large"); the parent decodes with ``sandbox/decoding.py``,
    linear in the input (sets/dicts with more than 32 keys sharing one hash are ``unsupported_output``)
    and charging every object built its real CPython size to a per-program budget (4 x
    ``max_result_bytes``, 1 GiB by default) and its decode time to ``max_decode_s`` of CPU, so the
    parent's decoded results of a batch take at most ``jobs x 4 x max_result_bytes`` whatever programs
    return (the default cap, 256 MiB, keeps every EvalPlus reference chunk whole);
  * a worker whose machinery fails (fork, mount, its zygote gone) answers ``infra``: the parent replaces
    it and retries the job (up to ``infra_retries``), so a broken worker never stays in the pool; a
    worker that dies or stops answering is replaced the same way;
  * a program's (or call's) process killed by a signal from outside the sandbox is infrastructure, never
    a score (the rule below); every such event and every worker failure is counted
    (``stats["infra_events"]``, ``stats["retries"]``; a step's ``sandbox/infra_events`` and
    ``sandbox/retries``) and logged in one line (logger ``sandbox.executor``);
  * reproducibility: every worker runs with PYTHONHASHSEED=0, so set/dict orders of a program are the
    same in every worker (a candidate matching the reference never fails by chance).

The program runs as module ``program`` (``if __name__ == "__main__":`` blocks do not run); each call is an
expression evaluated in its namespace, in order: with ``isolate_calls`` each in a fresh copy of the
namespace as the definition left it, else in the one namespace (calls see globals changed by earlier ones).

Statuses: ok / error ("Type: message") / timeout / memory (MemoryError under RLIMIT_AS, or a cgroup OOM
kill) / unsupported_output (not plain data, see ``codea1_core.values``, or too large, or hash-flooded) /
program_error (syntax error, top-level exception, exit or time-out: every call) / infra_error (our
machinery failed after retries). A child that dies mid-program (``os._exit``, a signal, a closed result
channel) fails the calls it did not report with ``error`` "ChildExited: ..."; that is the program's
doing, not infrastructure, unless the signal came from outside.

Killed from outside. ``waitpid`` does not say who sent a signal, so a death is judged by what the
sandbox knows (``sandbox/supervision.py``, ``_exit_reason``, ``_judge_call_deaths``): the program's own
failure, scored as always, when the worker or harness killed it (wall clock, output cap: never
reported as a signal death), the worker cgroup's OOM killer counted it (``memory``), the CPU rlimit
sent SIGXCPU, or the signal is a fault the process raised by what it ran (SIGSEGV, SIGABRT, SIGBUS,
SIGFPE, SIGSYS, ...). A death by SIGKILL, SIGTERM, SIGINT or SIGHUP otherwise (an operator, a shutdown,
the host's OOM killer, or the program itself: indistinguishable) runs the job again, up to
``infra_retries`` times, as a crashed worker's: a kill from outside does not strike every attempt, a
program killing itself does, and then gets the verdict it would have had without the retries. Where
the kernel's OOM count grew and the worker cgroup's did not (``/proc/vmstat``: the host's OOM killer),
the last attempt is ``infra_error`` instead (never scored).

Verdict integrity. Each result travels as one frame on a private pipe moved to a random descriptor above
RLIMIT_NOFILE (so it cannot be ``dup2``-ed over), carrying a per-run random token; the worker accepts
frames only in order (one per call index, after a "set-up done" and a "defined" frame), and any
unauthenticated, unframeable, duplicated or out-of-order frame marks EVERY call of the program as
``error`` (a forgery attempt never pays; only the program's own process holds the channel). A call can
spoil only its own result: every value an isolated call's process reports to the harness (status code,
size, duration) is checked before it is framed, and a call frame whose status code or size is out of
range fails that call alone, with the reason (``SandboxViolation: ...``). Printing markers,
``sys.exit``/``os._exit``, closing stdout, killing the parent, custom ``__eq__`` (subclasses are not
plain data), patching builtins or ``sys.modules`` after start-up, signal handlers that swallow SIGALRM,
threads left running, and reading what earlier programs left in memory can only turn results into
failures, never into results the program did not compute.

NOT covered (honestly): candidate code runs in the same process as the harness, so a program that
deliberately introspects the interpreter (``gc.get_objects``, frame locals, ``/proc/self/mem``,
``sys.settrace``) can read ITS OWN token and write well-formed frames claiming values of its choosing
for its own later calls (with ``isolate_calls``, the default, only its top level can: a call's process
has no channel; in the shared namespace any call can); no in-process scheme prevents that.
Also not covered: kernel exploits and bugs of the allowed syscalls; timing channels between programs
(CPU, caches, /proc counters); with Landlock off (kernel < 5.13, or a container hiding it) reading /sys
and, under cgroup v2, the previous program's ``memory.peak``; the time of the last clean-up, visible in a
private tmpfs root's change time; reading world-readable host files outside the hidden paths (/etc, /usr);
without a PID namespace (kernel or container refusing it: ``ex.isolation["pid"]``) /proc of other
processes; writing /proc or /sys files a non-root uid may
write (few; they are left writable because the worker needs its cgroup files); CPU contention with
other workers (no cpu cgroup); memory beyond ``memory_mb`` where no cgroup is writable (then only
RLIMIT_AS per process holds); SysV IPC between processes of one program (allowed only in the fallback);
parent memory of a batch grows with the number of programs (the bound is per program); a kill from
outside that strikes every attempt of a job (scored as the program's own failure, unless the kernel
counted a host OOM kill), and a host-OOM verdict caused by an OOM kill in another worker's cgroup at
the moment a program kills itself (then the job is ``infra_error``: masked, not scored); without root
there is no uid drop, no namespaces and no cgroup (``network_isolation="auto"`` records this in
``ex.isolation``; ``"require"`` refuses to start); bubblewrap is not used.

Cost: per program, one fork of the zygote, a share of one job message (small jobs travel to a worker
in batches, each job still in its own child and reported alone), one reap round trip; every step that is
the same for all children is done once by the zygote (``sandbox/zygote.py``, ``_prepare_zygote``),
because a forked child pays a copy-on-write page fault for every page it writes (and the zygote, whose
pages each fork write-protects, one for every page its loop writes): so the child's set-up and the
zygote's loop are closures with their names bound once, libraries are bound at start-up
(``LD_BIND_NOW``), and the worker takes small frames arriving together in one wake-up
(``_supervise``); every page of the zygote's heap is copied by each fork and torn down by each child's
exit, so the worker imports no module it does not need (it starts without ``site``: ``_BOOT``).
``tests/sandbox/test_sandbox_cost.py`` counts the faults; ``bench/sandbox_bench.py`` the CPU.

Run its tests: ``pytest tests/sandbox/test_sandbox.py tests/sandbox/test_sandbox_hostile.py
tests/sandbox/test_sandbox_cost.py
tests/sandbox/test_sandbox_deny.py tests/sandbox/test_sandbox_allowlist.py``; the benchmark: ``python
bench/sandbox_bench.py``
(``--deny-compare``: CPU per program with the deny-by-default layers and without).
"""

from __future__ import annotations

import logging
import marshal
import os
import secrets
import select
import selectors
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from codea1_core.types import CallOutcome
from sandbox.cgroups import remove_cgroups
from sandbox.child import write_msg
from sandbox.credentials import sweep_uid_from_proc
from sandbox.decoding import outcomes_of
from sandbox.errors import SandboxUnavailable
from sandbox.limits import ExecLimits
from sandbox.mounts import default_hide_paths, python_keep_paths

log = logging.getLogger(__name__)
# The worker starts without ``site`` (-S) and does what site would do for it but run the ``.pth`` files of
# site-packages (editable installs' import hooks, namespace packages, setuptools' distutils shim: modules
# no program needs, 2 MB of the interpreter's heap that every fork copies and every child tears down):
# the venv's prefixes, its site-packages on ``sys.path``, the ``exit``/``quit``/``help``/... builtins.
_BOOT = (
    "import sys; root, sys.prefix, sys.exec_prefix, *site_dirs = sys.argv[1:]; sys.path.insert(0, root);"
    " sys.path += site_dirs; import site; site.setquit(); site.setcopyright(); site.sethelper();"
    " from sandbox.child import worker_main; worker_main()"
)
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
_START_TIMEOUT_S = 60.0


def _site_args() -> list[str]:
    """``sys.prefix``, ``sys.exec_prefix`` and the site-packages directories a worker started with ``site``
    would have (``-s``: no user site), for ``_BOOT``."""
    import site

    return [sys.prefix, sys.exec_prefix, *site.getsitepackages()]


class _Worker:
    """One warm worker process and its protocol pipes (parent side)."""

    def __init__(self, settings: dict) -> None:
        self.uid = settings["uid"]
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-S", "-s", "-P", "-c", _BOOT, _REPO_ROOT, *_site_args()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            cwd="/",
            # A fixed hash seed: the same program gives the same set/dict orders in every worker, so a
            # candidate matching the reference never fails by chance (and runs are reproducible).
            # LD_BIND_NOW: the worker resolves every library symbol once at start-up, instead of each
            # forked child resolving (and writing into the GOT: a copy-on-write fault) every libc
            # function its path calls first. The zygote clears the environment, so children never see it.
            env={
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "LANG": "C.UTF-8",
                "PYTHONHASHSEED": "0",
                "LD_BIND_NOW": "1",
            },
            start_new_session=True,
        )
        self.wfd, self.rfd = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        self.buf = bytearray()
        # Reads land here first: ``os.read(fd, n)`` allocates ``n`` bytes per call, which glibc maps and
        # unmaps for every result (mmap, mremap, munmap) once ``n`` is past its mmap threshold. A pipe
        # holds 64 KiB by default, so no read brings more.
        self.scratch = bytearray(1 << 16)
        try:
            write_msg(self.wfd, settings)
            reply = self._read_blocking(_START_TIMEOUT_S)
        except (OSError, ValueError, EOFError) as exc:
            reply = ("fail", f"{type(exc).__name__}: {exc}; {self.stderr_tail()}")
        if reply is None or reply[0] != "hello":
            self.kill()
            detail = reply[1] if reply else f"worker exited at start-up: {self.stderr_tail()}"
            raise SandboxUnavailable(f"sandbox worker could not start: {detail}")
        self.isolation: dict = reply[1]
        self.cgroup_dirs: list[str] = self.isolation.pop("cgroup_dirs", [])

    def _read_blocking(self, timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            msg = self.poll_message()
            if msg is not None:
                return msg
            if self.buf is None or time.monotonic() > deadline:
                return None
            sel = selectors.DefaultSelector()
            sel.register(self.rfd, selectors.EVENT_READ)
            ready = sel.select(max(0.0, deadline - time.monotonic()))
            sel.close()
            if ready:
                self.feed()

    def feed(self) -> None:
        """Read what is available; sets ``buf`` to None on EOF (the worker died)."""
        try:
            n = os.readv(self.rfd, [self.scratch])
        except BlockingIOError:
            return
        except OSError:
            n = 0
        if not n:
            self.buf = None
        else:
            with memoryview(self.scratch) as view:
                self.buf += view[:n]

    def poll_message(self) -> Any:
        if self.buf is None or len(self.buf) < 8:
            return None
        size = int.from_bytes(self.buf[:8], "big")
        if len(self.buf) < 8 + size:
            return None
        with memoryview(self.buf) as view:
            msg = marshal.loads(view[8 : 8 + size])
        del self.buf[: 8 + size]
        return msg

    def send(self, msg: Any) -> None:
        write_msg(self.wfd, msg)

    def stderr_tail(self) -> str:
        try:
            self.log.seek(0)
            return self.log.read()[-2000:].decode("utf-8", "replace").strip() or "(no stderr)"
        except OSError:
            return "(stderr unavailable)"

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        if self.uid is not None:
            sweep_uid_from_proc(self.uid)  # descendants that escaped the worker's clean-up
        remove_cgroups(getattr(self, "cgroup_dirs", []))
        self.log.close()

    def stop(self) -> None:
        try:
            self.send(("exit",))
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


class ProcessExecutor:
    """Fork-server pool that runs untrusted programs; see the module docstring for guarantees.

    Args:
        workers: warm worker processes (programs run in parallel across them).
        limits: per-call / per-program limits (default ``ExecLimits()``: each call with code of its own
            isolated; with no arguments the pool runs in the strictest mode the project uses).
        network_isolation: ``auto`` (best available, see :attr:`isolation`), ``require`` (raise
            :class:`SandboxUnavailable` without network + mount namespaces) or ``off`` (no namespaces,
            nothing hidden; for benchmarks and debugging).
        drop_privileges: when running as root, run children as a dedicated unprivileged uid per worker.
        infra_retries: retries of a program whose worker failed before reporting ``infra_error``.
        hide_paths: directories hidden from children (default: project, data folder, $HOME).
        deny: the deny-by-default layers (seccomp allow-list, Landlock, fresh keyrings): ``on``;
            ``off`` (the benchmark's baseline); ``kill`` (a denied syscall kills the child: how the
            allow-list is measured, ``tests/sandbox/test_sandbox_allowlist.py``).
    """

    def __init__(
        self,
        workers: int = 2,
        limits: ExecLimits | None = None,
        network_isolation: str = "auto",
        drop_privileges: bool = True,
        infra_retries: int = 2,
        hide_paths: list[str] | None = None,
        deny: str = "on",
    ) -> None:
        if deny not in ("on", "off", "kill"):
            raise ValueError(f"deny: expected on, off or kill, got {deny!r}")
        if network_isolation not in ("auto", "require", "off"):
            raise ValueError(f"network_isolation: expected auto, require or off, got {network_isolation!r}")
        if workers < 1 or infra_retries < 0:
            raise ValueError(f"workers must be >= 1 and infra_retries >= 0, got {workers}, {infra_retries}")
        if not sys.platform.startswith("linux"):
            raise SandboxUnavailable(
                f"the process sandbox needs Linux (this is {sys.platform}); use backend=docker"
            )
        self.limits = limits or ExecLimits()
        self.infra_retries = infra_retries
        self._drop = drop_privileges and os.geteuid() == 0
        self._settings = {
            "mode": network_isolation,
            "hide_paths": default_hide_paths() if hide_paths is None else list(hide_paths),
            "keep_paths": python_keep_paths(),
            "deny": deny,
            "limits": {k: getattr(self.limits, k) for k in self.limits.__dataclass_fields__},
        }
        self.stats: dict[str, float] = dict.fromkeys(
            ("programs", "calls", "timeouts", "infra_errors", "infra_events", "retries", "seconds"), 0
        )
        """Counters since start: ``infra_errors`` calls reported ``infra_error``; ``infra_events`` worker
        failures and programs killed from outside (each logged); ``retries`` jobs run again for them."""
        self._lock = threading.Lock()
        self.last_outputs: list[bytes] = []
        """Captured stdout+stderr (truncated) of each program of the last ``run``/``run_many``."""
        self._workers: list[_Worker] = []
        try:
            for _ in range(workers):
                self._workers.append(self._start_worker())
        except BaseException:
            self.close()
            raise
        self.isolation: dict = dict(self._workers[0].isolation)
        self.isolation["uid"] = "dedicated per worker" if self._drop else "not dropped"
        self.isolation["rlimits"] = "AS CPU FSIZE NOFILE CORE" + (" NPROC" if self._drop else "")
        self.isolation["children"] = "forked from a clean zygote (no earlier program's memory)"
        self.isolation["results"] = (
            f"<= {self.limits.max_result_bytes} encoded bytes per program; linear decode (hash-flood guard)"
        )

    def _start_worker(self) -> _Worker:
        uid = 100_000 + secrets.randbelow(2**30) if self._drop else None
        try:
            return _Worker({**self._settings, "uid": uid})
        except SandboxUnavailable as exc:
            if self._settings["mode"] == "require":
                raise SandboxUnavailable(
                    f"{exc} (sandbox.network_isolation=require needs root for network and mount namespaces; "
                    "set it to auto or off, or use backend=docker)"
                ) from None
            raise

    # ---------------------------------------------------------------------------------------------

    def run(self, program: str, calls: list[str]) -> list[CallOutcome]:
        """Run ``program`` then evaluate each call expression in its namespace; one outcome per call."""
        return self.run_many([(program, calls)])[0]

    def run_many(self, jobs: list[tuple[str, list[str]]]) -> list[list[CallOutcome]]:
        """Run many programs across the workers; results in the order of ``jobs``."""
        with self._lock:
            if not self._workers:
                raise RuntimeError("ProcessExecutor is closed")
            t0 = time.monotonic()
            results = self._dispatch([(str(p), [str(c) for c in calls]) for p, calls in jobs])
            self.stats["seconds"] += time.monotonic() - t0
            self.stats["programs"] += len(jobs)
            for outcomes in results:
                self.stats["calls"] += len(outcomes)
                for o in outcomes:
                    self.stats["timeouts"] += o.status == "timeout"
                    self.stats["infra_errors"] += o.status == "infra_error"
            return results

    def _dispatch(self, jobs: list[tuple[str, list[str]]]) -> list[list[CallOutcome]]:
        """Keep every worker busy with batches of jobs: one being run and at most one more unread in its
        pipe (small, :data:`_BATCH_BYTES`, so writing it can never block on a full pipe while the worker
        writes its results). A batch is one message; the worker runs its jobs in order, each in its own
        fresh child, and reports each as it ends, so the job at the head of a worker's queue is the one
        it runs (a dead worker's retry is charged to that job alone)."""
        results: list[list[CallOutcome] | None] = [[] if not calls else None for _, calls in jobs]
        self.last_outputs = [b""] * len(jobs)
        pending = deque((i, 0) for i, (_, calls) in enumerate(jobs) if calls)
        # per worker: (job, attempt, deadline, batch number)
        inflight: list[deque] = [deque() for _ in self._workers]
        watchdog_s = self.limits.program_timeout_s + 30.0
        batch_no = 0
        while pending or any(inflight):
            for w, queue in enumerate(inflight):
                # a batch more when the worker has read every batch sent (its queue holds one batch)
                if not pending or (queue and queue[0][3] != queue[-1][3]):
                    continue
                # Batches small enough for the other workers to share the tail of the run.
                most = max(1, min(_BATCH_JOBS, len(pending) // (2 * len(self._workers))))
                batch, size, now = [], 0, time.monotonic()
                while pending and len(batch) < most:
                    j = pending[0][0]
                    size += _job_bytes(jobs[j])
                    if size >= _BATCH_BYTES and (batch or queue):  # (alone in an idle worker: any size)
                        break
                    j, attempt = pending.popleft()
                    queue.append((j, attempt, now + watchdog_s * (len(queue) + 1), batch_no))
                    batch.append((j, jobs[j][0], jobs[j][1]))
                if not batch:
                    continue
                batch_no += 1
                try:
                    self._workers[w].send(("jobs", batch))
                except OSError as exc:
                    self._fail_worker(w, queue, f"worker pipe broken: {exc}", results, pending, jobs)
            busy = [w for w, queue in enumerate(inflight) if queue]
            poller = select.poll()
            for w in busy:
                poller.register(self._workers[w].rfd, select.POLLIN)
            wait_s = min(inflight[w][0][2] for w in busy) - time.monotonic()
            ready = {fd for fd, _ in poller.poll(max(0, int(wait_s * 1000) + 1))}
            for w in busy:
                worker, queue = self._workers[w], inflight[w]
                if worker.rfd in ready:
                    worker.feed()
                while queue and (msg := worker.poll_message()) is not None:
                    j, attempt = queue[0][:2]
                    if msg[0] != "result" or msg[1] != j:  # our machinery failed in that worker (fork,
                        # mount, ...): it may stay broken, so it is replaced and the job retried
                        self._fail_worker(w, queue, f"worker failed: {msg[2]}", results, pending, jobs)
                        break
                    queue.popleft()
                    killed = msg[4]  # (why, host_oom) of a death by a signal from outside, if any
                    if killed and (attempt < self.infra_retries or killed[1]):
                        why = f"{killed[0]}, a signal the sandbox cannot tell from one sent from outside"
                        self._retry_or_fail(j, attempt, why, results, pending, jobs)
                        continue
                    if killed:
                        self._log(f"{killed[0]} on every attempt: the program's own failure", j, attempt)
                    results[j] = outcomes_of(msg[2], self.limits)
                    self.last_outputs[j] = msg[3]
                if queue and (worker.buf is None or time.monotonic() > queue[0][2]):
                    why = (
                        f"worker died: {worker.stderr_tail()}"
                        if worker.buf is None
                        else "worker watchdog expired"
                    )
                    self._fail_worker(w, queue, why, results, pending, jobs)
        return results  # type: ignore[return-value]

    def _fail_worker(self, w: int, queue: deque, why: str, results, pending, jobs) -> None:
        """Replace worker ``w``; its running job is retried (or reported), jobs queued behind it re-queued."""
        self._workers[w].kill()
        self._workers[w] = self._start_worker()
        (j, attempt, *_), rest = queue[0], list(queue)[1:]
        queue.clear()
        for job, job_attempt, *_ in reversed(rest):
            pending.appendleft((job, job_attempt))
        self._retry_or_fail(j, attempt, why, results, pending, jobs)

    def _retry_or_fail(self, j: int, attempt: int, why: str, results, pending, jobs) -> None:
        """One infrastructure event (counted, one log line): job ``j`` runs again, or past its retries is
        ``infra_error`` on every call (never scored)."""
        self.stats["infra_events"] += 1
        if attempt < self.infra_retries:
            self.stats["retries"] += 1
            pending.appendleft((j, attempt + 1))
            self._log(f"{why}; it runs again (retry {attempt + 1} of {self.infra_retries})", j, attempt)
        else:
            results[j] = [CallOutcome("infra_error", None, f"InfraError: {why}"[:2000])] * len(jobs[j][1])
            self._log(f"{why}; infra_error after {attempt} retries (not scored)", j, attempt)

    def _log(self, what: str, j: int, attempt: int) -> None:
        line = " | ".join(part.strip() for part in what.splitlines() if part.strip())
        log.warning("sandbox job %d (attempt %d): %s", j, attempt + 1, line[:500])

    # ---------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the workers and kill anything left of their children."""
        workers, self._workers = self._workers, []
        for worker in workers:
            worker.stop()

    def __enter__(self) -> ProcessExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


_BATCH_JOBS = 8  # jobs per message to a worker, at most
_BATCH_BYTES = 32768  # a batch sent behind another is smaller (upper bound of its marshal size, _job_bytes)


def _job_bytes(job: tuple[str, list[str]]) -> int:
    return len(job[0]) * 4 + sum(len(c) * 4 + 8 for c in job[1]) + 256  # upper bound of the marshal size
