"""``tasks.overlap``: a step's gate and sandbox work run per problem while later problems generate, and return
exactly what the serial ``gate_tests`` and ``execute`` tasks return for the same rollout (real sandbox)."""

from __future__ import annotations

import dataclasses
import threading
from types import SimpleNamespace

import pytest
from support import FakeExecutor

from codea1_core.config import Config
from codea1_core.method.outcomes import plan_problem
from codea1_core.types import TestCase
from tasks.execute import InfraFailure, ReferenceFailure, execute
from tasks.overlap import OverlappedExecution, overlapped
from tasks.rollout import gate_tests
from workspace.resume import is_timing

N = 2


def _lab(k: int = 5):
    from codea1_core.data.lab import lab_problems

    return lab_problems(Config().lab, "train")[:k]


def _codes(p) -> list[str]:
    """M = 3: the reference, a wrong code, one that does not load."""
    return [p.reference_solution, f"def {p.entry_point}(*args):\n    return 0\n", f"def {p.entry_point}(:\n"]


def _suites(p, m: int, copies: int) -> list[str]:
    """N = 2 suites per code: golden asserts and a wrong one; ``copies`` of one assert (the gate keeps one) and a
    dunder call (the parser refuses it)."""
    ep, (t0, t1, *_) = p.entry_point, p.tests
    golden = "\n".join(f"assert {t.call} == {t.expected!r}" for t in (t0, t1))
    odd = "\n".join([f"assert {t0.call} == {t0.expected!r}"] * copies + [f"assert {ep}(().__class__) == 1"])
    return [f"```python\n{golden}\nassert {ep}({m}) == 'x'\n```", f"```python\n{odd}\n```"]


def _step(k: int = 5):
    problems = _lab(k)
    codes = [_codes(p) for p in problems]
    rows = [  # problem 0's suites lose 4 of 8 rows per code at the gate, the others' 1 of 5
        [SimpleNamespace(text=t) for t in _suites(p, m, 5 if b == 0 else 2)]
        for b, (p, row) in enumerate(zip(problems, codes, strict=True))
        for m in range(len(row))
    ]
    replay = [
        [TestCase(p.tests[2].call, p.tests[2].expected)] if b % 2 == 0 else [] for b, p in enumerate(problems)
    ]
    return problems, codes, rows, replay


def _serial(ex, problems, codes, rows, replay, cfg):
    completions, i = [], 0
    for row in codes:
        completions.append(rows[i : i + len(row)])
        i += len(row)
    suites, gate_m = gate_tests.fn(problems, completions, cfg, 1)
    plans = [plan_problem(*a) for a in zip(problems, codes, suites, replay, strict=True)]
    matrices, sb = execute.fn(ex, plans, cfg, 1)
    return suites, gate_m, matrices, sb


def _overlapped(ex, problems, codes, rows, replay, cfg, chunk: int = 2, backwards: bool = False):
    import time

    starts = list(range(0, len(rows), chunk))
    with overlapped(ex, problems, codes, replay, cfg, 1) as pipe:
        t0 = time.perf_counter()
        for start in reversed(starts) if backwards else starts:  # vLLM: prompts as they finish
            pipe.take(start, rows[start : start + chunk])
        pipe.generation_done(t0)
        suites, gate_m = pipe.gate_result()
        matrices, sb = pipe.outcomes()
    return suites, gate_m, matrices, sb


def _untimed(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not is_timing(k)}


@pytest.mark.parametrize(("chunk", "backwards"), [(1, False), (4, False), (100, False), (1, True)])
def test_overlapped_step_returns_what_the_serial_step_returns(chunk: int, backwards: bool) -> None:
    from sandbox import make_executor

    cfg = Config()
    step = _step()
    with make_executor(cfg.sandbox) as ex:
        serial = _serial(ex, *step, cfg)
        piped = _overlapped(ex, *step, cfg, chunk=chunk, backwards=backwards)
    assert piped[0] == serial[0]  # the gated suites
    assert (
        piped[1] == serial[1] and serial[1]["test/rejected_rate"] > 0
    )  # the gate's metrics, rejections counted
    assert piped[2] == serial[2]  # the outcome matrices
    assert _untimed(piped[3]) == _untimed(serial[3])
    assert {m.problem_id for m in serial[2]} == {p.id for p in step[0]}
    assert any(any(m.code_valid) for m in serial[2]) and not all(all(m.code_valid) for m in serial[2])
    assert {"time/overlap_s", "time/overlap/prepare_s", "time/overlap/sandbox_s"} <= set(piped[3])


class _Watched(FakeExecutor):
    """A fake executor that says when its first job arrives."""

    def __init__(self) -> None:
        super().__init__()
        self.first = threading.Event()

    def run_many(self, jobs):
        self.first.set()
        return super().run_many(jobs)


