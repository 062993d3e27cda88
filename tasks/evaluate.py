"""Benchmark evaluation tasks: generate, execute once, score purely (ALGORITHM.md §13).

What it does:
  * :func:`evaluate_code` — Code LLM on one benchmark with the EvalPlus protocol: ``n`` samples per
    problem, one ``run_many`` for the whole benchmark (identical samples of a problem run once), base and
    plus verdicts, unbiased pass@k and avg@n (:mod:`codea1_core.evaluation.verdicts`). Also the in-training
    validation hook of ``tasks/score.py`` (same signature).
  * :func:`evaluate_tests` — Test LLM on held-out problems with references: one suite per problem written
    against the reference (white-box, the UnLeakedTestBench setting), first ``eval.tests_per_suite``
    asserts, pass@k on the reference, mut@k on cached Cosmic-Ray mutants, Mul.
  * :func:`cached_mutants` — mutants generated once per (source, max, seed) and cached on disk under a
    content hash.
  * :func:`load_benchmark` — prepared parquet sets, BigCodeBench and UnLeakedTestBench by name.
  * :func:`lab_subsets` — the lab's held-out split cut into ``seen`` (training families, new parameters)
    and ``unseen`` (held-out families); both tasks also report these subsets as ``<bench>_seen`` /
    ``<bench>_unseen`` from the same samples (no extra generation or execution).

What it does not: decide which benchmarks to run or write reports (``flows/evaluate.py`` does).
Infrastructure failures are never scored: a benchmark whose share of ``infra_error`` calls exceeds
``sandbox.max_infra_failure_frac`` raises :class:`SandboxInfraError` (D4).

How to run: through ``python -m flows.evaluate``; unit-tested with fake policies in
``tests/test_evaluation.py`` and with real data in ``tests/test_eval_sanity.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from codea1_core.config import Config
from codea1_core.evaluation.verdicts import (
    INFRA,
    SuiteRecord,
    aggregate_code,
    aggregate_tests,
    build_code_jobs,
    judge_reference,
    mutant_killed,
    reference_exprs,
    verdicts_for,
)
from codea1_core.types import CallOutcome, Problem

MUTANT_CACHE_VERSION = "1"


class SandboxInfraError(RuntimeError):
    """Too many calls failed for infrastructure reasons to report a number (ALGORITHM.md D4)."""


def eval_sampling(cfg: Config, seed_offset: int = 0) -> Any:
    """Evaluation sampling settings (``eval.temperature``, ``eval.top_p``, ``eval.max_new_tokens``)."""
    from codea1_core.models.policy import SamplingParams

    return SamplingParams(
        temperature=cfg.eval.temperature,
        top_p=cfg.eval.top_p,
        top_k=0,
        max_new_tokens=cfg.eval.max_new_tokens,
        seed=cfg.seed + seed_offset,
    )


def check_infra(results: Sequence[Sequence[CallOutcome]], cfg: Config, what: str) -> int:
    """Count ``infra_error`` calls; raise when their share exceeds the configured threshold."""
    total = sum(len(r) for r in results)
    infra = sum(o.status == INFRA for r in results for o in r)
    if total and infra / total > cfg.sandbox.max_infra_failure_frac:
        raise SandboxInfraError(
            f"{what}: {infra}/{total} calls hit sandbox infrastructure errors "
            f"(> sandbox.max_infra_failure_frac={cfg.sandbox.max_infra_failure_frac}); not scoring them"
        )
    return infra


# --------------------------------------------------------------------------------------------------
# Code LLM
# --------------------------------------------------------------------------------------------------


def generate_codes(
    problems: Sequence[Problem], policy: Any, cfg: Config, n: int, sampling: Any = None
) -> list[list[str]]:
    """``n`` extracted code samples per problem (§4.1 prompt, §5.1 extraction)."""
    from codea1_core.method.parsing import extract_code
    from codea1_core.method.prompts import code_messages

    if not problems:
        return []
    outs = policy.generate([code_messages(p) for p in problems], n, sampling or eval_sampling(cfg))
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
    """Execute given samples (one ``run_many``, deduplicated) and aggregate their EvalPlus verdicts.

    ``subsets`` (name -> problem indices) are aggregated again from the same verdicts as ``<bench>_<name>``.
    """
    jobs = build_code_jobs(problems, codes)
    results = executor.run_many(jobs.jobs) if jobs.jobs else []
    check_infra(results, cfg, f"code/{bench}")
    verdicts = verdicts_for(problems, jobs, results, cfg.sandbox.float_rel_tol, cfg.sandbox.float_abs_tol)
    metrics = aggregate_code(bench, problems, verdicts, cfg.eval.k_list)
    metrics[f"code/{bench}/programs_run"] = float(len(jobs.jobs))
    for name, idx in (subsets or {}).items():
        sub = [problems[i] for i in idx]
        metrics |= aggregate_code(f"{bench}_{name}", sub, [verdicts[i] for i in idx], cfg.eval.k_list)
    return metrics


@task(name="evaluate-code", task_run_name="evaluate-code[{bench}]", cache_policy=NO_CACHE)
def evaluate_code_task(
    policy: Any, problems: list[Problem], cfg: Config, executor: Any, bench: str
) -> dict[str, float]:
    """Prefect wrapper of :func:`evaluate_code`, with the lab's seen/unseen subsets when they apply."""
    return evaluate_code(policy, problems, cfg, executor, bench, subsets=lab_subsets(problems))


# --------------------------------------------------------------------------------------------------
# Test LLM
# --------------------------------------------------------------------------------------------------


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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"mutants": mutants}), encoding="utf-8")
    os.replace(tmp, path)
    return mutants


