"""Code-LLM benchmark evaluation task: generate, execute once, score purely (docs/method.md §13.1).

What it does: :func:`evaluate_code` — Code LLM on one benchmark with the EvalPlus protocol: ``n`` samples
per problem, run through :func:`tasks.execute.run_jobs` for the whole benchmark at once (identical samples
of a problem run once; EvalPlus samples in stages that stop at the first failing input,
:func:`codea1_core.evaluation.verdicts.run_code_jobs`), base and plus verdicts, unbiased pass@k and avg@n.
The plan and the verdicts are the core's (:mod:`codea1_core.evaluation.verdicts`); this module generates and
runs. It is also the in-training validation of ``tasks/score.py``, which is why the Test-LLM evaluation
(mutants) lives apart, in ``tasks/evaluate_tests.py``: the train stage does not depend on the mutant generator.

What it does not: decide which benchmarks to run or write reports (``flows/evaluate.py`` does).
Infrastructure failures are never scored: past ``sandbox.max_infra_failure_frac`` of ``infra_error`` calls
the benchmark aborts with :class:`tasks.execute.InfraFailure` (D4).

How to run: through ``python -m flows.evaluate``; unit-tested with fake policies in
``tests/core/evaluation/test_evaluation.py`` and with real data in ``tests/tasks/test_eval_sanity.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from codea1_core.config import Config
from codea1_core.evaluation.verdicts import build_code_jobs, code_metrics, run_code_jobs, verdicts_for
from codea1_core.models.sampling import sampling_params
from codea1_core.types import Problem
from tasks.execute import check_infra, run_jobs


def generate_codes(
    problems: Sequence[Problem], policy: Any, cfg: Config, n: int, sampling: Any = None
) -> list[list[str]]:
    """``n`` extracted code samples per problem (§4.1 prompt, §5.1 extraction)."""
    from codea1_core.method.parsing import extract_code
    from codea1_core.method.prompts import code_messages

    if not problems:
        return []
    sampling = sampling or sampling_params(cfg, "eval", "code", cfg.seed)
    outs = policy.generate([code_messages(p) for p in problems], n, sampling)
    return [[extract_code(c.text) for c in row] for row in outs]


def evaluate_code(
    policy: Any,
    problems: Sequence[Problem],
    cfg: Config,
    executor: Any,
    bench: str = "val",
    n: int | None = None,
    subsets: dict[str, list[int]] | None = None,
) -> dict[str, float]:
    """Code-LLM metrics of one benchmark (``code/<bench>/...``, percent), plus ``code/<bench>_<subset>/...``."""
    n = n or cfg.eval.n_samples
    codes = generate_codes(problems, policy, cfg, n)
    return score_codes(problems, codes, cfg, executor, bench, subsets)


def score_codes(
    problems: Sequence[Problem],
    codes: Sequence[Sequence[str]],
    cfg: Config,
    executor: Any,
    bench: str,
    subsets: dict[str, list[int]] | None = None,
) -> dict[str, float]:
    """Execute given samples (deduplicated, one guarded run) and aggregate their EvalPlus verdicts.

    ``subsets`` (name -> problem indices) are aggregated again from the same verdicts as ``<bench>_<name>``.
    """
    evalplus = cfg.eval.evalplus_protocol
    jobs = build_code_jobs(problems, codes, evalplus)
    names = [problems[p].id for p in jobs.job_problem]
    label, frac = f"code/{bench}", cfg.sandbox.max_infra_failure_frac

    def run(batch: list, ids: list[int]) -> list:  # the D4 rule once, on the final outcomes
        return run_jobs(executor, batch, 1.0, label, [names[i] for i in ids])

    results = run_code_jobs(problems, jobs, run, evalplus)
    check_infra(results, frac, label, names)
    tols = cfg.sandbox.float_rel_tol, cfg.sandbox.float_abs_tol
    verdicts = verdicts_for(problems, jobs, results, *tols, evalplus)
    metrics = code_metrics(bench, problems, verdicts, cfg.eval.k_list, subsets, evalplus)
    metrics[f"code/{bench}/programs_run"] = float(len(jobs.jobs))
    return metrics


@task(name="evaluate_code", task_run_name="evaluate_code[{bench}]", cache_policy=NO_CACHE)
def evaluate_code_task(
    policy: Any,
    problems: list[Problem],
    cfg: Config,
    executor: Any,
    bench: str,
    subsets: dict[str, list[int]] | None = None,
) -> dict[str, float]:
    """Prefect wrapper of :func:`evaluate_code` (``subsets``: e.g. the lab's seen/unseen split)."""
    return evaluate_code(policy, problems, cfg, executor, bench, subsets=subsets)