def test_the_sandbox_starts_while_later_chunks_still_generate() -> None:
    import time

    problems, codes, rows, replay = _step(3)
    ex, cfg = _Watched(), Config()
    with overlapped(ex, problems, codes, replay, cfg, 1) as pipe:
        t0 = time.perf_counter()
        pipe.take(0, rows[:3])  # problem 0's three prompts: it goes to the sandbox now
        assert ex.first.wait(30), "no job ran before the rest of the rollout"
        assert not pipe._gated.is_set()  # problems 1 and 2 are still generating
        time.sleep(0.05)
        pipe.take(3, rows[3:])
        pipe.generation_done(t0)
        matrices, metrics = pipe.outcomes()
    assert [m.problem_id for m in matrices] == [p.id for p in problems]
    assert metrics["time/overlap_s"] > 0
    assert metrics["time/overlap_s"] <= metrics["time/overlap/prepare_s"] + metrics["time/overlap/sandbox_s"]


def test_the_gate_limit_is_decided_over_the_step_with_the_serial_gates_error(tmp_path, monkeypatch) -> None:
    from gates.errors import DataQualityError

    monkeypatch.chdir(tmp_path)  # the failing gate writes its report under outputs/quality
    cfg = Config().replace(**{"tests.max_rejected_frac": 0.05})
    step = _step(2)
    with pytest.raises(DataQualityError) as serial:
        _serial(FakeExecutor(), *step, cfg)
    with pytest.raises(DataQualityError) as piped:
        _overlapped(FakeExecutor(), *step, cfg, chunk=1)
    assert str(piped.value) == str(serial.value) and "rows rejected" in str(serial.value)
    # problem 0 alone is over a limit the whole step keeps (4/8 of its rows rejected, 15/39 of the step's):
    # chunks are never judged alone
    kept = cfg.replace(**{"tests.max_rejected_frac": 0.4})
    _, metrics, _, _ = _overlapped(FakeExecutor(), *step, kept, chunk=1)
    assert metrics["test/rejected_rate"] == pytest.approx((3 * 4 + 3 * 1) / (3 * 8 + 3 * 5))


class _Flaky(FakeExecutor):
    def run_many(self, jobs):
        from codea1_core.types import CallOutcome

        return [[CallOutcome("infra_error", None, "worker lost") for _ in calls] for _, calls in jobs]


class _Broken(FakeExecutor):
    def run_many(self, jobs):
        raise RuntimeError("executor closed under us")


def test_sandbox_failures_stop_the_step_as_in_the_serial_step() -> None:
    cfg = Config()
    step = _step(2)
    with pytest.raises(InfraFailure) as serial:
        _serial(_Flaky(), *step, cfg)
    with pytest.raises(InfraFailure) as piped:
        _overlapped(_Flaky(), *step, cfg, chunk=1)
    assert str(piped.value) == str(serial.value)
    with pytest.raises(RuntimeError, match="executor closed under us"):
        _overlapped(_Broken(), *step, cfg, chunk=1)


def test_reference_failures_stop_the_step_as_in_the_serial_step() -> None:
    cfg = Config().replace(**{"sandbox.max_reference_failure_frac": 0.0})
    problems, codes, rows, replay = _step(3)
    problems[1] = dataclasses.replace(problems[1], reference_solution="def broken(:\n")
    with pytest.raises(ReferenceFailure) as serial:
        _serial(FakeExecutor(), problems, codes, rows, replay, cfg)
    with pytest.raises(ReferenceFailure) as piped:
        _overlapped(FakeExecutor(), problems, codes, rows, replay, cfg, chunk=2)
    assert str(piped.value) == str(serial.value) and "1/3 problems" in str(serial.value)


def test_leaving_early_stops_the_thread() -> None:
    problems, codes, rows, replay = _step(3)
    with (
        pytest.raises(KeyboardInterrupt),
        overlapped(FakeExecutor(), problems, codes, replay, Config(), 1) as pipe,
    ):
        pipe.take(0, rows[:3])
        raise KeyboardInterrupt  # a signal during the rollout
    assert not pipe._thread.is_alive()


def test_a_prompt_delivered_twice_is_an_error() -> None:
    problems, codes, rows, replay = _step(2)
    with overlapped(FakeExecutor(), problems, codes, replay, Config(), 1) as pipe:
        pipe.take(0, rows[:2])
        with pytest.raises(RuntimeError, match="prompt 1 delivered twice"):
            pipe.take(1, rows[1:3])


def test_an_incomplete_rollout_is_an_error_not_a_shorter_step() -> None:
    problems, codes, rows, replay = _step(3)
    pipe = OverlappedExecution(FakeExecutor(), problems, codes, replay, Config(), 1)
    try:
        pipe.take(0, rows[:4])
        pipe.generation_done(0.0)
        with pytest.raises(RuntimeError, match="test rollout delivered 1/3 problems"):
            pipe.outcomes()
    finally:
        pipe.close()
