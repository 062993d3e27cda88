"""Prefect's share of a pipeline run: a temporary API per stage (before) vs one API per run (``make run`` now).

What it measures, in one run: ``--stages`` processes that each run one Prefect flow of ``--tasks`` tasks (a DVC
stage in miniature), three ways —
  * floor: the same processes calling the flow's function without Prefect (``flow.fn``, ``task.fn``): Python
    start-up and imports, what no orchestration choice can remove;
  * per-stage API: no ``PREFECT_API_URL``, so every process starts Prefect's temporary server (what each DVC
    stage did before ``flows.pipeline``);
  * one API: :func:`flows.prefect_server.shared_api` starts one server (its start-up is counted) and every
    process connects to it.
Orchestration overhead = wall time above the floor. It is printed in seconds and as a share of a ``make run``
of ``--run-wall-s`` seconds (pass the measured wall time of the run you compare against).

What it does not: run the real stages (their work is the same either way).
How to run: ``python bench/orchestration_bench.py [--stages 5 --tasks 20 --repeats 2 --run-wall-s 540]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import flows  # noqa: E402,F401  (the entry-point environment defaults, before Prefect loads)
from flows.prefect_server import shared_api  # noqa: E402

STAGE = """
import flows
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

@task(cache_policy=NO_CACHE)
def step(i):
    return i * i

FLOOR = {floor}


@flow(name="bench-stage")
def stage(n):
    run = step.fn if FLOOR else step
    return sum(run(i) for i in range(n))


print(stage.fn({tasks}) if FLOOR else stage({tasks}))
"""


def _stage_s(tasks: int, floor: bool, env: dict[str, str]) -> float:
    code = STAGE.format(tasks=tasks, floor=floor)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"bench stage failed:\n{proc.stderr[-2000:]}")
    return elapsed


def _pipeline_s(stages: int, tasks: int, mode: str, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds of all stages, seconds of those spent starting the shared server)."""
    if mode != "shared":
        return sum(_stage_s(tasks, mode == "floor", env) for _ in range(stages)), 0.0
    t0 = time.perf_counter()
    with shared_api() as url:
        started = time.perf_counter() - t0
        total = sum(_stage_s(tasks, False, {**env, "PREFECT_API_URL": url}) for _ in range(stages))
    return started + total, started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--stages", type=int, default=5, help="processes per pipeline (make run has 5 stages)"
    )
    parser.add_argument("--tasks", type=int, default=20, help="tasks per stage's flow")
    parser.add_argument(
        "--repeats", type=int, default=2, help="pipelines per mode (interleaved); min is kept"
    )
    parser.add_argument(
        "--run-wall-s", type=float, default=540.0, help="wall time of the make run compared to"
    )
    args = parser.parse_args(argv)

    home = tempfile.mkdtemp(prefix="codea1-orch-bench-")
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=home, PYTHONPATH=str(REPO), PREFECT_LOGGING_LEVEL="WARNING")
    os.environ.update(PREFECT_HOME=home)
    os.environ.pop("PREFECT_API_URL", None)
    _stage_s(1, False, env)  # create and migrate the database once, so no mode pays the first-run cost

    runs: dict[str, list[float]] = {"floor": [], "per-stage": [], "shared": []}
    server_s: list[float] = []
    for _ in range(args.repeats):
        for mode in runs:
            wall, started = _pipeline_s(args.stages, args.tasks, mode, env)
            runs[mode].append(wall)
            if mode == "shared":
                server_s.append(started)
    floor = min(runs["floor"])
    load = os.getloadavg()[0]
    print(f"{args.stages} stages x {args.tasks} tasks, min of {args.repeats} (load average {load:.2f}):")
    print(f"  {'mode':28s} {'wall s':>8s} {'overhead s':>11s} {'of run':>8s}")
    for mode, label in (
        ("floor", "no Prefect (floor)"),
        ("per-stage", "temporary API per stage"),
        ("shared", "one API per run"),
    ):
        wall = min(runs[mode])
        over = wall - floor
        print(f"  {label:28s} {wall:8.1f} {over:11.1f} {100 * over / args.run_wall_s:7.1f}%")
    print(f"  one API's server start-up: {min(server_s):.1f} s (median {statistics.median(server_s):.1f} s)")
    saved = min(runs["per-stage"]) - min(runs["shared"])
    print(
        f"  saved per run: {saved:.1f} s; ratio per-stage/shared overhead: "
        f"{(min(runs['per-stage']) - floor) / max(min(runs['shared']) - floor, 1e-9):.2f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
