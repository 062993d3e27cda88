"""Reference health (``tasks/execute.py``): sandbox limits under which the references fail their own tests stop
train and evaluate with one line naming the limit, at the start and in every step, never train on zero rewards.

Bug guarded: ``sandbox.call_timeout_s=1.0e-6`` (or a memory limit the references do not fit) masked every
problem of every step, and training ran on zero rewards to exit 0.

Also: the step's ``sandbox/`` metrics carry what the executor went through (its infra events and retries).
"""

from __future__ import annotations

import pytest
from support import FakeExecutor, problem

from codea1_core.config import Config
from codea1_core.types import CallOutcome
from tasks.execute import execute

LAB = Config.from_dict({})


class LimitedExecutor(FakeExecutor):
    """Runs programs in-process, except the ones containing ``marker``: every call of those gets ``outcome``."""

    def __init__(self, marker: str, outcome: CallOutcome) -> None:
        super().__init__()
        self.marker, self.outcome = marker, outcome

    def run(self, program: str, exprs: list[str]) -> list[CallOutcome]:
        if self.marker in program:
            return [self.outcome for _ in exprs]
        return super().run(program, exprs)


SLOW = "def add(a, b):\n    return a + b  # slow\n"
TOP_LEVEL_TIMEOUT = CallOutcome("program_error", error="Timeout: program top level exceeded 1e-06 s")


def _problems(n: int, slow: int) -> list:
    """``n`` problems; the references of the first ``slow`` carry the marker of :class:`LimitedExecutor`."""
    return [problem(f"t/{i}", **({"reference": SLOW} if i < slow else {})) for i in range(n)]


@pytest.mark.parametrize(
    ("outcome", "key"),
    [
        (TOP_LEVEL_TIMEOUT, "sandbox.call_timeout_s"),
        (CallOutcome("timeout", error="Timeout: call exceeded 2.0 s"), "sandbox.call_timeout_s"),
        (CallOutcome("timeout", error="Timeout: program cap of 60.0 s reached"), "sandbox.program_cap_s"),
        (CallOutcome("memory", error="MemoryError: memory limit reached"), "sandbox.memory_mb"),
        (CallOutcome("program_error", error="MemoryError: "), "sandbox.memory_mb"),
        (CallOutcome("error", error="ZeroDivisionError: division by zero"), ""),
    ],
)
def test_each_failure_points_at_its_limit(outcome, key) -> None:
    from tasks.execute import limit_of

    assert limit_of(outcome) == key


def test_the_start_check_stops_in_one_line_naming_the_limit_and_its_value() -> None:
    from tasks.execute import ReferenceFailure, check_reference_health

    cfg = LAB.replace(**{"sandbox.call_timeout_s": 1.0e-6})
    ex = LimitedExecutor("# slow", TOP_LEVEL_TIMEOUT)
    with pytest.raises(ReferenceFailure) as err:
        check_reference_health(ex, _problems(20, slow=20), cfg, "train")
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith(
        "train: 8/8 sampled references fail their own golden tests under the sandbox limits"
    )
    assert "(> sandbox.max_reference_failure_frac=0.5)" in line
    assert line.endswith("raise sandbox.call_timeout_s (now 1e-06)")
    assert len(ex.jobs) == 8  # a sample, spread over the set: cheap


def test_the_start_check_passes_healthy_references_and_tolerates_the_threshold() -> None:
    from tasks.execute import ReferenceFailure, check_reference_health

    memory = CallOutcome("memory", error="MemoryError: memory limit reached")
    assert check_reference_health(FakeExecutor(), _problems(20, slow=0), LAB, "evaluate") == 0
    assert (
        check_reference_health(LimitedExecutor("# slow", memory), _problems(8, slow=4), LAB, "x") == 4
    )  # 0.5
    with pytest.raises(ReferenceFailure, match=r"5/8 .* raise sandbox.memory_mb \(now 1024\)$"):
        check_reference_health(LimitedExecutor("# slow", memory), _problems(8, slow=5), LAB, "x")
    off = LAB.replace(**{"sandbox.max_reference_failure_frac": 1.0})
    assert check_reference_health(LimitedExecutor("# slow", memory), _problems(8, slow=8), off, "x") == 8


def test_a_wrong_reference_value_is_not_blamed_on_a_limit() -> None:
    from tasks.execute import ReferenceFailure, check_reference_health

    wrong = [problem(f"t/{i}", reference="def add(a, b):\n    return a - b\n") for i in range(3)]
    with pytest.raises(
        ReferenceFailure, match=r"add\(1, 2\) returned -1, its golden test expects 3; no sandbox"
    ):
        check_reference_health(FakeExecutor(), wrong, LAB, "train")


def _plans(n: int, slow: int) -> list:
    from codea1_core.method.outcomes import plan_problem

    code = "def add(a, b):\n    return a + b\n"
    return [plan_problem(p, [code, code], [[], []]) for p in _problems(n, slow)]


def test_a_step_counts_the_problems_whose_reference_failed_and_stops_past_the_threshold() -> None:
    from tasks.execute import ReferenceFailure, execute

    ex = LimitedExecutor("# slow", TOP_LEVEL_TIMEOUT)
    matrices, metrics = execute.fn(ex, _plans(4, slow=1), LAB, 3)
    assert metrics["sandbox/reference_failures"] == 1.0
    assert [m.problem_infra for m in matrices] == [True, False, False, False]  # masked, as before
    ex = LimitedExecutor("# slow", TOP_LEVEL_TIMEOUT)
    with pytest.raises(ReferenceFailure) as err:
        execute.fn(ex, _plans(4, slow=3), LAB, 3)
    assert str(err.value).startswith(
        "iteration 3: the reference failed on 3/4 problems under the sandbox limits"
    )
    assert str(err.value).endswith("raise sandbox.call_timeout_s (now 2.0)")
    assert len(ex.jobs) == 4  # stopped after the reference phase: no candidate ran


def test_every_lab_reference_passes_under_the_default_limits() -> None:
    """The default run must never trip the check: every lab reference (train, val, held-out) passes its
    golden tests in the real sandbox under ``params.yaml``'s limits."""
    from pathlib import Path

    from codea1_core.config import load_config
    from codea1_core.data.lab import lab_problems
    from sandbox import make_executor
    from tasks.execute import run_jobs

    cfg = load_config(Path(__file__).resolve().parents[2] / "params.yaml")
    problems = [p for split in ("train", "val", "test") for p in lab_problems(cfg.lab, split)]
    with make_executor(cfg.sandbox) as ex:
        out = run_jobs(ex, [(p.reference_solution, [t.call for t in p.tests]) for p in problems], 0.0, "lab")
    assert [(p.id, o) for p, row in zip(problems, out, strict=True) for o in row if o.status != "ok"] == []


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
