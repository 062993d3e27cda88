"""Test-time collaboration (docs/method.md §15.6): generate, run through the one guard, let the core pick.

What it does: :func:`solve_benchmark` (task run ``solve_benchmark[<bench>]`` of the evaluate flow, one per
``eval.solve_benchmarks`` entry) scores the chosen candidates of a benchmark with the EvalPlus verdicts, next
to the candidates' mean and best-of-N. :func:`select_many`, the step it shares with ``codea1 solve``
(``flows/solve.py``, no Prefect run), asks the Test LLM for one white-box suite per distinct candidate, runs
the core's plan (:mod:`codea1_core.evaluation.collaboration`) in one :func:`tasks.execute.run_jobs` batch and
returns the core's selection.

What it does not: choose (the core does) or load models (the flows do). Past
``sandbox.max_infra_failure_frac`` of ``infra_error`` calls a batch aborts with
:class:`tasks.execute.InfraFailure` (D4: an infrastructure failure never decides a vote or a verdict).

How to run: ``python -m flows.solve --problem FILE``; unit tests in ``tests/flows/test_solve_attack.py``
(``solve_benchmark.fn``: the task's function, no Prefect run).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from codea1_core.config import Config
from codea1_core.evaluation.collaboration import (
    SolveResult,
    benchmark_jobs,
    distinct_candidates,
    plan_solve,
    solve_metrics,
    suite_prompts,
)
from codea1_core.models.sampling import sampling_params
from codea1_core.types import Problem
from tasks.evaluate import generate_codes
from tasks.execute import run_jobs


def select_many(
    problems: Sequence[Problem],
    candidates: Sequence[Sequence[str]],
    test_policy: Any,
    cfg: Config,
    executor: Any,
) -> list[SolveResult]:
    """Write white-box tests for every distinct candidate, run them all in one batch, pick per problem."""
    distinct = distinct_candidates(candidates)
    prompts = suite_prompts(problems, distinct, cfg.reward.k)
    sampling = sampling_params(cfg, "eval", "test", cfg.seed + 1)
    texts = [row[0].text for row in test_policy.generate(prompts, 1, sampling)] if prompts else []
    plan = plan_solve(problems, distinct, texts, cfg.tests.parse_mode)
    outcomes = run_jobs(executor, plan.jobs(), cfg.sandbox.max_infra_failure_frac, "solve")
    return plan.select(outcomes, cfg.sandbox.float_rel_tol, cfg.sandbox.float_abs_tol)


@task(name="solve_benchmark", task_run_name="solve_benchmark[{bench}]", cache_policy=NO_CACHE)
def solve_benchmark(
    problems: Sequence[Problem],
    code_policy: Any,
    test_policy: Any,
    cfg: Config,
    executor: Any,
    bench: str = "humanevalplus",
) -> dict[str, float]:
    """Pass rate (percent) of the chosen candidates, next to the candidates' mean and best-of-N."""
    codes = generate_codes(problems, code_policy, cfg, cfg.eval.solve_candidates)
    chosen = select_many(problems, codes, test_policy, cfg, executor)
    outcomes = run_jobs(
        executor, benchmark_jobs(problems, chosen), cfg.sandbox.max_infra_failure_frac, f"solve/{bench}"
    )
    rel, abs_ = cfg.sandbox.float_rel_tol, cfg.sandbox.float_abs_tol
    return solve_metrics(bench, problems, codes, chosen, outcomes, rel, abs_)
