"""Sanity checks of the evaluator on the real benchmarks with the real sandbox.

* An ORACLE policy (returns each problem's canonical solution in a python block) scores 100 on
  HumanEval+ and MBPP+, base and plus; a ``pass`` policy scores 0. The default run uses 10 problems
  per benchmark; the full sets are ``slow``.
* The golden MBPP asserts, fed through the Test-LLM path as a "test suite", score pass@5 = 100 on the
  MBPP references; mut@5 is printed (``-s``) for the record.

Needs the offline data folder (skips without it) and the process sandbox.
"""

from __future__ import annotations

import pytest
from support import TextPolicy, fenced

from codea1_core.config import Config
from codea1_core.data.datasets import load_source
from codea1_core.data.prepared import reference_exprs, resolve
from codea1_core.values import to_literal


@pytest.fixture(scope="module")
def executor():
    from sandbox import make_executor

    ex = make_executor(Config().sandbox)
    yield ex
    ex.close()


def prepared(name: str, cfg: Config, data_dir, executor, n: int):
    """Benchmark problems with reference-filled expected values (what the prepare stage does)."""
    problems = load_source(name, "test", cfg, data_dir)
    problems = problems[:n] if n else problems
    outs = executor.run_many([(p.reference_solution, reference_exprs(p)) for p in problems])
    filled = [
        resolve(p, o, cfg.sandbox.float_rel_tol, cfg.sandbox.float_abs_tol)[0]
        for p, o in zip(problems, outs, strict=True)
    ]
    return [p for p in filled if p.tests]


def oracle_for(problems):
    by_prompt = {p.prompt.strip(): p.reference_solution for p in problems}
    return TextPolicy(lambda text: fenced(next(code for prompt, code in by_prompt.items() if prompt in text)))


def _check_oracle_and_pass(name, shared_data_dir, executor, n):
    from tasks.evaluate import evaluate_code

    cfg = Config.from_dict({"eval": {"n_samples": 2, "k_list": [1, 2]}})
    problems = prepared(name, cfg, shared_data_dir, executor, n)
    assert len(problems) >= (n or 100) * 0.9
    m = evaluate_code(oracle_for(problems), problems, cfg, executor, name)
    assert m[f"code/{name}/base/pass@1"] == 100.0, m
    assert m[f"code/{name}/plus/pass@1"] == 100.0, m
    assert m[f"code/{name}/programs_run"] == len(problems)  # 2 identical samples -> 1 program each
    m0 = evaluate_code(TextPolicy(lambda t: fenced("pass")), problems, cfg, executor, name)
    assert m0[f"code/{name}/base/pass@2"] == 0.0 and m0[f"code/{name}/plus/pass@1"] == 0.0


@pytest.mark.parametrize("name", ["humanevalplus", "mbppplus"])
def test_oracle_100_and_pass_0_on_a_subset(name, shared_data_dir, executor):
    _check_oracle_and_pass(name, shared_data_dir, executor, 10)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["humanevalplus", "mbppplus"])
def test_oracle_100_and_pass_0_on_the_full_sets(name, shared_data_dir, executor):
    _check_oracle_and_pass(name, shared_data_dir, executor, 0)


def _golden_suites(problems):
    return [
        fenced("\n".join(f"assert {t.call} == {to_literal(t.expected)}" for t in p.tests)) for p in problems
    ]


@pytest.mark.parametrize("n", [15])
def test_golden_mbpp_asserts_pass5_100(n, shared_data_dir, executor, tmp_path):
    from tasks.evaluate_tests import score_suites

    cfg = Config.from_dict({"eval": {"max_mutants": 10}})
    problems = load_source("mbpp_val", "val", cfg, shared_data_dir)[:n]
    outs = executor.run_many([(p.reference_solution, reference_exprs(p)) for p in problems])
    problems = [resolve(p, o, 1e-6, 1e-6)[0] for p, o in zip(problems, outs, strict=True)]
    m, records = score_suites(problems, _golden_suites(problems), cfg, executor, "mbpp_val", tmp_path)
    assert m["test/mbpp_val/pass@5"] == 100.0, [v for r in records for v in r.verdicts if not v.correct]
    assert 0.0 < m["test/mbpp_val/mut@5"] <= 100.0
    print(f"\ngolden MBPP asserts on {len(problems)} mbpp_val references: {m}")


def test_lab_sparse_tests_let_a_bug_through_that_the_boundary_set_catches(executor, tmp_path):
    """Sparse golden tests let bugs through, end to end via the prepared parquet and the real sandbox: on
    the held-out lab set a buggy variant that passes a problem's sparse golden tests scores 100 on ``sparse``
    and 0 on ``base`` (the boundary set) and ``plus`` (the full set); the reference scores 100 on all
    three."""
    from dataclasses import replace

    from codea1_core.config import LabConfig
    from codea1_core.data.lab import buggy_variants, lab_problems
    from codea1_core.data.prepared import load_prepared, save_prepared
    from tasks.evaluate import score_codes

    problems = lab_problems(replace(LabConfig(), heldout_per_family=1), "test")
    problems = load_prepared(save_prepared(problems, tmp_path / "eval_lab_heldout.parquet"))
    cfg = Config.from_dict({"eval": {"n_samples": 1, "k_list": [1]}})

    def passes_sparse(problem, code):
        namespace: dict = {}
        exec(code, namespace)  # trusted lab templates, only to pick the bug
        tests = [t for t in problem.tests + problem.plus_tests if t.call in problem.metadata["sparse_calls"]]
        return all(eval(t.call, namespace) == t.expected for t in tests)

    bugs = [next(b for b in buggy_variants(p) if passes_sparse(p, b)) for p in problems]
    ref = score_codes(problems, [[p.reference_solution] for p in problems], cfg, executor, "lab")
    bug = score_codes(problems, [[b] for b in bugs], cfg, executor, "lab")
    for split in ("base", "plus", "sparse"):
        assert ref[f"code/lab/{split}/pass@1"] == 100.0, (split, ref)
    assert bug["code/lab/sparse/pass@1"] == 100.0, bug
    assert bug["code/lab/base/pass@1"] == 0.0 and bug["code/lab/plus/pass@1"] == 0.0, bug
