"""Benchmark of the generated-test quality gate (``tasks.quality.gx_gate_tests``) on 20,000 rows.

What it does: builds 20,000 synthetic generated-test rows shaped like one training step's suites
(~5% malformed: syntax errors, wrong function, dunder access, duplicates, over-long calls), runs the
gate once to warm up (GX context creation, suite build), then times ``--repeats`` validations and
prints the median wall and CPU seconds per validation and the rejected counts. Target: < 0.5 s per validation.

What it does not: run any code or use a model. How to run: ``python -m bench.gate_bench [--rows N]``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

import flows  # noqa: E402,F401  (the entry-point environment defaults, before Prefect and GX load)

BAD_CALLS = ["f(1", "g(1, 2)", "f(().__class__)", "f(x := 3)", "import os", "f(1)" + " " * 2100, "3 + 4"]


def make_rows(n_rows: int, seed: int = 0) -> list[dict]:
    """Synthetic rows: problems of 64 tests per (code) suite group, 8 tests per suite."""
    rng = random.Random(seed)
    rows = []
    for i in range(n_rows):
        problem, suite = f"bench/{i // 512}", (i // 8) % 64
        ep = f"func_{i // 512}"
        r = rng.random()
        if r < 0.01:
            call = BAD_CALLS[rng.randrange(len(BAD_CALLS))].replace("f(", f"{ep}(")
        elif r < 0.03 and rows and rows[-1]["suite_id"] == suite:
            call = rows[-1]["call"]  # duplicate within the suite
        else:
            args = [rng.randint(-100, 100) for _ in range(rng.randint(1, 6))]
            call = f"{ep}({args!r}, {rng.randint(0, 9)}, key={rng.choice(['None', repr('abc'), 'True'])})"
        answer = repr(sorted(rng.sample(range(100), 4))) if rng.random() > 0.005 else "[1, 2"
        rows.append(
            {"problem_id": problem, "suite_id": suite, "call": call, "answer": answer, "entry_point": ep}
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    from codea1_core.config import TestsConfig
    from tasks.quality import gx_gate_tests

    import_s = time.perf_counter() - t0
    rows = make_rows(args.rows)
    cfg = TestsConfig()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "gate.json"
        t0 = time.perf_counter()
        result = gx_gate_tests.fn(rows, cfg, report)
        first_s = time.perf_counter() - t0
        times, cpu = [], []
        for _ in range(args.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            result = gx_gate_tests.fn(rows, cfg, report)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    median = statistics.median(times)
    print(f"rows={args.rows} import_s={import_s:.2f} first_validation_s={first_s:.3f}")
    print(f"validation_s median={median:.3f} min={min(times):.3f} max={max(times):.3f} (target < 0.5)")
    print(f"validation_cpu_s median={statistics.median(cpu):.3f} (wall time on a loaded machine is higher)")
    print(f"rejected_rate={result.rejected_rate:.4f} counts={dict(sorted(result.counts.items()))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
