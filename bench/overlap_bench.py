"""The train step with and without ``rollout.overlap_execution``: step wall, the overlap, the same results.

What it does: builds two identical training runs (same config, seed, models, problems) that differ only in
``rollout.overlap_execution`` (false: rollout, then gate, then sandbox; true: ``tasks.overlap``) and runs their
iterations interleaved (who goes first alternates) on one sandbox executor, calling each task's plain function.
Per iteration it prints both step walls and, for the overlapped step, the background's busy time (gate + plan,
sandbox), ``time/overlap_s`` (the part of it inside the test rollout) and the sum of the step's phases in series
(its wall + the overlap). Then the medians over iterations 2.. (iteration 1 warms up) and the ratio of the two
walls. Every non-timing value of every iteration must be equal between the runs: the bench exits 1 otherwise.
What it does not: use Prefect or MLflow (``bench/iteration_bench.py`` measures those), or set a timing target:
the overlap grows with the rollout's chunks (``rollout.batch_size`` below the step's B x M test prompts) and with
the cores the sandbox has beside generation.

Run: ``python bench/overlap_bench.py [--params params.yaml] [--iterations 6] [key=value ...]``, e.g. the lab with
four test-rollout chunks per step: ``python bench/overlap_bench.py rollout.batch_size=8`` (uses
``outputs/warmstart/{code,test}`` when present, else a random-init model of the lab size).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import flows  # noqa: E402,F401  (the entry-point environment defaults, before Prefect and MLflow load)
from bench.iteration_bench import _model_paths  # noqa: E402


def _same(a: dict, b: dict) -> list[str]:
    """The non-timing keys whose values differ between two history rows (NaN equals NaN)."""
    from workspace.resume import is_timing

    def eq(x: object, y: object) -> bool:
        both_nan = isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)
        return both_nan or x == y

    keys = {k for k in a.keys() | b.keys() if not is_timing(k)}
    return sorted(k for k in keys if not eq(a.get(k), b.get(k)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)

    from prefect import flow

    from codea1_core.config import load_config
    from flows import train as T
    from flows.steps import as_function
    from sandbox import make_executor
    from tracking.runs import NullTracker

    tmp = Path(tempfile.mkdtemp(prefix="codea1_overlap_bench_"))
    cfg = load_config(args.params, args.overrides)
    code_path, test_path, model_note = _model_paths(cfg, tmp)
    common = {
        "model.code_path": code_path,
        "model.test_path": test_path,
        "eval.every": 0,
        "orchestration.resume": "never",
        "orchestration.max_steps": args.iterations,
        "tracking.backend": "null",
    }
    cfgs = {
        arm: cfg.replace(
            **common,
            **{"rollout.overlap_execution": arm == "overlap", "orchestration.checkpoint_dir": str(tmp / arm)},
        )
        for arm in ("serial", "overlap")
    }

    @flow(name="overlap-bench")
    def bench() -> dict[str, list[dict]]:
        with make_executor(cfg.sandbox) as ex:
            runs = {arm: T.setup(c, lambda *a, **k: NullTracker(), ex) for arm, c in cfgs.items()}
            rows: dict[str, list[dict]] = {arm: [] for arm in runs}
            arms = list(runs)
            for it in range(1, min(args.iterations, runs["serial"].total) + 1):
                for arm in arms if it % 2 else reversed(arms):  # alternate who goes first
                    rows[arm].append(T.iteration(runs[arm], it, as_function))
        return rows

    t0 = time.perf_counter()
    rows = bench()
    total_s = time.perf_counter() - t0
    b, m = cfg.data.train_batch_size, cfg.rollout.n_code
    chunks = math.ceil(b * m / max(1, cfg.rollout.batch_size))
    print(
        f"model: {model_note}; B={b} M={m} N={cfg.rollout.n_tests}, rollout.batch_size="
        f"{cfg.rollout.batch_size}: {chunks} test-rollout chunk(s) per step; sandbox.workers={cfg.sandbox.workers}; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    header = f"{'it':>3} {'serial s':>9} {'gen s':>7} {'overlapped s':>13} {'gen s':>7} {'bg busy s':>10}"
    print(header + f" {'overlap s':>10} {'phases s':>9}")
    differ: list[tuple[int, list[str]]] = []
    for i, (s, o) in enumerate(zip(rows["serial"], rows["overlap"], strict=True), 1):
        busy = o["time/overlap/prepare_s"] + o["time/overlap/sandbox_s"]
        phases = o["time/iteration_s"] + o["time/overlap_s"]
        print(
            f"{i:>3} {s['time/iteration_s']:>9.2f} {s['time/rollout_tests_s']:>7.2f} {o['time/iteration_s']:>13.2f} "
            f"{o['time/rollout_tests_s']:>7.2f} "
            f"{busy:>10.2f} {o['time/overlap_s']:>10.2f} {phases:>9.2f}"
        )
        if bad := _same(s, o):
            differ.append((i, bad))
    steady = slice(1, None) if len(rows["serial"]) > 1 else slice(None)

    def med(arm: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[arm][steady])

    serial_s, overlap_s = med("serial", "time/iteration_s"), med("overlap", "time/iteration_s")
    print(
        f"medians of iterations 2..: serial step {serial_s:.2f} s, overlapped step {overlap_s:.2f} s "
        f"(x{overlap_s / serial_s:.3f}); overlap {med('overlap', 'time/overlap_s'):.2f} s; serial's gate + "
        f"execute {med('serial', 'time/gate_tests_s') + med('serial', 'time/execute_s'):.2f} s, the overlapped "
        f"step's wait for them {med('overlap', 'time/gate_tests_s') + med('overlap', 'time/execute_s'):.2f} s"
    )
    print(f"whole bench {total_s:.1f} s")
    if differ:
        for i, keys in differ:
            print(f"iteration {i}: the runs differ in {keys[:8]}", file=sys.stderr)
        return 1
    print(f"every non-timing value of {len(rows['serial'])} iterations equal in both runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
