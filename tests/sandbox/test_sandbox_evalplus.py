"""Slow: every HumanEval+ / MBPP+ canonical solution on all base and plus inputs, run twice.

Both runs must agree call by call (status and value, NaN-aware), no call may be ``unsupported_output``
or ``infra_error`` (the codec must carry every output: fix the codec rather than drop a task), and every
output must round-trip through the codec and through ``to_literal``. Genuine exceptions/time-outs of a
canonical solution are reported (printed), not hidden. The calls run chunked exactly as the prepare
stage runs them (``chunk_exprs``, then ``run_reference_jobs``' rerun-alone rule). About 165k calls per
run: minutes on 2 cores.
"""

from __future__ import annotations

import collections
import gzip
import json
import math

import pytest

from codea1_core.data.prepared import chunk_exprs
from codea1_core.values import decode, encode, to_literal
from flows.prepare import run_reference_jobs
from sandbox import ExecLimits, ProcessExecutor
from sandbox.workloads import FILES, evalplus_workloads

pytestmark = pytest.mark.slow


def same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return (math.isnan(a) and math.isnan(b)) or a == b
    if type(a) is complex:
        return same(a.real, b.real) and same(a.imag, b.imag)
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is dict:
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


def test_input_literals_round_trip(shared_data_dir):
    """The call sources rebuild every input exactly (incl. nan/inf, huge ints, nested tuples)."""
    checked = 0
    for rel in FILES.values():
        with gzip.open(shared_data_dir / rel, "rt", encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                for args in (row["base_input"] or []) + (row["plus_input"] or []):
                    assert same(eval(to_literal(args)), args), (row["task_id"], repr(args)[:200])  # noqa: S307
                    checked += 1
    assert checked > 100_000


@pytest.mark.timeout(1200)  # two runs of 600 s at most
def test_canonical_solutions_run_identically_twice(shared_data_dir):
    workloads = []
    for bench in ("humanevalplus", "mbppplus"):
        workloads += evalplus_workloads(shared_data_dir, bench, ("base_input", "plus_input"))
    assert len(workloads) == 542
    jobs = [(w.program, part) for w in workloads for part in chunk_exprs(w.calls)]
    owner = [k for k, w in enumerate(workloads) for _ in chunk_exprs(w.calls)]
    names = [workloads[k].task_id for k in owner]
    limits = ExecLimits(call_timeout_s=30.0, program_timeout_s=600.0, memory_mb=2048)
    runs = []
    with ProcessExecutor(workers=2, limits=limits) as ex:
        for _ in range(2):
            per_task = [[] for _ in workloads]
            for k, out in zip(owner, run_reference_jobs(ex, jobs, names), strict=True):
                per_task[k] += out
            runs.append(per_task)
    first, second = runs
    counts = collections.Counter()
    disagreements, genuine = [], []
    for w, run1, run2 in zip(workloads, first, second, strict=True):
        for call, a, b in zip(w.calls, run1, run2, strict=True):
            counts[a.status] += 1
            assert a.status not in ("infra_error", "unsupported_output"), (w.task_id, call[:200], a)
            if a.status != b.status or (a.ok and not same(a.value, b.value)):
                disagreements.append((w.task_id, call[:120], a, b))
            if a.ok:
                assert same(decode(encode(a.value)), a.value), (w.task_id, call[:200])
                assert same(eval(to_literal(a.value)), a.value), (w.task_id, call[:200])  # noqa: S307
            elif a.status == b.status:
                genuine.append((w.task_id, a.status, a.error[:100]))
    print(f"\nstatuses: {dict(counts)}; genuine non-ok results of canonical solutions: {len(genuine)}")
    for item in sorted(set(genuine))[:50]:
        print("  ", *item)
    assert not disagreements, disagreements[:5]
