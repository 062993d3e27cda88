"""Lab problem families: references pass, buggy variants fail, splits are disjoint and deterministic."""

from __future__ import annotations

import ast
import re
from dataclasses import replace

import pytest

from codea1_core.config import ConfigError, LabConfig
from codea1_core.data import lab
from codea1_core.data.lab import FAMILIES, buggy_variants, lab_problems
from codea1_core.data.warmstart_data import tokenizer_corpus, warmstart_examples

CFG = LabConfig(golden_tests="boundary")  # every test asserts the full set unless it says sparse


def _outputs(source: str, calls: list[str]) -> list:
    namespace: dict = {}
    exec(source, namespace)  # trusted lab templates
    out = []
    for call in calls:
        try:
            out.append(eval(call, namespace))
        except Exception as exc:
            out.append(exc)
    return out


@pytest.fixture(scope="module")
def all_problems() -> dict[str, list]:
    return {split: lab_problems(CFG, split) for split in lab.SPLITS}


@pytest.fixture(scope="module")
def large_problems() -> dict[str, list]:
    big = replace(CFG, train_per_family=40, heldout_per_family=8)
    return {split: lab_problems(big, split) for split in lab.SPLITS}


def test_enough_families_with_distinct_entry_points():
    training = [f for f in FAMILIES.values() if not f.heldout]
    heldout = [f for f in FAMILIES.values() if f.heldout]
    assert len(training) >= 8 and len(heldout) >= 2
    assert len({f.name for f in FAMILIES.values()}) == len(FAMILIES)


def test_split_sizes(all_problems):
    n_train_families = sum(not f.heldout for f in FAMILIES.values())
    n_heldout_families = len(FAMILIES) - n_train_families
    assert len(all_problems["train"]) == n_train_families * CFG.train_per_family
    assert len(all_problems["val"]) == n_train_families * CFG.heldout_per_family
    assert len(all_problems["test"]) == len(FAMILIES) * CFG.heldout_per_family
    assert {p.split for s, ps in all_problems.items() for p in ps if p.split != s} == set()
    assert n_heldout_families >= 2


def test_reference_passes_and_every_bug_fails(large_problems):
    for problems in large_problems.values():
        for p in problems:
            calls = [t.call for t in p.tests]
            assert len(calls) >= 3, p.id
            assert _outputs(p.reference_solution, calls) == [t.expected for t in p.tests], p.id
            bugs = buggy_variants(p)
            # Every template bug survives for every drawn parameter set (none filtered as equivalent).
            assert len(bugs) == len(FAMILIES[p.metadata["family"]].bugs), p.id
            for bug in bugs:
                got = _outputs(bug, calls)
                assert any(
                    isinstance(g, Exception) or g != t.expected for g, t in zip(got, p.tests, strict=True)
                ), (p.id, bug)


def test_problem_shape(all_problems):
    p = all_problems["train"][0]
    assert re.fullmatch(r"lab/[a-z_]+/\d+", p.id) and p.source == "lab"
    assert p.prompt.startswith(f"def {p.entry_point}(") and p.prompt.endswith('"""\n')
    assert f"{p.entry_point}(" in p.description
    ast.parse(p.prompt + "    pass\n")
    ast.parse(p.reference_solution)
    assert p.metadata["family"] == p.entry_point and isinstance(p.metadata["params"], dict)
    assert all(t.call.startswith(p.entry_point + "(") for t in p.tests)


def test_splits_disjoint_and_heldout_families_only_in_test(all_problems):
    ids = [p.id for ps in all_problems.values() for p in ps]
    assert len(ids) == len(set(ids))
    keys = {
        s: {(p.entry_point, repr(sorted(p.metadata["params"].items()))) for p in ps}
        for s, ps in all_problems.items()
    }
    assert (
        not keys["train"] & keys["val"]
        and not keys["train"] & keys["test"]
        and not keys["val"] & keys["test"]
    )
    heldout = {name for name, f in FAMILIES.items() if f.heldout}
    assert not heldout & {p.entry_point for p in all_problems["train"] + all_problems["val"]}
    assert heldout <= {p.entry_point for p in all_problems["test"]}


