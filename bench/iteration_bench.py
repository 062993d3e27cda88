"""Overhead of orchestration + tracking per training iteration: Prefect tasks + MLflow vs plain calls.

What it does: builds two identical training runs (same config, seed, model, problems) and executes their
iterations interleaved inside one Prefect flow: run A calls each task's plain function (``task.fn``) with a
``NullTracker``; run B calls the Prefect tasks (named task runs, API round-trips) and logs to MLflow (metrics,
sample table, outcome parquet, Mistake Book snapshot). Both checkpoint every iteration. Prints per-iteration
wall times and the overhead ratio B/A - 1 (target <= 10% at the default lab size). Iteration 1 is a warm-up and
is reported separately.
What it does not: measure one-off start-up (server start, model loading) — it prints those once for reference.

On a shared machine, run the A/A control (``--aa``: both runs plain) first: on 2 cores shared with other
jobs it showed up to ~30% difference between two IDENTICAL runs, more than the 10% target, so only the
per-task differences of the light tasks (score, gate, merge, log_iteration) resolve the real overhead there.

Run: ``python bench/iteration_bench.py [--params params.yaml] [--iterations 6] [--aa] [key=value ...]``
(uses ``outputs/warmstart/{code,test}`` when present, else a random-init model of the lab size).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import flows  # noqa: E402,F401  (the entry-point environment defaults, before Prefect and MLflow load)


def _model_paths(cfg, tmp: Path) -> tuple[str, str, str]:
    if (
        Path(cfg.model.code_path, "config.json").is_file()
        and Path(cfg.model.test_path, "config.json").is_file()
    ):
        return cfg.model.code_path, cfg.model.test_path, "warm-started lab models"
    from codea1_core.data.warmstart_data import tokenizer_corpus
    from codea1_core.models.tiny_model import build_tiny_model

    lab = cfg.lab
    path = build_tiny_model(
        tmp / "model",
        tokenizer_corpus(lab, k=cfg.reward.k),
        hidden_size=lab.hidden_size,
        num_layers=lab.num_layers,
        num_heads=lab.num_heads,
        intermediate_size=lab.intermediate_size,
        vocab_size=lab.vocab_size,
    )
    return str(path), str(path), "random-init model of the lab size (no warm start found)"


def _timing(call, sink: dict[str, list[float]], it: int):
    """Wrap a task caller to record seconds per task name (iteration 1 is warm-up, not recorded)."""

    def timed(task, *args, **kwargs):
        t = time.perf_counter()
        out = call(task, *args, **kwargs)
        if it > 1:
            sink.setdefault(task.name, []).append(time.perf_counter() - t)
        return out

    return timed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument(
        "--aa", action="store_true", help="A/A control: both runs plain (measures the noise floor)"
    )
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)

    from prefect import flow

    from codea1_core.config import load_config
    from flows import train as T
    from flows.steps import as_function, as_task
    from sandbox import make_executor
    from tracking.runs import NullTracker, make_tracker

    tmp = Path(tempfile.mkdtemp(prefix="codea1_bench_"))
    cfg = load_config(args.params, args.overrides)
    code_path, test_path, model_note = _model_paths(cfg, tmp)
    common = {
        "model.code_path": code_path,
        "model.test_path": test_path,
        "eval.every": 0,
        "orchestration.resume": "never",
        "orchestration.max_steps": args.iterations,
        "tracking.tracking_uri": f"sqlite:///{tmp}/mlflow.db",
        "tracking.artifact_location": str(tmp / "artifacts"),
    }
    bare_cfg = cfg.replace(**common, **{"orchestration.checkpoint_dir": str(tmp / "bare")})
    full_cfg = cfg.replace(
        **common, **{"orchestration.checkpoint_dir": str(tmp / "full"), "tracking.backend": "mlflow"}
    )

    @flow(name="iteration-bench")
    def bench() -> tuple[list[float], list[float], float]:
        a_s, b_s = [], []
        per_task: dict[str, dict[str, list[float]]] = {"plain": {}, "prefect": {}}
        with make_executor(cfg.sandbox) as ex:
            t0 = time.perf_counter()
            bare = T.setup(bare_cfg, lambda *a, **k: NullTracker(), ex)
            full = T.setup(full_cfg, (lambda *a, **k: NullTracker()) if args.aa else make_tracker, ex)
            setup_s = time.perf_counter() - t0
            for it in range(1, min(args.iterations, bare.total) + 1):
                plain = _timing(as_function, per_task["plain"], it)
                prefect = _timing(as_function if args.aa else as_task, per_task["prefect"], it)
                order = [(bare, plain, a_s), (full, prefect, b_s)]
                for run, call, out in order if it % 2 else reversed(order):  # alternate who goes first
                    t = time.perf_counter()
                    T.iteration(run, it, call)
                    out.append(time.perf_counter() - t)
        full.tracker.end()
        return a_s, b_s, setup_s, per_task

    t0 = time.perf_counter()
    a_s, b_s, setup_s, per_task = bench()
    total_s = time.perf_counter() - t0
    if args.aa:
        print("A/A CONTROL: both columns are plain runs; any 'overhead' below is machine noise")
    print(
        f"model: {model_note}; B={cfg.data.train_batch_size} M={cfg.rollout.n_code} N={cfg.rollout.n_tests} "
        f"mode={cfg.mode}"
    )
    print(f"{'iteration':>9} {'plain s':>9} {'prefect+mlflow s':>17} {'overhead':>9}")
    for i, (a, b) in enumerate(zip(a_s, b_s, strict=True), 1):
        print(f"{i:>9} {a:>9.2f} {b:>17.2f} {b / a - 1:>9.1%}")
    steady_a, steady_b = (a_s[1:], b_s[1:]) if len(a_s) > 1 else (a_s, b_s)
    ratio = statistics.median(steady_b) / statistics.median(steady_a) - 1
    print(f"steady-state overhead, medians of iterations 2..{len(a_s)}: {ratio:.1%} (target <= 10%)")
    print(
        "per task, median seconds over iterations 2.. (the difference is orchestration + tracking overhead):"
    )
    extra = 0.0
    for name in sorted(per_task["prefect"]):
        a = statistics.median(per_task["plain"][name])
        b = statistics.median(per_task["prefect"][name])
        extra += b - a
        print(f"  {name:<20} {a:8.3f} {b:8.3f}  ({b - a:+.3f})")
    print(
        f"sum of per-task differences: {extra:+.2f} s per iteration = {extra / statistics.median(steady_a):+.1%}"
        " of a plain iteration (less sensitive to machine load than the wall-time ratio)"
    )
    print(f"one-off: setup of both runs {setup_s:.1f} s; whole bench incl. Prefect start {total_s:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