def generate_suites(problems: Sequence[Problem], policy: Any, cfg: Config) -> list[str]:
    """One test response per problem, written against its reference (white-box, §4.2 prompt, K tests)."""
    from codea1_core.method.prompts import test_messages

    if not problems:
        return []
    prompts = [test_messages(p, p.reference_solution, cfg.reward.k) for p in problems]
    outs = policy.generate(prompts, 1, eval_sampling(cfg, seed_offset=1))
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
    """Parse test responses, check them on the references, then run the passing suites on mutants.

    ``subsets`` (name -> problem indices) are aggregated again from the same records as ``<bench>_<name>``.
    """
    from codea1_core.method.parsing import extract_tests

    k = cfg.eval.tests_per_suite
    rel, abs_ = cfg.sandbox.float_rel_tol, cfg.sandbox.float_abs_tol
    suites, generated = [], []
    for problem, text in zip(problems, texts, strict=True):
        parsed = extract_tests(
            text, problem.entry_point, cfg.tests.parse_mode, literal_answers=cfg.tests.literal_answers
        )
        suites.append(list(parsed.tests[:k]))
        generated.append(min(k, len(parsed.tests) + parsed.invalid))
    ref_idx = [i for i, s in enumerate(suites) if s]
    ref_results = executor.run_many(
        [(problems[i].reference_solution, reference_exprs(suites[i])) for i in ref_idx]
    )
    check_infra(ref_results, cfg, f"test/{bench} reference")
    verdicts: list[list | None] = [[] for _ in problems]
    for i, res in zip(ref_idx, ref_results, strict=True):
        verdicts[i] = judge_reference(suites[i], res, rel, abs_)
    jobs, owners = [], []
    for i, (problem, vs) in enumerate(zip(problems, verdicts, strict=True)):
        if vs and all(v.correct for v in vs):
            for source in cached_mutants(
                problem.reference_solution, cfg.eval.max_mutants, cfg.seed, cache_dir
            ):
                jobs.append((source, [v.call for v in vs]))
                owners.append(i)
    mut_results = executor.run_many(jobs) if jobs else []
    check_infra(mut_results, cfg, f"test/{bench} mutants")
    killed = [0] * len(problems)
    completed = [0] * len(problems)
    for i, res in zip(owners, mut_results, strict=True):
        verdict = mutant_killed(verdicts[i], res, rel, abs_)
        if verdict is not None:
            completed[i] += 1
            killed[i] += int(verdict)
    records = [
        SuiteRecord(
            p.id,
            generated[i] if verdicts[i] is not None else 0,
            tuple(verdicts[i] or ()),
            killed[i],
            completed[i],
        )
        for i, p in enumerate(problems)
    ]
    metrics = aggregate_tests(bench, records, k)
    for name, idx in (subsets or {}).items():
        metrics |= aggregate_tests(f"{bench}_{name}", [records[i] for i in idx], k)
    return metrics, records


@task(name="evaluate-tests", task_run_name="evaluate-tests[{bench}]", cache_policy=NO_CACHE)
def evaluate_tests_task(
    policy: Any, problems: list[Problem], cfg: Config, executor: Any, bench: str, cache_dir: str
) -> dict[str, float]:
    """Prefect wrapper of :func:`evaluate_tests` (metrics only), with the lab's seen/unseen subsets."""
    return evaluate_tests(policy, problems, cfg, executor, bench, cache_dir, lab_subsets(problems))[0]


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------


def lab_subsets(problems: Sequence[Problem]) -> dict[str, list[int]]:
    """``seen`` / ``unseen`` problem indices of a lab set (training vs held-out families); ``{}`` otherwise.

    ``seen`` problems are new parameters of training families; ``unseen`` ones belong to families never
    trained on (``codea1_core.data.lab``). Sets with any non-lab problem, or with only one kind, get no subsets.
    """
    from codea1_core.data.lab import FAMILIES

    kinds = []
    for p in problems:
        family = FAMILIES.get(str((p.metadata or {}).get("family", "")))
        if family is None or not p.id.startswith("lab/"):
            return {}
        kinds.append("unseen" if family.heldout else "seen")
    if len(set(kinds)) < 2:
        return {}
    return {name: [i for i, k in enumerate(kinds) if k == name] for name in ("seen", "unseen")}


def load_benchmark(cfg: Config, name: str) -> list[Problem]:
    """Problems of a benchmark by name, capped at ``eval.max_problems``.

    ``bigcodebench`` and ``unleakedtestbench`` read ``eval.bigcodebench_path`` / ``eval.ult_path``;
    every other name reads ``<data.prepared_dir>/eval_<name>.parquet`` (written by the prepare stage).
    """
    from codea1_core.evaluation.benchmarks import load_bigcodebench, load_unleakedtestbench

    cap = cfg.eval.max_problems
    if name == "bigcodebench":
        if not cfg.eval.bigcodebench_path:
            raise FileNotFoundError("benchmark bigcodebench: set eval.bigcodebench_path to a local copy")
        return load_bigcodebench(cfg.eval.bigcodebench_path, max_problems=cap)
    if name == "unleakedtestbench":
        if not cfg.eval.ult_path:
            raise FileNotFoundError("benchmark unleakedtestbench: set eval.ult_path to a local ULT.jsonl")
        return load_unleakedtestbench(cfg.eval.ult_path, max_problems=cap)
    from codea1_core.data.prepared import load_prepared

    path = Path(cfg.data.prepared_dir) / f"eval_{name}.parquet"
    if not path.is_file():
        raise FileNotFoundError(
            f"benchmark {name}: {path} not found (run the prepare stage: python -m flows.prepare)"
        )
    problems = load_prepared(path)
    return problems[:cap] if cap else problems