def test_deterministic_and_seeded():
    assert lab_problems(CFG, "train") == lab_problems(CFG, "train")
    other = lab_problems(replace(CFG, seed=CFG.seed + 1), "train")
    assert [p.metadata["params"] for p in other] != [p.metadata["params"] for p in lab_problems(CFG, "train")]


def test_test_split_stable_when_train_size_changes():
    bigger = replace(CFG, train_per_family=CFG.train_per_family + 20)
    assert lab_problems(bigger, "test") == lab_problems(CFG, "test")
    assert lab_problems(bigger, "val") == lab_problems(CFG, "val")


def test_family_selection_and_errors():
    two = replace(CFG, families=["is_above", "tidy"])
    assert {p.entry_point for p in lab_problems(two, "train")} == {"is_above", "tidy"}
    with pytest.raises(ConfigError, match=r"lab\.families: unknown family 'nope'"):
        lab_problems(replace(CFG, families=["nope"]), "train")
    with pytest.raises(ConfigError, match="held-out family"):
        lab_problems(replace(CFG, families=["grade"]), "train")
    with pytest.raises(ConfigError, match="split"):
        lab_problems(CFG, "dev")
    with pytest.raises(ConfigError, match="lab.train_per_family"):
        lab_problems(replace(CFG, train_per_family=500), "train")
    with pytest.raises(ConfigError, match="lab.heldout_per_family"):
        lab_problems(replace(CFG, heldout_per_family=-1), "test")


