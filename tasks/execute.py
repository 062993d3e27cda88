"""Execution task: run a step's programs in the sandbox in two phases and assemble the outcome matrices.

What it does (docs/method.md §3 step 8, §6, D1-D4): :func:`run_jobs` is the one function through which every
sandbox use runs its jobs, with the one infrastructure guard (training, evaluation, ``solve``, ``attack``,
prepare). The ``execute`` task: phase 1 runs every problem's reference job in ONE
``run_many`` (the executor shards it across its warm pool); phase 2 runs every candidate job of every
problem in ONE ``run_many``; each (program, call) runs exactly once. Jobs whose outcome contains
``infra_error`` are retried once more as a batch; if the share of calls still failing for infrastructure
reasons exceeds ``sandbox.max_infra_failure_frac`` the step aborts with :class:`InfraFailure` (D4: an
infrastructure failure is never a score). The executor is created once per flow run, not here.
Reference health: limits under which the references themselves fail would mask every problem or leave
every test invalid, and train on zero rewards. :func:`check_reference_health` runs a few references on their
own golden tests at the start of train and evaluate, and ``execute`` counts each step's problems whose
reference failed (``sandbox/reference_failures``); past ``sandbox.max_reference_failure_frac`` both stop
with :class:`ReferenceFailure`, one line naming the limit the failures point at.
What it does not: score (``tasks/score.py``) or judge values (``codea1_core.method.outcomes`` does, in this
trusted parent).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from codea1_core.config import Config, ConfigError
from codea1_core.types import CallOutcome
from codea1_core.values import values_equal


class InfraFailure(RuntimeError):
    """Too many calls failed for infrastructure reasons (D4): the step or benchmark is aborted, not scored.

    The one exception of the one guard (:func:`run_jobs`) every sandbox use goes through: training,
    evaluation, ``solve``, ``attack`` and the prepare stage's reference runs.
    """


MAX_INFRA_KEY = "sandbox.max_infra_failure_frac"


def _infra_count(outcomes: list[list[Any]]) -> tuple[int, int]:
    calls = sum(len(o) for o in outcomes)
    infra = sum(1 for o in outcomes for c in o if c.status == "infra_error")
    return infra, calls


def check_infra(
    outcomes: list[list[Any]],
    max_infra_frac: float,
    label: str,
    names: Sequence[str] | None = None,
    limit_key: str = MAX_INFRA_KEY,
) -> int:
    """Count ``infra_error`` calls; raise :class:`InfraFailure` when their share exceeds ``max_infra_frac``.

    The message says what failed (``label``, up to three job ``names``, the first error), how many calls
    and the limit (``limit_key``, the setting that holds it).
    """
    infra, calls = _infra_count(outcomes)
    if calls and infra / calls > max_infra_frac:
        hit = [i for i, o in enumerate(outcomes) if any(c.status == "infra_error" for c in o)]
        first = next(c.error for c in outcomes[hit[0]] if c.status == "infra_error")
        where = f" in {len(hit)} program(s), e.g. {[names[i] for i in hit[:3]]}" if names else ""
        raise InfraFailure(
            f"{label}: {infra}/{calls} calls hit sandbox infrastructure errors{where} "
            f"(> {limit_key}={max_infra_frac}); first error: {first or '(no message)'}; "
            "aborted, nothing scored"
        )
    return infra


def run_jobs(
    executor: Any,
    jobs: list[tuple[str, list[str]]],
    max_infra_frac: float,
    label: str,
    names: Sequence[str] | None = None,
    limit_key: str = MAX_INFRA_KEY,
) -> list[list[Any]]:
    """THE way sandbox jobs run: :func:`run_with_retry`, then the D4 abort rule (:func:`check_infra`). ``names``
    (one per job) name the failing programs. (A step whose jobs run in pieces, ``tasks.overlap``, runs each piece
    with :func:`run_with_retry` and applies the rule once, to the whole step.)"""
    if not jobs:
        return []
    if names is not None and len(names) != len(jobs):
        raise ValueError(f"{label}: {len(names)} names for {len(jobs)} jobs")
    outcomes = run_with_retry(executor, jobs)
    check_infra(outcomes, max_infra_frac, label, names, limit_key)
    return outcomes


def run_with_retry(executor: Any, jobs: list[tuple[str, list[str]]]) -> list[list[Any]]:
    """``run_many``, then one batch retry of the jobs that hit infra errors; no abort rule (:func:`run_jobs`)."""
    if not jobs:
        return []
    outcomes = list(executor.run_many(jobs))
    retry = [i for i, o in enumerate(outcomes) if any(c.status == "infra_error" for c in o)]
    if retry:
        again = executor.run_many([jobs[i] for i in retry])
        for i, o in zip(retry, again, strict=True):
            outcomes[i] = o
    return outcomes


# --------------------------------------------------------------------------------------------------
# Reference health: sandbox limits under which the references themselves fail
# --------------------------------------------------------------------------------------------------
class ReferenceFailure(ConfigError):
    """Too many references fail under the configured ``sandbox.*`` limits: a configuration failure, stopped
    before it is trained on (every problem masked or every test invalid would train on zero rewards)."""


MAX_REFERENCE_KEY = "sandbox.max_reference_failure_frac"
HEALTH_SAMPLE = 8
"""References run on their own golden tests at the start of train and evaluate (spread over the set)."""
LIMIT_STATUSES = ("timeout", "memory")


def limit_of(outcome: Any) -> str:
    """The ``sandbox.*`` limit a failed call points at ("" when none does): a memory error at ``memory_mb``,
    a program that ran out of its cap at ``program_cap_s``, any other time-out (a call, the program's top
    level) at ``call_timeout_s``."""
    error = outcome.error or ""
    if outcome.status == "memory" or "MemoryError" in error:
        return "sandbox.memory_mb"
    if "program cap" in error:
        return "sandbox.program_cap_s"
    if outcome.status == "timeout" or error.startswith("Timeout:"):
        return "sandbox.call_timeout_s"
    return ""


def reference_failed(outcomes: Sequence[Any]) -> Any:
    """The outcome that shows a step's reference job failed, or None: a ``program_error`` (the reference did
    not load: its problem is masked) or, when every call hit a limit, the first (every test is invalid).
    A job with an ``infra_error`` is the infrastructure guard's (:func:`run_jobs`), not counted here."""
    if any(o.status == "infra_error" for o in outcomes):
        return None
    broken = next((o for o in outcomes if o.status == "program_error"), None)
    if broken is not None:
        return broken
    if outcomes and all(o.status in LIMIT_STATUSES for o in outcomes):
        return outcomes[0]
    return None


