"""The syscall allow-list, measured: honest workloads never hit a denied syscall.

The project's honest workloads — the lab's reference solutions and buggy variants on their golden tests,
HumanEval+ / MBPP+ canonical solutions on their inputs (``$CODEA1_DATA_DIR``) — run twice: once with the
deny-by-default layers off (all calls in one namespace), once as the pipeline runs them (calls isolated)
in the allow-list's measurement mode (``deny="kill"``: a denied syscall KILLS the process, so an EPERM a
program would have swallowed cannot go unseen). Every outcome must be the same. The default run takes a
subset of EvalPlus (base inputs of the first tasks); the ``slow`` one takes every task with its plus
inputs.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest

from codea1_core.config import LabConfig
from codea1_core.data.lab import buggy_variants, lab_problems
from sandbox import ExecLimits, ProcessExecutor
from sandbox.workloads import FILES, evalplus_workloads

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the process sandbox needs Linux"
)

LIMITS = ExecLimits(call_timeout_s=5.0, program_timeout_s=60.0, isolate_calls=True)
DATA = Path(os.environ.get("CODEA1_DATA_DIR") or Path(__file__).resolve().parents[3] / "shared" / "data")


def _lab_jobs() -> list[tuple[str, list[str]]]:
    jobs = []
    for split in ("train", "test"):
        for problem in lab_problems(LabConfig(), split):
            calls = [t.call for t in problem.tests]
            jobs.append((problem.reference_solution, calls))
            jobs += [(variant, calls) for variant in buggy_variants(problem)[:1]]
    return jobs


def _evalplus_jobs(inputs: tuple[str, ...], max_tasks: int) -> list[tuple[str, list[str]]]:
    if not all((DATA / rel).is_file() for rel in FILES.values()):
        pytest.skip(f"EvalPlus files not in {DATA} (set CODEA1_DATA_DIR)")
    jobs = []
    for bench in FILES:
        jobs += [(w.program, w.calls) for w in evalplus_workloads(DATA, bench, inputs, max_tasks)]
    return jobs


def _run(jobs, deny: str):
    limits = dataclasses.replace(LIMITS, isolate_calls=deny != "off")
    with ProcessExecutor(workers=2, limits=limits, deny=deny) as ex:
        if deny == "kill":
            assert ex.isolation["seccomp"].startswith("on"), ex.isolation["seccomp"]
        return ex.run_many(jobs)


def _same_outcomes(jobs) -> None:
    free, filtered = _run(jobs, "off"), _run(jobs, "kill")
    differ = []
    for (program, calls), want, got in zip(jobs, free, filtered, strict=True):
        for call, a, b in zip(calls, want, got, strict=True):
            same = a.status == b.status and (a.status != "ok" or a.value == b.value or a.value != a.value)
            timing = {a.status, b.status} <= {"ok", "timeout"} and "timeout" in {a.status, b.status}
            if not same and not timing:
                differ.append((program.splitlines()[0][:60], call[:60], a.status, b.status, b.error[:120]))
    assert differ == [], f"{len(differ)} calls differ under the allow-list, e.g. {differ[:5]}"
    assert any(o.status == "ok" for outs in filtered for o in outs)


def test_lab_workloads_hit_no_denied_syscall():
    _same_outcomes(_lab_jobs())


def test_evalplus_canonical_solutions_hit_no_denied_syscall():
    _same_outcomes(_evalplus_jobs(("base_input",), max_tasks=40))


@pytest.mark.slow
def test_all_evalplus_canonical_solutions_hit_no_denied_syscall():
    _same_outcomes(_evalplus_jobs(("base_input", "plus_input"), max_tasks=0))
