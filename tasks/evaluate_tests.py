"""Test-LLM benchmark evaluation task: generate suites, run the core's two-phase plan (docs/method.md §13.2).

What it does: :func:`evaluate_tests` — Test LLM on held-out problems with references: one suite per
problem written against the reference (white-box, the UnLeakedTestBench setting); the core
(:mod:`codea1_core.evaluation.suites`) plans phase 1 (first ``eval.tests_per_suite`` asserts on the
reference: pass@k) and phase 2 (the suites that pass, on cached mutants: mut@k, Mul); every phase runs
through :func:`tasks.execute.run_jobs`. :func:`cached_mutants` generates mutants once per
(source, max, seed) and caches them on disk under a content hash.

What it does not: decide which benchmarks to run or write reports (``flows/evaluate.py`` does). Past
``sandbox.max_infra_failure_frac`` of ``infra_error`` calls a phase aborts with
:class:`tasks.execute.InfraFailure` (D4).

How to run: through ``python -m flows.evaluate``; unit-tested in ``tests/core/evaluation/test_evaluation.py`` and with
real data in ``tests/tasks/test_eval_sanity.py``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from codea1_core.atomic import write_text_atomic
from codea1_core.config import Config
from codea1_core.evaluation.suites import SuiteRecord, plan_suites, suite_metrics
from codea1_core.models.sampling import sampling_params
from codea1_core.types import Problem
from tasks.execute import run_jobs

MUTANT_CACHE_VERSION = "1"


def cached_mutants(source: str, max_mutants: int, seed: int, cache_dir: str | Path) -> list[str]:
    """Mutant sources of ``source``, generated once and cached as JSON under a content hash."""
    from codea1_core.evaluation.mutants import generate_mutants

    key = hashlib.sha256(f"{MUTANT_CACHE_VERSION}\0{max_mutants}\0{seed}\0{source}".encode()).hexdigest()
    path = Path(cache_dir) / f"{key[:2]}/{key}.json"
    if path.is_file():
        try:
            return list(json.loads(path.read_text(encoding="utf-8"))["mutants"])
        except (ValueError, KeyError, TypeError):
            pass  # a damaged cache entry is regenerated below
    try:
        mutants = [m.source for m in generate_mutants(source, max_mutants=max_mutants, seed=seed)]
    except ValueError:  # reference does not parse: no mutants, the problem drops out of mut@k
        mutants = []
    write_text_atomic(path, json.dumps({"mutants": mutants}))
    return mutants


def generate_suites(problems: Sequence[Problem], policy: Any, cfg: Config) -> list[str]:
    """One test response per problem, written against its reference (white-box, §4.2 prompt, K tests)."""
    from codea1_core.method.prompts import test_messages

    if not problems:
        return []
    prompts = [test_messages(p, p.reference_solution, cfg.reward.k) for p in problems]
    outs = policy.generate(prompts, 1, sampling_params(cfg, "eval", "test", cfg.seed + 1))
    return [row[0].text for row in outs]


def evaluate_tests(
    policy: Any,
    problems: Sequence[Problem],
    cfg: Config,
    executor: Any,
    bench: str,
    cache_dir: str | Path,
    subsets: dict[str, list[int]] | None = None,
) -> tuple[dict[str, float], list[SuiteRecord]]:
    """Test-LLM metrics (``test/<bench>/pass@k``, ``mut@k``, ``mul``) and the per-problem records."""
    texts = generate_suites(problems, policy, cfg)
    return score_suites(problems, texts, cfg, executor, bench, cache_dir, subsets)


def score_suites(
    problems: Sequence[Problem],
    texts: Sequence[str],
    cfg: Config,
    executor: Any,
    bench: str,
    cache_dir: str | Path,
    subsets: dict[str, list[int]] | None = None,
) -> tuple[dict[str, float], list[SuiteRecord]]:
    """The core's two-phase plan run: suites on the references, then the passing ones on mutants.

    ``subsets`` (name -> problem indices) are aggregated again from the same records as ``<bench>_<name>``.
    """
    k, frac = cfg.eval.tests_per_suite, cfg.sandbox.max_infra_failure_frac
    rel, abs_ = cfg.sandbox.float_rel_tol, cfg.sandbox.float_abs_tol
    plan = plan_suites(problems, texts, k, cfg.tests.parse_mode, cfg.tests.literal_answers)
    ref_jobs = plan.reference_jobs()
    ref_names = [p.id for p, s in zip(plan.problems, plan.suites, strict=True) if s]
    ref = run_jobs(executor, ref_jobs, frac, f"test/{bench} reference", ref_names)
    verdicts = plan.reference_verdicts(ref, rel, abs_)
    targets = plan.mutant_targets(verdicts)
    mutants = [
        cached_mutants(problems[i].reference_solution, cfg.eval.max_mutants, cfg.seed, cache_dir)
        for i in targets
    ]
    mut_jobs = plan.mutant_jobs(verdicts, mutants)
    mut_names = [problems[i].id for i, sources in zip(targets, mutants, strict=True) for _ in sources]
    mut = run_jobs(executor, mut_jobs, frac, f"test/{bench} mutants", mut_names)
    records = plan.records(verdicts, mutants, mut, rel, abs_)
    return suite_metrics(bench, records, k, subsets), records


@task(name="evaluate_tests", task_run_name="evaluate_tests[{bench}]", cache_policy=NO_CACHE)
def evaluate_tests_task(
    policy: Any,
    problems: list[Problem],
    cfg: Config,
    executor: Any,
    bench: str,
    cache_dir: str,
    subsets: dict[str, list[int]] | None = None,
) -> dict[str, float]:
    """Prefect wrapper of :func:`evaluate_tests` (metrics only; ``subsets``: e.g. the lab's seen/unseen)."""
    return evaluate_tests(policy, problems, cfg, executor, bench, cache_dir, subsets)[0]
