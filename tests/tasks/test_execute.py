"""The execution task's ``sandbox/`` metrics: what the executor went through reaches the step's metrics."""

from __future__ import annotations

from codea1_core.config import Config
from codea1_core.types import CallOutcome
from tasks.execute import execute


class _Executor:
    """Ran one job twice in this step (a worker lost, or a program killed from outside): its own counts."""

    def __init__(self) -> None:
        self.stats = {"infra_events": 3.0, "retries": 5.0}  # from earlier steps

    def run_many(self, jobs: list[tuple[str, list[str]]]) -> list[list[CallOutcome]]:
        self.stats["infra_events"] += 1
        self.stats["retries"] += 1
        return [[CallOutcome("ok", 1)] * len(calls) for _, calls in jobs]


class _Plan:
    def reference_job(self) -> tuple[str, list[str]]:
        return "def f():\n    return 1\n", ["f()"]

    def candidate_jobs(self, ref: list[CallOutcome]) -> list[tuple[str, list[str]]]:
        return [("def f():\n    return 1\n", ["f()"])]

    def assemble(self, ref, cand, rel_tol, abs_tol):
        return ref, cand


def test_a_steps_infra_events_and_retries_reach_its_metrics():
    """A worker lost or a program killed from outside was retried with no trace in the step's metrics
    (``sandbox/infra_errors`` counts only the calls still failing after the retries): the step now
    reports the executor's events and retries of this step alone."""
    _, metrics = execute.fn(_Executor(), [_Plan()], Config(), 1)
    assert (metrics["sandbox/infra_events"], metrics["sandbox/retries"]) == (2.0, 2.0)
    assert metrics["sandbox/infra_errors"] == 0.0 and metrics["sandbox/calls"] == 2.0