def test_code_warmstart_mix(all_problems):
    problems = all_problems["train"]
    examples = warmstart_examples(problems, "code", CFG, seed=3)
    per_problem = CFG.warmstart_code_examples_per_problem
    assert len(examples) == len(problems) * per_problem
    assert examples == warmstart_examples(problems, "code", CFG, seed=3)
    assert examples != warmstart_examples(problems, "code", CFG, seed=4)
    n_buggy = 0
    for i, ex in enumerate(examples):
        p = problems[i // per_problem]
        system, user, answer = ex["messages"]
        assert (system["role"], user["role"], answer["role"]) == ("system", "user", "assistant")
        assert p.prompt.strip() in user["content"]
        code = answer["content"].removeprefix("```python\n").removesuffix("\n```")
        assert code == p.reference_solution or code in buggy_variants(p)
        n_buggy += code != p.reference_solution
    assert abs(n_buggy / len(examples) - CFG.buggy_fraction) < 0.1
    none_buggy = warmstart_examples(problems, "code", replace(CFG, buggy_fraction=0.0), seed=3)
    assert all(
        p.reference_solution in ex["messages"][-1]["content"]
        for p, ex in zip(problems, none_buggy[::per_problem], strict=True)
    )


def test_test_warmstart_is_imperfect_but_parseable(all_problems):
    problems = all_problems["train"]
    examples = warmstart_examples(problems, "test", CFG, seed=0, k=8)
    counts, wrong, total = [], 0, 0
    for i, ex in enumerate(examples):
        p = problems[i // CFG.warmstart_test_examples_per_problem]
        body = ex["messages"][-1]["content"]
        assert body.startswith("```python\n") and body.endswith("\n```")
        asserts = body.split("\n")[1:-1]
        counts.append(len(asserts))
        truth = dict(zip([t.call for t in p.tests], [t.expected for t in p.tests], strict=True))
        calls = []
        for line in asserts:
            node = ast.parse(line).body[0]
            assert isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare)
            call = ast.unparse(node.test.left)
            calls.append(call)
            expected = _outputs(p.reference_solution, [call])[0]
            total += 1
            wrong += ast.literal_eval(node.test.comparators[0]) != expected
            if call in truth:
                assert expected == truth[call]
        assert len(calls) == len(set(calls))
    assert max(counts) == 8 and min(counts) < 8
    assert 0.05 < wrong / total < 0.3
    with pytest.raises(ValueError, match="role"):
        warmstart_examples(problems, "tester", CFG, seed=0)


def test_tokenizer_corpus_covers_what_models_see():
    corpus = tokenizer_corpus(CFG)
    joined = "\n".join(corpus)
    assert "<|im_start|>system\nYou are a helpful code completion assistant.<|im_end|>" in joined
    assert "You are a helpful test case generation assistant." in joined
    assert "System:\n" in joined  # plain rendering
    for name in FAMILIES:
        assert f"def {name}(" in joined


# --------------------------------------------------------------------------------------------------
# lab.golden_tests: sparse vs boundary coverage (scarce golden tests let bugs through)
# --------------------------------------------------------------------------------------------------

SPARSE = replace(CFG, golden_tests="sparse")


def _passes(source: str, tests) -> bool:
    got = _outputs(source, [t.call for t in tests])
    return all(not isinstance(g, Exception) and g == t.expected for g, t in zip(got, tests, strict=True))


def _sparse_and_boundary(p):
    """(sparse tests, boundary tests) of a problem in any layout, from ``metadata["sparse_calls"]``."""
    every = {t.call: t for t in p.tests + p.plus_tests}
    sparse = [every[c] for c in p.metadata["sparse_calls"]]
    if p.split == "test":  # evaluation layout: tests = the boundary set, plus = sparse calls it lacks
        return sparse, list(p.tests)
    return sparse, [t for t in every.values() if t.call not in p.metadata["sparse_calls"]]


@pytest.mark.parametrize("seed", [0, 1])
def test_sparse_golden_tests_let_half_the_bugs_through_and_boundary_tests_catch_all(seed):
    """Sparse tests let bugs through: per family, >= half of the buggy variants pass the sparse golden
    tests, and every one of them fails the boundary set (so sparse-trained code can keep its bugs)."""
    cfg = replace(SPARSE, seed=seed)
    passed: dict[str, list[bool]] = {name: [] for name in FAMILIES}
    for split in lab.SPLITS:
        for p in lab_problems(cfg, split):
            sparse, boundary = _sparse_and_boundary(p)
            assert 2 <= len(sparse) <= 3 and _passes(p.reference_solution, sparse), p.id
            for bug in buggy_variants(p):
                assert not _passes(bug, boundary), (p.id, bug)
                passed[p.metadata["family"]].append(_passes(bug, sparse))
    for name, flags in passed.items():
        assert flags, name
        assert sum(flags) >= len(flags) / 2, (name, sum(flags), len(flags))


def test_golden_tests_mode_decides_what_training_sees_but_never_evaluation(all_problems):
    sparse = {split: lab_problems(SPARSE, split) for split in lab.SPLITS}
    for split in ("train", "val"):
        for b, s in zip(all_problems[split], sparse[split], strict=True):
            assert b.plus_tests == ()  # boundary: exactly the exhaustive set
            assert [t.call for t in s.tests] == s.metadata["sparse_calls"]
            assert {t.call for t in s.tests + s.plus_tests} == {t.call for t in b.tests} | set(
                s.metadata["sparse_calls"]
            )
            assert (b.prompt, b.reference_solution, b.metadata) == (
                s.prompt,
                s.reference_solution,
                s.metadata,
            )
    for b, s in zip(all_problems["test"], sparse["test"], strict=True):
        assert (b.tests, b.plus_tests) == (s.tests, s.plus_tests)  # evaluation: one full set for every arm
        assert {t.call for t in b.plus_tests} <= set(b.metadata["sparse_calls"])
    assert tokenizer_corpus(SPARSE) == tokenizer_corpus(CFG)  # both arms start from the same tokenizer
