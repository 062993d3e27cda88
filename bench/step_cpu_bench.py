"""One training step's CPU work at the paper's scale (B = 256, M = N = 8), per phase, through the real functions.

What it does: builds one step's synthetic completions shaped like the recipe's (``configs/qwen2.5-coder-1.5b.yaml``:
B problems of the lab generator, M code completions each, N test completions per code) and runs them through the
functions the training step's tasks call, phase by phase:

    parse       ``tasks.rollout.extract_codes`` + ``tasks.rollout.parse_suites`` (``codea1_core.method.parsing``)
    gate        ``gates.generated_tests.gate_columns`` + ``check_tests`` (the GX gate) + ``tasks.rollout.apply_gate``
    plan        ``tasks.mistake_book.retrieve_replay`` + ``codea1_core.method.outcomes.plan_problem``
    reference   the reference jobs in the sandbox (``tasks.execute.run_jobs``, ``sandbox.make_executor``)
    candidates  ``ProblemPlan.candidate_jobs``, then those jobs in the sandbox (``run_jobs``); timed apart
    assemble    ``ProblemPlan.assemble``: every comparison, in the parent (``codea1_core.method.outcomes``)
    score       ``codea1_core.method.rewards.score_problem`` + ``aggregate_metrics``
    merge       ``tasks.mistake_book.merge_mistake_book`` (its plain function: the book update and its JSON)

Code completions: correct (the reference), wrong (the lab's buggy variants), raising, and hanging briefly (a busy
loop of ``--spin`` iterations per call, about 0.8 ms, then the reference). The lab's programs are one-liners, so the
sandbox's CPU is mostly the per-program and per-call machinery plus those busy loops (half of it at the default;
``--spin 0`` leaves the machinery alone, the least a step's sandbox can cost); the ratio below depends on it.
Test completions: suites of 5-10 asserts in one fenced block (answers mostly right, some wrong, a few malformed lines
and duplicates, as ``bench/gate_bench.py``). The Mistake Book starts with tests stored for every problem, so each
candidate replays ``mistake_book.top_k`` of them, as in a step after the first epoch.

It prints per phase wall and CPU seconds (CPU: this process; sandbox phases also the workers, zygotes and children,
from /proc), calls and calls/s; the sandbox's calls/s on a sample of candidate jobs with 1 and 2 workers (fresh pools,
same jobs); the ratio (non-sandbox phases together) / (sandbox phases) in CPU seconds, which a shared machine's load
does not inflate, against ``--target-ratio`` (0.25); the projected wall on an idle ``--cores``-core node (model: the
sandbox phases' CPU spread over the cores with perfect scaling, the other phases serial in the parent, their CPU);
and the gate's CPU per row at B/4 and B problems (rows x1 and x4), whose ratio should stay near 4
(``--target-gate-growth``, 6). Exit status 1 when a target is missed.

What it does not: generate with a model, build the GRPO batches or update (``bench/gpu_step_bench.py`` does), run
Prefect or MLflow (``bench/iteration_bench.py`` measures their share), or time out calls (a real step's time-outs
only lengthen the sandbox phases).

Run: ``python bench/step_cpu_bench.py [--scale 1.0] [--workers 2] [--params FILE] [--json FILE] [key=value ...]``;
``--scale 0.125`` is B = 32 (``tests/bench/test_step_cpu_bench.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import flows  # noqa: E402,F401  (the entry-point environment defaults, before Prefect and GX load)
from codea1_core.config import Config, LabConfig, load_config  # noqa: E402
from codea1_core.data.lab import FAMILIES, call_text, evaluate_trusted, lab_problems  # noqa: E402
from codea1_core.method.parsing import clear_memo, silence_parse_warnings  # noqa: E402
from codea1_core.types import Problem, TestCase  # noqa: E402

RECIPE = REPO / "configs" / "qwen2.5-coder-1.5b.yaml"
POOL = 48
"""Distinct calls per problem the synthetic suites draw from (64 suites per problem share them)."""
SPIN = 40_000
"""Iterations of the busy loop a briefly-hanging candidate runs before each answer (``--spin``; ~0.8 ms here)."""
CODE_KINDS = (("correct", 0.4), ("wrong", 0.3), ("raising", 0.15), ("slow", 0.15))
SANDBOX_PHASES = ("reference", "candidates")
BAD_LINES = (
    "assert {ep}(1 == 2",  # syntax error (parser)
    "assert {ep}(1) != 2",  # not an equality (parser)
    "assert {ep}(().__class__) == 1",  # dunder (gate)
    "assert {ep}(x := 3) == 3",  # walrus (gate)
    "assert {ep}(open('/etc/passwd')) == 1",  # forbidden name (gate)
)


# --------------------------------------------------------------------------------------------------
# Synthetic completions
# --------------------------------------------------------------------------------------------------
def step_problems(b: int, seed: int) -> list[Problem]:
    """``b`` lab training problems, drawn evenly over the families (ids ``lab/<family>/<i>``)."""
    families = len(lab_problems(replace(LabConfig(), train_per_family=1), "train"))
    per_family = max(12, math.ceil(b / families))
    pool = lab_problems(replace(LabConfig(), train_per_family=per_family), "train")
    if b > len(pool):
        raise SystemExit(f"--scale: {b} problems asked, the lab offers {len(pool)}")
    return random.Random(seed).sample(pool, b)


def _wrong_value(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, list):
        return [*value, 0]
    return None


def _code(problem: Problem, kind: str, rng: random.Random, spin: int) -> str:
    family = FAMILIES[problem.metadata["family"]]
    head, body = problem.reference_solution.split("\n", 1)
    if kind == "wrong" and problem.metadata.get("buggy"):
        return rng.choice(problem.metadata["buggy"])
    if kind in ("wrong", "raising"):
        return f"def {family.name}({family.args}):\n    raise ValueError('unsupported input')"
    if kind == "slow":
        return f"{head}\n    for _ in range({spin}):\n        pass\n{body}"
    return problem.reference_solution


def _suite(ep: str, pool: list[str], right: list[Any], wrong: list[Any], rng: random.Random) -> str:
    lines: list[str] = []
    for i in rng.sample(range(len(pool)), rng.randint(5, 10)):
        r = rng.random()
        if r < 0.03:
            lines.append(rng.choice(BAD_LINES).format(ep=ep))
        elif r < 0.05 and lines:
            lines.append(lines[-1])  # a duplicate call
        else:
            answer = right[i] if rng.random() < 0.7 else wrong[i]
            lines.append(f"assert {pool[i]} == {answer!r}")
    return "Tests:\n```python\n" + "\n".join(lines) + "\n```\n"


def completions(
    problems: list[Problem], m: int, n: int, seed: int, spin: int = SPIN
) -> tuple[list[list[Any]], list[list[list[Any]]], list[list[TestCase]]]:
    """Per problem: M code completions, N test completions per code, and ``POOL`` (call, right answer) tests."""
    code_out, test_out, golden = [], [], []
    kinds, weights = zip(*CODE_KINDS, strict=True)
    for b, p in enumerate(problems):
        rng = random.Random(f"{seed}/{b}")
        family, params = FAMILIES[p.metadata["family"]], p.metadata["params"]
        pool = list(dict.fromkeys(t.call for t in (*p.tests, *p.plus_tests)))
        for _ in range(20 * POOL):
            if len(pool) >= POOL:
                break
            call = call_text(family.name, family.typical(params, rng))
            if call not in pool:
                pool.append(call)
        right = evaluate_trusted(p.reference_solution, pool)
        bug = (p.metadata.get("buggy") or [p.reference_solution])[0]
        wrong = [
            w if not isinstance(w, Exception) and w != r else _wrong_value(r)
            for w, r in zip(evaluate_trusted(bug, pool), right, strict=True)
        ]
        codes = [_code(p, rng.choices(kinds, weights)[0], rng, spin) for _ in range(m)]
        code_out.append([SimpleNamespace(text=f"```python\n{c}\n```") for c in codes])
        test_out.append(
            [
                [SimpleNamespace(text=_suite(p.entry_point, pool, right, wrong, rng)) for _ in range(n)]
                for _ in codes
            ]
        )
        golden.append([TestCase(c, v) for c, v in zip(pool, right, strict=True)])
    return code_out, test_out, golden


def seeded_book(cfg: Config, problems: list[Problem], golden: list[list[TestCase]]) -> Any:
    """A Mistake Book holding ``2 * top_k`` stored tests per problem (a step after the first epoch)."""
    from codea1_core.method.mistake_book import starting_book

    book = starting_book(cfg, None)
    if book is not None:
        for p, tests in zip(problems, golden, strict=True):
            book.update(p.id, tests[: 2 * cfg.mistake_book.top_k], [], 0)
    return book


# --------------------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------------------
def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process, its reaped children and (recursively) its live descendants."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0.0
    own = sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return own + sum(_tree_cpu_s(int(k)) for k in kids)


def _pool_cpu_s(executor: Any) -> float:
    return sum(_tree_cpu_s(w.proc.pid) for w in getattr(executor, "_workers", ()))


@dataclass
class Phases:
    """Wall, CPU and calls per phase, in the order run."""

    rows: dict[str, dict[str, float]] = field(default_factory=dict)

    @contextlib.contextmanager
    def phase(self, name: str, executor: Any = None) -> Iterator[dict[str, float]]:
        rec: dict[str, float] = {"calls": 0.0}
        cpu0, t0 = time.process_time() + (_pool_cpu_s(executor) if executor else 0.0), time.perf_counter()
        yield rec
        rec["wall_s"] = time.perf_counter() - t0
        rec["cpu_s"] = time.process_time() + (_pool_cpu_s(executor) if executor else 0.0) - cpu0
        self.rows[name] = rec


def _calls(outcomes: list[list[Any]]) -> int:
    return sum(len(o) for o in outcomes)


def run_step(
    cfg: Config, problems: list[Problem], code_out: Any, test_out: Any, book: Any, out_dir: Path
) -> dict:
    """One step's CPU phases on ``cfg.sandbox``'s executor; returns the phases, gate rows and candidate jobs."""
    from codea1_core.method.outcomes import plan_problem
    from codea1_core.method.rewards import aggregate_metrics, score_problem
    from gates.generated_tests import check_tests, gate_columns
    from sandbox import make_executor
    from tasks.execute import run_jobs
    from tasks.mistake_book import merge_mistake_book, retrieve_replay
    from tasks.rollout import apply_gate, extract_codes, parse_suites

    frac = cfg.sandbox.max_infra_failure_frac
    p = Phases()
    # the GX context and its suite are built once per run, not per step: warm them outside the timing
    warm = parse_suites(problems[:1], test_out[:1], cfg.tests)
    check_tests(gate_columns(problems[:1], warm), cfg.tests)
    clear_memo()  # the parser's memos start empty, as in a new run
    with make_executor(cfg.sandbox) as ex:
        ex.run_many([("def f():\n    return 1\n", ["f()"])] * 2 * cfg.sandbox.workers)  # warm pool
        with p.phase("parse") as rec:
            codes = extract_codes(code_out)
            suites = parse_suites(problems, test_out, cfg.tests)
            rec["calls"] = sum(len(s) for row in suites for s in row)  # responses parsed
        gate_growth = gate_per_row(cfg, problems, suites)
        with p.phase("gate") as rec:
            table = gate_columns(problems, suites)
            gate = check_tests(table, cfg.tests)
            apply_gate(suites, gate.reasons)
            rec["calls"] = len(table["call"])  # rows
        gate_growth["x4"] = {"rows": rec["calls"], "cpu_s": p.rows["gate"]["cpu_s"]}
        with p.phase("plan") as rec:
            replay = retrieve_replay(book, problems, cfg)
            plans = [plan_problem(*a) for a in zip(problems, codes, suites, replay, strict=True)]
            ref_jobs = [plan.reference_job() for plan in plans]
            rec["calls"] = len(plans)  # problems planned
        with p.phase("reference", ex) as rec:
            ref_out = run_jobs(ex, ref_jobs, frac, "reference")
            rec["calls"] = _calls(ref_out)
        with p.phase("plan_candidates") as rec:
            cand_jobs = [plan.candidate_jobs(r) for plan, r in zip(plans, ref_out, strict=True)]
            flat_jobs = [j for jobs in cand_jobs for j in jobs]
            rec["calls"] = len(flat_jobs)  # jobs built
        with p.phase("candidates", ex) as rec:
            flat = run_jobs(ex, flat_jobs, frac, "candidates")
            rec["calls"] = _calls(flat)
        with p.phase("assemble") as rec:
            matrices, i, s = [], 0, cfg.sandbox
            for plan, ref, jobs in zip(plans, ref_out, cand_jobs, strict=True):
                matrices.append(plan.assemble(ref, flat[i : i + len(jobs)], s.float_rel_tol, s.float_abs_tol))
                i += len(jobs)
            rec["calls"] = _calls(ref_out) + _calls(flat)  # outcomes read back
        with p.phase("score") as rec:
            scores = [score_problem(m, cfg.reward) for m in matrices]
            metrics = aggregate_metrics(scores)
            rec["calls"] = len(scores)  # problems scored
        with p.phase("merge") as rec:
            metrics |= merge_mistake_book.fn(book, matrices, 1, out_dir / "mistake_book.json")
            rec["calls"] = len(matrices)  # problems merged
    statuses: dict[str, int] = {}
    for o in ref_out + flat:
        for c in o:
            statuses[c.status] = statuses.get(c.status, 0) + 1
    return {
        "phases": p.rows,
        "gate": gate_growth,
        "jobs": flat_jobs,
        "statuses": statuses,
        "metrics": {k: v for k, v in metrics.items() if k in SHOWN},
    }


SHOWN = ("code/reward_mean", "test/reward_mean", "test/validity", "mistake_book/size", "test/rejected_rate")


def gate_per_row(cfg: Config, problems: list[Problem], suites: list) -> dict[str, dict[str, float]]:
    """The gate (columns, GX, verdicts) on the first quarter of the problems: rows x1 against the step's x4."""
    from gates.generated_tests import check_tests, gate_columns
    from tasks.rollout import apply_gate

    quarter = max(1, len(problems) // 4)
    copy = [[list(per_code) for per_code in per_problem] for per_problem in suites[:quarter]]
    c0 = time.process_time()
    table = gate_columns(problems[:quarter], copy)
    apply_gate(copy, check_tests(table, cfg.tests).reasons)
    return {"x1": {"rows": float(len(table["call"])), "cpu_s": time.process_time() - c0}}


def scaling(cfg: Config, jobs: list[tuple[str, list[str]]]) -> dict[int, float]:
    """Calls/s of the same candidate jobs on fresh pools of 1 and 2 workers (after a warm-up)."""
    from sandbox import make_executor

    rates = {}
    for workers in (1, 2):
        with make_executor(replace(cfg.sandbox, workers=workers)) as ex:
            ex.run_many(jobs[: 2 * workers])
            t0 = time.perf_counter()
            calls = _calls(ex.run_many(jobs))
            rates[workers] = calls / (time.perf_counter() - t0)
    return rates


def summary(result: dict, cores: int) -> dict[str, float]:
    """The ratio to the target, the projection on ``cores`` cores and the gate's growth from rows x1 to x4.

    In CPU seconds, which a shared machine's load does not inflate: the non-sandbox phases run serially in
    the parent (their CPU is their wall on an idle core), the sandbox phases spread over the workers.
    """
    phases = result["phases"]
    sandbox = sum(phases[n]["cpu_s"] for n in SANDBOX_PHASES)
    other = sum(r["cpu_s"] for n, r in phases.items() if n not in SANDBOX_PHASES)
    gate = result["gate"]
    per_row = {k: g["cpu_s"] / g["rows"] if g["rows"] else 0.0 for k, g in gate.items()}
    return {
        "sandbox_cpu_s": sandbox,
        "other_cpu_s": other,
        "ratio": other / sandbox if sandbox else math.inf,
        "sandbox_wall_s": sum(phases[n]["wall_s"] for n in SANDBOX_PHASES),
        "other_wall_s": sum(r["wall_s"] for n, r in phases.items() if n not in SANDBOX_PHASES),
        "projected_sandbox_s": sandbox / cores,
        "projected_wall_s": other + sandbox / cores,
        "gate_rows_x1": gate["x1"]["rows"],
        "gate_rows_x4": gate["x4"]["rows"],
        "gate_growth": gate["x4"]["cpu_s"] / gate["x1"]["cpu_s"] if gate["x1"]["cpu_s"] else math.inf,
        "gate_row_ratio": gate["x4"]["rows"] / gate["x1"]["rows"] if gate["x1"]["rows"] else math.inf,
        "gate_us_per_row_x1": 1e6 * per_row["x1"],
        "gate_us_per_row_x4": 1e6 * per_row["x4"],
    }


def missed_targets(s: dict[str, float], target_ratio: float, target_gate_growth: float) -> list[str]:
    """One line per missed target: the non-sandbox share, the gate's growth per row count."""
    missed = []
    if s["ratio"] > target_ratio:
        missed.append(f"non-sandbox / sandbox CPU = {s['ratio']:.1%} > --target-ratio {target_ratio:.0%}")
    growth = s["gate_growth"] * 4 / s["gate_row_ratio"]  # rows exactly x4 -> the time ratio itself
    if growth > target_gate_growth:
        missed.append(
            f"gate: rows x4 took x{growth:.2f} the time (> --target-gate-growth {target_gate_growth})"
        )
    return missed


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------
def report(cfg: Config, result: dict, rates: dict[int, float], s: dict[str, float], args: Any) -> None:
    sb = cfg.sandbox
    load = os.getloadavg()
    b, m, n = len(result["problems"]), cfg.rollout.n_code, cfg.rollout.n_tests
    print(
        f"one step: B={b} problems, M={m} codes, N={n} suites: {b * m} programs, {b * m * n} suites; "
        f"slow codes spin {args.spin} iterations per call"
    )
    print(
        f"sandbox: {sb.backend}, {sb.workers} workers, call_timeout_s={sb.call_timeout_s}; load average {load}"
    )
    print(f"{'phase':16s} {'wall s':>8s} {'CPU s':>8s} {'calls':>9s} {'calls/s':>10s}  what a call is")
    units = {
        "parse": "response",
        "gate": "row",
        "plan": "problem",
        "reference": "sandbox call",
        "plan_candidates": "job",
        "candidates": "sandbox call",
        "assemble": "outcome",
        "score": "problem",
        "merge": "problem",
    }
    for name, r in result["phases"].items():
        rate = r["calls"] / r["wall_s"] if r["wall_s"] else 0.0
        tag = " (sandbox)" if name in SANDBOX_PHASES else ""
        print(
            f"{name:16s} {r['wall_s']:8.2f} {r['cpu_s']:8.2f} {r['calls']:9.0f} {rate:10.0f}  {units[name]}{tag}"
        )
    print(f"call statuses: {dict(sorted(result['statuses'].items()))}")
    print(f"metrics: {', '.join(f'{k}={v:.3g}' for k, v in result['metrics'].items())}")
    print(
        f"sandbox calls/s on {args.scaling_jobs} candidate jobs: 1 worker {rates[1]:.0f}, 2 workers {rates[2]:.0f}"
        f" (x{rates[2] / rates[1]:.2f}; 2.00 is linear; this machine's 2 cores are shared)"
    )
    print(
        f"CPU: non-sandbox phases {s['other_cpu_s']:.2f} s / sandbox phases {s['sandbox_cpu_s']:.2f} s = "
        f"{s['ratio']:.1%} (target <= {args.target_ratio:.0%}); wall here {s['other_wall_s']:.2f} s / "
        f"{s['sandbox_wall_s']:.2f} s"
    )
    print(
        f"projected on {args.cores} idle cores (the sandbox phases' CPU / {args.cores}, perfect scaling; the rest "
        f"serial, its CPU): sandbox {s['projected_sandbox_s']:.2f} s + the rest {s['other_cpu_s']:.2f} s = "
        f"{s['projected_wall_s']:.2f} s"
    )
    print(
        f"gate CPU per row: {s['gate_us_per_row_x1']:.1f} us at {s['gate_rows_x1']:.0f} rows, "
        f"{s['gate_us_per_row_x4']:.1f} us at {s['gate_rows_x4']:.0f} rows (time x{s['gate_growth']:.2f} for "
        f"rows x{s['gate_row_ratio']:.2f}; target <= x{args.target_gate_growth} for x4)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(RECIPE), help="the recipe's config (B, M, N, reward, book)")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of B (0.125: B = 32)")
    parser.add_argument("--workers", type=int, default=2, help="sandbox workers (params.yaml's 2)")
    parser.add_argument(
        "--scaling-jobs", type=int, default=256, help="candidate jobs of the 1 vs 2 workers run"
    )
    parser.add_argument("--cores", type=int, default=64, help="the projected node's cores")
    parser.add_argument("--target-ratio", type=float, default=0.25, help="max non-sandbox / sandbox CPU")
    parser.add_argument("--target-gate-growth", type=float, default=6.0, help="max gate CPU ratio, rows x4")
    parser.add_argument("--seed", type=int, default=0, help="the synthetic completions' seed")
    parser.add_argument("--spin", type=int, default=SPIN, help="busy-loop iterations per call of a slow code")
    parser.add_argument("--json", default="", help="also write the measurements to this file")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of --params")
    args = parser.parse_args(argv)

    silence_parse_warnings()  # as the entry points do: the synthetic broken asserts warn like model output
    cfg = load_config(args.params, [f"sandbox.workers={args.workers}", *args.overrides])
    b = max(4, round(cfg.data.train_batch_size * args.scale))
    problems = step_problems(b, args.seed)
    code_out, test_out, golden = completions(
        problems, cfg.rollout.n_code, cfg.rollout.n_tests, args.seed, args.spin
    )
    book = seeded_book(cfg, problems, golden)
    with tempfile.TemporaryDirectory(prefix="codea1-step-bench-") as tmp:
        result = run_step(cfg, problems, code_out, test_out, book, Path(tmp))
    result["problems"] = [p.id for p in problems]
    jobs = result.pop("jobs")
    rates = scaling(cfg, random.Random(args.seed).sample(jobs, min(args.scaling_jobs, len(jobs))))
    s = summary(result, args.cores)
    report(cfg, result, rates, s, args)
    missed = missed_targets(s, args.target_ratio, args.target_gate_growth)
    for line in missed:
        print(f"MISSED: {line}")
    if args.json:
        out = {
            **result,
            "scaling_calls_per_s": rates,
            "summary": s,
            "missed": missed,
            "load": os.getloadavg(),
        }
        Path(args.json).write_text(json.dumps(out, indent=1, default=str), encoding="utf-8")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
