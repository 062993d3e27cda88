"""A step's sandbox work overlapped with the Test LLM's generation (``rollout.overlap_execution``).

What it does: :class:`OverlappedExecution` receives the test rollout chunk by chunk (``Policy.generate``'s
``on_chunk``: HF's chunks of ``rollout.batch_size`` prompts in order, vLLM's prompts as each finishes); as soon as
every suite of a problem is in, a background thread parses, gates and plans that problem's suites and runs its
reference and candidate jobs in the sandbox, while later problems still generate.
The ``gate_tests`` and ``execute`` tasks of such a step (:func:`gate_tests_overlapped`,
:func:`execute_overlapped`) wait for that thread and return exactly what ``tasks.rollout.gate_tests`` and
``tasks.execute.execute`` return for the same rollout: each problem is planned, and each job runs, exactly as
in the serial step; only the moment differs. So the metrics and rewards do not depend on the switch:

* sampling: each HF generation chunk is seeded by its first prompt's index (``Policy.generate``), each vLLM
  request by its own index, so the rollout is the same whether it is consumed as it comes or at the end;
* the gate's verdicts are per row; its rejected-share limit (``tests.max_rejected_frac``) and the sandbox's two
  aborts (infrastructure share, reference failures) are decided once, over the whole step, as in the serial one;
* the outcome matrices are assembled per problem from its own reference and candidate outcomes.

The step's timeline (MLflow, ``timings.csv``): ``time/rollout_tests_s`` is the generation, ``time/gate_tests_s``
and ``time/execute_s`` are what the step still waited for after it; ``time/overlap/prepare_s`` and
``time/overlap/sandbox_s`` the background's busy time (parse + gate + plan; the sandbox), and ``time/overlap_s``
the part of that busy time that ran during the generation: the step is that much shorter than its phases in
series.
What it does not: overlap across steps (the next rollout needs this step's update), or split HF generation into
more chunks than ``rollout.batch_size`` makes (a chunk is a seeded unit: other chunks would sample otherwise).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from codea1_core.config import Config
from codea1_core.types import Problem
from tasks.execute import (
    check_infra,
    event_counts,
    outcome_metrics,
    reference_failed,
    run_with_retry,
    stop_on_reference_failures,
)

_DONE = object()


@dataclasses.dataclass
class _Problem:
    """What the background thread produced for one problem."""

    suites: list[list[Any]]
    plan: Any = None
    ref_out: list[Any] = dataclasses.field(default_factory=list)
    cand_out: list[list[Any]] = dataclasses.field(default_factory=list)


class OverlappedExecution:
    """One step's gate, plan and sandbox execution, run per problem while the test rollout goes on.

    ``take`` is the rollout's ``on_chunk`` (main thread); the background thread does the rest, a batch of finished
    problems at a time (those that finished while it worked on the previous batch).
    Use as a context manager (:func:`overlapped`): leaving it stops the thread after its current batch.
    """

    def __init__(
        self,
        executor: Any,
        problems: list[Problem],
        codes: list[list[str]],
        replay: list[list[Any]],
        cfg: Config,
        iteration: int,
    ) -> None:
        self.executor, self.problems, self.codes, self.replay = executor, problems, codes, replay
        self.cfg, self.iteration = cfg, iteration
        # the rollout's prompts: problem-major, one per (problem, code)
        self._problem_of = [b for b, row in enumerate(codes) for _ in row]
        self._first = [0] * len(codes)
        for i in reversed(range(len(self._problem_of))):
            self._first[self._problem_of[i]] = i
        self._rows: list[Any] = [None] * len(self._problem_of)
        self._missing = [len(row) for row in codes]  # per problem: prompts not in yet
        self._handed = 0  # problems handed to the thread
        self._prepared = 0  # problems the thread has gated and planned
        self._results: list[_Problem | None] = [None] * len(problems)
        self._gate_rows = 0
        self._gate_counts: dict[str, int] = {}
        self._gated = threading.Event()
        self._executed = threading.Event()
        self._error: BaseException | None = None
        self._cancel = threading.Event()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._busy: list[tuple[str, float, float]] = []  # (phase, start, end) of the thread's work
        self._generation: tuple[float, float] | None = None
        self._events_before = event_counts(executor)
        self._thread = threading.Thread(target=self._work, name=f"codea1-overlap-it{iteration}", daemon=True)
        self._thread.start()

    # -- the rollout's side (main thread) ---------------------------------------------------------------------
    def take(self, start: int, rows: list[list[Any]]) -> None:
        """``on_chunk``: the completions of prompts ``start..start+len(rows)``, in any order across calls (vLLM
        hands over each prompt as it finishes); problems whose every prompt is in go to the background thread."""
        ready = []
        for i, row in enumerate(rows, start):
            if self._rows[i] is not None:
                raise RuntimeError(f"test rollout: prompt {i} delivered twice")
            self._rows[i] = row
            b = self._problem_of[i]
            self._missing[b] -= 1
            if not self._missing[b]:
                ready.append(b)
        if ready:
            self._handed += len(ready)
            self._queue.put(ready)

    def generation_done(self, started: float) -> None:
        """The rollout ended: its window (for ``time/overlap_s``); nothing more will come."""
        self._generation = (started, time.perf_counter())
        if self._handed != len(self.problems):
            self._fail(RuntimeError(f"test rollout delivered {self._handed}/{len(self.problems)} problems"))
        self._queue.put(_DONE)

    def _completions(self, b: int) -> list[Any]:
        """Problem ``b``'s rows: one per code, each the N suites written for it."""
        return self._rows[self._first[b] : self._first[b] + len(self.codes[b])]

    # -- the background thread --------------------------------------------------------------------------------
    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        self._gated.set()
        self._executed.set()

    def _timed(self, phase: str, fn: Any, *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self._busy.append((phase, t0, time.perf_counter()))

    def _work(self) -> None:
        try:
            done = False
            while not done:
                batch = [] if (item := self._queue.get()) is _DONE else list(item)
                done = item is _DONE
                while not done and not self._queue.empty():  # what arrived meanwhile joins this batch
                    more = self._queue.get()
                    done = more is _DONE
                    batch += [] if done else more
                if not batch or self._cancel.is_set() or self._error is not None:
                    continue
                self._timed("prepare", self._prepare, batch)
                self._prepared += len(batch)
                if self._prepared == len(self.problems):
                    self._gated.set()
                self._timed("sandbox", self._execute, batch)
            self._gated.set()
            self._executed.set()
        except BaseException as exc:  # surfaced in the main thread by gate_result / outcomes
            self._fail(exc)

    def _prepare(self, batch: list[int]) -> None:
        """Parse, gate and plan problems ``batch`` (``tasks.rollout.gate_tests``'s work, for those problems)."""
        from codea1_core.method.outcomes import plan_problem
        from gates.generated_tests import check_tests, gate_columns
        from tasks.rollout import apply_gate, parse_suites

        problems = [self.problems[b] for b in batch]
        suites = parse_suites(problems, [self._completions(b) for b in batch], self.cfg.tests)
        table = gate_columns(problems, suites)
        if table["call"]:  # verdicts per row; the rejected-share limit is decided over the step (gate_result)
            gate = check_tests(table, dataclasses.replace(self.cfg.tests, max_rejected_frac=1.0))
            apply_gate(suites, gate.reasons)
            self._gate_rows += len(table["call"])
            for reason, n in gate.counts.items():
                self._gate_counts[reason] = self._gate_counts.get(reason, 0) + n
        for b, per_problem in zip(batch, suites, strict=True):
            self._results[b] = _Problem(
                per_problem, plan_problem(self.problems[b], self.codes[b], per_problem, self.replay[b])
            )

    def _execute(self, batch: list[int]) -> None:
        """Reference then candidate jobs of problems ``batch`` (``tasks.execute.execute``'s two phases)."""
        results = [r for b in batch if (r := self._results[b]) is not None]
        ref_out = run_with_retry(self.executor, [r.plan.reference_job() for r in results])
        cand_jobs = [r.plan.candidate_jobs(out) for r, out in zip(results, ref_out, strict=True)]
        flat = run_with_retry(self.executor, [j for jobs in cand_jobs for j in jobs])
        i = 0
        for r, out, jobs in zip(results, ref_out, cand_jobs, strict=True):
            r.ref_out, r.cand_out = out, flat[i : i + len(jobs)]
            i += len(jobs)

    # -- the step's side: what the gate_tests and execute tasks return -----------------------------------------
    def _wait(self, event: threading.Event) -> None:
        event.wait()
        if self._error is not None:
            raise self._error

    def gate_result(self) -> tuple[list[list[list[Any]]], dict[str, float]]:
        """``tasks.rollout.gate_tests``'s return for the whole step, once every problem is gated."""
        self._wait(self._gated)
        suites = [r.suites for r in self._results if r is not None]
        if not self._gate_rows:
            return suites, {"test/rejected_rate": 0.0}
        rejected = sum(self._gate_counts.values())
        rate = rejected / self._gate_rows
        if rate > self.cfg.tests.max_rejected_frac:  # the serial gate's error and report, from the same rows
            self._serial_gate()
        metrics = {"test/rejected_rate": rate}
        metrics |= {f"test/rejected/{reason}": float(n) for reason, n in sorted(self._gate_counts.items())}
        return suites, {**metrics, "test/gate_rows": float(self._gate_rows)}

    def _serial_gate(self) -> None:
        """Gate the step's rollout in one piece, as the serial step does: it raises the one ``DataQualityError``
        (with its report) the step's rejected share calls for."""
        from tasks.rollout import gate_tests

        completions = [self._completions(b) for b in range(len(self.problems))]
        gate_tests.fn(self.problems, completions, self.cfg, self.iteration)

    def outcomes(self) -> tuple[list[Any], dict[str, float]]:
        """``tasks.execute.execute``'s return for the whole step (the same aborts, over the whole step), plus the
        step's overlap timings."""
        self._wait(self._executed)
        results = [r for r in self._results if r is not None]
        it, frac = self.iteration, self.cfg.sandbox.max_infra_failure_frac
        ref_out = [r.ref_out for r in results]
        check_infra(ref_out, frac, f"iteration {it} reference")
        failed = [(r.plan.problem.id, o) for r in results if (o := reference_failed(r.ref_out)) is not None]
        stop_on_reference_failures(
            failed,
            len(results),
            self.cfg,
            f"iteration {it}: the reference failed on {len(failed)}/{len(results)} problems",
        )
        flat = [o for r in results for o in r.cand_out]
        check_infra(flat, frac, f"iteration {it} candidates")
        rel, abs_tol = self.cfg.sandbox.float_rel_tol, self.cfg.sandbox.float_abs_tol
        matrices = [r.plan.assemble(r.ref_out, r.cand_out, rel, abs_tol) for r in results]
        sandbox_s = sum(t1 - t0 for phase, t0, t1 in self._busy if phase == "sandbox")
        metrics = outcome_metrics(ref_out + flat, sandbox_s, event_counts(self.executor, self._events_before))
        return matrices, metrics | {"sandbox/reference_failures": float(len(failed))} | self.timings()

    def timings(self) -> dict[str, float]:
        """``time/overlap_s`` (background work inside the generation's window) and the background's busy time."""
        out = {f"time/overlap/{phase}_s": 0.0 for phase in ("prepare", "sandbox")}
        overlap = 0.0
        g0, g1 = self._generation or (0.0, 0.0)
        for phase, t0, t1 in self._busy:
            out[f"time/overlap/{phase}_s"] += t1 - t0
            overlap += max(0.0, min(t1, g1) - max(t0, g0))
        return {"time/overlap_s": overlap, **out}

    def close(self) -> None:
        """Stop the thread after its current batch and wait for it."""
        self._cancel.set()
        self._queue.put(_DONE)
        self._thread.join()


@contextmanager
def overlapped(
    executor: Any,
    problems: list[Problem],
    codes: list[list[str]],
    replay: list[list[Any]],
    cfg: Config,
    it: int,
) -> Iterator[OverlappedExecution]:
    """An :class:`OverlappedExecution` for the block; its thread stopped on leaving (also on an error)."""
    pipe = OverlappedExecution(executor, problems, codes, replay, cfg, it)
    try:
        yield pipe
    finally:
        pipe.close()


@task(name="gate_tests", task_run_name="gate_tests[it={iteration}]", cache_policy=NO_CACHE)
def gate_tests_overlapped(
    pipe: OverlappedExecution, iteration: int
) -> tuple[list[list[list[Any]]], dict[str, float]]:
    """The step's gated suites and gate metrics (``tasks.rollout.gate_tests``), gated in the background."""
    return pipe.gate_result()


@task(name="execute", task_run_name="execute[it={iteration}]", cache_policy=NO_CACHE)
def execute_overlapped(pipe: OverlappedExecution, iteration: int) -> tuple[list[Any], dict[str, float]]:
    """The step's outcome matrices and ``sandbox/`` metrics (``tasks.execute.execute``), run in the background."""
    return pipe.outcomes()
