"""Evaluation metrics (§13) and in-memory Cosmic-Ray mutants."""

from __future__ import annotations

import ast
import math
from fractions import Fraction

import pytest

from codea1_core.evaluation.metrics import (
    attack_rate,
    avg_at_k,
    mean_pass_at_k,
    mul,
    mut_score,
    mutation_score,
    pass_at_k,
    validity_rate,
)
from codea1_core.evaluation.mutants import Mutant, generate_mutants

# --------------------------------------------------------------------------------------------------
# pass@k / avg@k
# --------------------------------------------------------------------------------------------------


def _exact_pass_at_k(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


@pytest.mark.parametrize("n", [1, 2, 5, 8, 32])
def test_pass_at_k_equals_the_binomial_definition(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(_exact_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


def test_pass_at_k_is_stable_for_large_n_and_has_known_values():
    assert pass_at_k(1000, 3, 100) == pytest.approx(float(_exact_pass_at_k(1000, 3, 100)), abs=1e-12)
    assert pass_at_k(32, 8, 1) == pytest.approx(8 / 32)
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 6, 5) == 1.0  # fewer than k failures: every k-subset holds a pass


def test_pass_at_k_rejects_bad_arguments():
    for n, c, k in [(0, 0, 1), (5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)]:
        with pytest.raises(ValueError, match="pass_at_k"):
            pass_at_k(n, c, k)


def test_mean_pass_at_k_and_avg_at_k():
    assert mean_pass_at_k([(4, 1), (4, 4)], 1) == pytest.approx((0.25 + 1.0) / 2)
    assert math.isnan(mean_pass_at_k([], 1))
    flags = [[True, False, True, True], [False, False, False, True]]
    assert avg_at_k(flags, 2) == pytest.approx((0.5 + 0.0) / 2)
    assert avg_at_k(flags, 4) == pytest.approx((0.75 + 0.25) / 2)
    with pytest.raises(ValueError, match="problem row 1 has 1 samples"):
        avg_at_k([[True, True], [True]], 2)


# --------------------------------------------------------------------------------------------------
# Test-side metrics
# --------------------------------------------------------------------------------------------------


def test_validity_rate_pooled_and_ult_pass_at_5():
    suites = [[True, True, False], [True, True, True, True, True, True]]
    assert validity_rate(suites) == pytest.approx(8 / 9)
    # ULT pass@5: only the first five count, missing tests count as incorrect
    assert validity_rate(suites, tests_per_suite=5) == pytest.approx((2 + 5) / 10)
    assert math.isnan(validity_rate([]))


def test_attack_rate_pools_valid_tests():
    assert attack_rate([[True, False], [False, False, True, True]]) == pytest.approx(3 / 6)
    assert math.isnan(attack_rate([[], []]))


def test_mut_score_keeps_only_suites_that_pass_the_reference():
    kills = [
        [True, True, False, None],  # 2 of 3 completed killed
        [True, True, True],  # dropped: its suite fails the reference
        [False, False, False, True],  # 1 of 4
        [None, None],  # nothing completed: left out
    ]
    assert mutation_score(kills[0]) == pytest.approx(2 / 3)
    assert mut_score(kills, [True, False, True, True]) == pytest.approx((2 / 3 + 1 / 4) / 2)
    assert math.isnan(mut_score(kills, [False] * 4))
    with pytest.raises(ValueError, match="4 rows"):
        mut_score(kills, [True])


def test_mul_in_points_matches_the_paper_rows():
    assert mul(27.05, 26.41) == pytest.approx(7.14, abs=0.005)
    assert mul(37.15, 53.14) == pytest.approx(19.74, abs=0.005)


# --------------------------------------------------------------------------------------------------
# Mutants
# --------------------------------------------------------------------------------------------------

SOURCE = '''def clamp(x, lo, hi):
    """Clamp x into [lo, hi]."""
    if x < lo:
        return lo
    if x > hi and hi >= 0:
        return hi
    for i in range(2):
        if i == 1:
            break
    try:
        return x + 0
    except ValueError:
        return None
'''


def _run(source: str, *args):
    namespace: dict = {}
    exec(compile(source, "<mutant>", "exec"), namespace)  # noqa: S102 - our own test source
    return namespace["clamp"](*args)


def test_generate_mutants_gives_distinct_valid_programs_in_memory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mutants = generate_mutants(SOURCE, max_mutants=0)
    assert list(tmp_path.iterdir()) == []  # nothing written
    assert len(mutants) >= 10
    assert all(isinstance(m, Mutant) and m.operator.startswith("core/") for m in mutants)
    dumps = [ast.dump(ast.parse(m.source)) for m in mutants]  # all parse
    assert len(set(dumps)) == len(dumps)
    assert ast.dump(ast.parse(SOURCE)) not in dumps
    operators = {m.operator.split("/")[1].split("_")[0] for m in mutants}
    assert {
        "ReplaceComparisonOperator",
        "ReplaceBinaryOperator",
        "NumberReplacer",
        "ExceptionReplacer",
    } <= operators
    # some mutants behave differently from the original on a plain input
    assert any(_run(m.source, 5, 0, 3) != _run(SOURCE, 5, 0, 3) for m in mutants)


def test_exception_replacer_mutant_is_self_contained():
    (mutant,) = [m for m in generate_mutants(SOURCE, max_mutants=0) if m.operator == "core/ExceptionReplacer"]
    assert "except CosmicRayTestingException:" in mutant.source
    assert _run(mutant.source, 1, 0, 3) == 1  # the stub class is defined: no NameError


def test_generate_mutants_subset_is_seeded_and_deterministic():
    everything = generate_mutants(SOURCE, max_mutants=0)
    a = generate_mutants(SOURCE, max_mutants=5, seed=1)
    assert len(a) == 5
    assert a == generate_mutants(SOURCE, max_mutants=5, seed=1)
    others = [generate_mutants(SOURCE, max_mutants=5, seed=s) for s in range(2, 6)]
    assert any(o != a for o in others)
    assert {m.source for m in a} <= {m.source for m in everything}


def test_generate_mutants_rejects_invalid_source():
    with pytest.raises(ValueError, match="not valid Python"):
        generate_mutants("def f(:\n")
    assert generate_mutants("x = 'no operators here'\n") == []