def stop_on_reference_failures(failed: list[tuple[str, Any]], total: int, cfg: Config, what: str) -> None:
    """Raise :class:`ReferenceFailure` when ``failed`` (problem id, failing outcome) is more than
    ``sandbox.max_reference_failure_frac`` of ``total``: one line naming the limit most failures point at
    and its value, or saying that no limit explains them."""
    limit = cfg.sandbox.max_reference_failure_frac
    if not total or len(failed) / total <= limit:
        return
    keys = Counter(limit_of(o) for _, o in failed)
    key = max(keys, key=lambda k: (keys[k], k != ""))  # the commonest; a limit before no limit on a tie
    pid, first = next((pid, o) for pid, o in failed if limit_of(o) == key)
    if key:
        fix = f"raise {key} (now {getattr(cfg.sandbox, key.split('.')[1])})"
    else:
        fix = "no sandbox limit explains it: check the prepared data (`dvc repro prepare`)"
    raise ReferenceFailure(
        f"{what} under the sandbox limits (> {MAX_REFERENCE_KEY}={limit}), e.g. {pid}: "
        f"{first.status}: {' '.join((first.error or '(no message)').split())[:200]}; {fix}"
    )


def health_sample(problems: Sequence[Any], k: int = HEALTH_SAMPLE) -> list[Any]:
    """Up to ``k`` problems with golden tests, evenly spread over ``problems`` (no random draw)."""
    with_tests = [p for p in problems if p.tests]
    n = len(with_tests)
    return [with_tests[i * n // k] for i in range(k)] if n > k else with_tests


def check_reference_health(executor: Any, problems: Sequence[Any], cfg: Config, label: str) -> int:
    """Run :func:`health_sample` references on their own golden tests under ``cfg.sandbox``'s limits (through
    :func:`run_jobs`); raise :class:`ReferenceFailure` when too many fail one. Returns how many failed."""
    sample = health_sample(problems)
    jobs = [(p.reference_solution, [t.call for t in p.tests]) for p in sample]
    frac = cfg.sandbox.max_infra_failure_frac
    outcomes = run_jobs(executor, jobs, frac, f"{label}: reference check", names=[p.id for p in sample])
    rel_tol, abs_tol = cfg.sandbox.float_rel_tol, cfg.sandbox.float_abs_tol
    failed = []
    for p, out in zip(sample, outcomes, strict=True):
        for t, o in zip(p.tests, out, strict=True):
            if o.status != "ok":
                failed.append((p.id, o))
                break
            if not values_equal(o.value, t.expected, rel_tol, max(abs_tol, p.atol)):
                wrong = f"{t.call} returned {o.value!r}, its golden test expects {t.expected!r}"
                failed.append((p.id, CallOutcome("error", None, f"WrongValue: {wrong[:200]}")))
                break
    what = f"{label}: {len(failed)}/{len(sample)} sampled references fail their own golden tests"
    stop_on_reference_failures(failed, len(sample), cfg, what)
    return len(failed)


@task(name="execute", task_run_name="execute[it={iteration}]", cache_policy=NO_CACHE)
def execute(
    executor: Any, plans: list[Any], cfg: Config, iteration: int
) -> tuple[list[Any], dict[str, float]]:
    """Two-phase execution of all problems of a step; returns outcome matrices and ``sandbox/`` metrics."""
    t0, events = time.perf_counter(), event_counts(executor)
    frac = cfg.sandbox.max_infra_failure_frac
    ref_out = run_jobs(executor, [p.reference_job() for p in plans], frac, f"iteration {iteration} reference")
    failed = [
        (p.problem.id, o) for p, out in zip(plans, ref_out, strict=True) if (o := reference_failed(out))
    ]
    stop_on_reference_failures(
        failed,
        len(plans),
        cfg,
        f"iteration {iteration}: the reference failed on {len(failed)}/{len(plans)} problems",
    )
    cand_jobs = [p.candidate_jobs(r) for p, r in zip(plans, ref_out, strict=True)]
    flat = run_jobs(
        executor, [j for jobs in cand_jobs for j in jobs], frac, f"iteration {iteration} candidates"
    )
    matrices, i = [], 0
    for plan, ref, jobs in zip(plans, ref_out, cand_jobs, strict=True):
        cand = flat[i : i + len(jobs)]
        i += len(jobs)
        matrices.append(plan.assemble(ref, cand, cfg.sandbox.float_rel_tol, cfg.sandbox.float_abs_tol))
    metrics = outcome_metrics(ref_out + flat, time.perf_counter() - t0, event_counts(executor, events))
    return matrices, metrics | {"sandbox/reference_failures": float(len(failed))}


@task(name="execute_golden", task_run_name="execute_golden[it={iteration}]", cache_policy=NO_CACHE)
def execute_golden(
    executor: Any, plans: list[Any], cfg: Config, iteration: int
) -> tuple[list[Any], dict[str, float]]:
    """Golden mode (§7.4): every code of every problem on its golden tests, in one ``run_many``."""
    t0, events = time.perf_counter(), event_counts(executor)
    jobs = [p.jobs() for p in plans]
    flat = run_jobs(
        executor, [j for js in jobs for j in js], cfg.sandbox.max_infra_failure_frac, f"it {iteration}"
    )
    outcomes, i = [], 0
    for plan, js in zip(plans, jobs, strict=True):
        outcomes.append(
            plan.assemble(flat[i : i + len(js)], cfg.sandbox.float_rel_tol, cfg.sandbox.float_abs_tol)
        )
        i += len(js)
    return outcomes, outcome_metrics(flat, time.perf_counter() - t0, event_counts(executor, events))


def event_counts(executor: Any, since: tuple[float, float] = (0.0, 0.0)) -> tuple[float, float]:
    """The executor's infrastructure events and retries (``stats``; none where it keeps no such count)
    since the counts ``since``."""
    stats = getattr(executor, "stats", None) or {}
    return stats.get("infra_events", 0) - since[0], stats.get("retries", 0) - since[1]


def outcome_metrics(
    outcomes: list[list[Any]], seconds: float, events: tuple[float, float] = (0.0, 0.0)
) -> dict[str, float]:
    """``sandbox/`` metrics of one step: programs, calls, time-outs, infra errors, calls per second, and
    ``events``: the executor's infrastructure events (a worker lost, a program killed from outside; each
    logged by the executor) and the job retries they caused."""
    infra, calls = _infra_count(outcomes)
    timeouts = sum(1 for o in outcomes for c in o if c.status == "timeout")
    return {
        "sandbox/programs": float(len(outcomes)),
        "sandbox/calls": float(calls),
        "sandbox/timeouts": float(timeouts),
        "sandbox/timeout_rate": timeouts / calls if calls else 0.0,
        "sandbox/infra_errors": float(infra),
        "sandbox/infra_events": float(events[0]),
        "sandbox/retries": float(events[1]),
        "sandbox/calls_per_s": calls / seconds if seconds > 0 else 0.0,
    }
