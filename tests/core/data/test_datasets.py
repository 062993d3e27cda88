"""Loaders, assert parsing, reference resolution and the prepared parquet format.

Covers codea1_core.data.datasets, .source_text, .mbpp_inputs, .prepared and .dataset_types.
"""

from __future__ import annotations

import ast
import gzip
import json
import math
from pathlib import Path

import pytest

from codea1_core.config import Config
from codea1_core.data.dataset_types import PENDING, DatasetError, Pending, SourceUnavailable, is_pending
from codea1_core.data.datasets import (
    load_evalplus,
    load_humaneval,
    load_kodcode,
    load_mbpp,
    load_source,
    read_jsonl,
)
from codea1_core.data.prepared import load_prepared, reference_exprs, resolve, save_prepared
from codea1_core.data.source_text import parse_assert
from codea1_core.types import CallOutcome, Problem, TestCase


def _jsonl(path: Path, rows: list[dict], gz: bool = False) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


HEP_ROW = {
    "task_id": "HumanEval/900",
    "prompt": 'def add(a: int, b: float) -> float:\n    """Add two numbers.\n    >>> add(1, 2)\n    3\n    """\n',
    "entry_point": "add",
    "canonical_solution": "    return a + b\n",
    "base_input": [[1, 2.5], [0, 0.0]],
    "plus_input": [[1, float("nan")], [2, float("inf")]],
    "atol": 1e-6,
    "contract": "",
    "test": "",
}
MBPPP_ROW = {
    "task_id": "Mbpp/2",
    "prompt": '"""\nWrite a function to find the shared elements.\nassert set(similar_elements((3, 4), (4, 5))) == set((4,))\n"""\n',
    "entry_point": "similar_elements",
    "canonical_solution": "\ndef similar_elements(test_tup1, test_tup2):\n  return tuple(set(test_tup1) & set(test_tup2))\n",
    "base_input": [[[3, 4, 5, 6], [5, 7, 4, 10]]],
    "plus_input": {},
    "atol": 0,
    "contract": "",
    "assertion": "",
}
MBPP_ROWS = [
    {"task_id": 5, "text": "prompt split", "code": "def f(x):\r\n  return x", "test_list": ["assert f(1) == 1"],
     "test_setup_code": "", "challenge_test_list": []},
    {"task_id": 601, "text": "Write a function to double a number.", "code": "import math\r\ndef double(x):\r\n\treturn 2 * x",
     "test_list": ["assert double(2) == 4", "assert math.isclose(double(0.1), 0.2)", "assert double(y) == 2"],
     "test_setup_code": "", "challenge_test_list": []},
    {"task_id": 520, "text": "Write a function to negate.", "code": "def neg(x):\n  return -x",
     "test_list": ["assert neg(1) == -1"], "test_setup_code": "", "challenge_test_list": []},
]


# --------------------------------------------------------------------------------------------------
# Files and bad input
# --------------------------------------------------------------------------------------------------


def test_read_jsonl_names_file_and_line_for_corrupt_json(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n{"a": 2\n', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"x\.jsonl:2: invalid JSON"):
        read_jsonl(path)


def test_read_jsonl_non_utf8_empty_missing_and_bad_gzip(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"a": 1}\n{"a": "\xff"}\n')
    with pytest.raises(DatasetError, match=r"bad\.jsonl:2: not UTF-8"):
        read_jsonl(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(DatasetError, match="empty dataset"):
        read_jsonl(empty)
    with pytest.raises(DatasetError, match="file not found"):
        read_jsonl(tmp_path / "nope.jsonl")
    notgz = tmp_path / "x.jsonl.gz"
    notgz.write_bytes(b"plain text")
    with pytest.raises(DatasetError, match=r"x\.jsonl\.gz: cannot read"):
        read_jsonl(notgz)
    array = tmp_path / "arr.jsonl"
    array.write_text("[1, 2]\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"arr\.jsonl:1: expected a JSON object"):
        read_jsonl(array)


def test_missing_field_names_file_line_and_key(tmp_path):
    row = {k: v for k, v in HEP_ROW.items() if k != "base_input"}
    path = _jsonl(tmp_path / "he.jsonl", [HEP_ROW, row])
    with pytest.raises(DatasetError, match=r"he\.jsonl:2: missing field 'base_input'"):
        load_evalplus(path, "humanevalplus")


def test_unknown_source_and_absent_files(tmp_path):
    cfg = Config()
    with pytest.raises(DatasetError, match="unknown source 'nope'.*known: lab"):
        load_source("nope", "train", cfg, tmp_path)
    with pytest.raises(SourceUnavailable, match="no data folder"):
        load_source("mbppplus", "test", cfg, None)
    with pytest.raises(SourceUnavailable, match="no humanevalplus/HumanEvalPlus"):
        load_source("humanevalplus", "test", cfg, tmp_path)
    with pytest.raises(SourceUnavailable, match="kodcode_path is empty"):
        load_source("kodcode", "train", cfg, tmp_path)


# --------------------------------------------------------------------------------------------------
# EvalPlus, MBPP, HumanEval
# --------------------------------------------------------------------------------------------------


def test_evalplus_humaneval_calls_atol_and_non_literal_floats(tmp_path):
    (p,) = load_evalplus(_jsonl(tmp_path / "he.jsonl.gz", [HEP_ROW], gz=True), "humanevalplus")
    assert (p.id, p.source, p.split, p.entry_point, p.atol) == (
        "HumanEval/900",
        "humanevalplus",
        "test",
        "add",
        1e-6,
    )
    assert [t.call for t in p.tests] == ["add(1, 2.5)", "add(0, 0.0)"]
    assert all(t.expected is PENDING for t in p.tests + p.plus_tests)
    nan_call, inf_call = (t.call for t in p.plus_tests)  # repr(nan) is not a literal: values.to_literal
    assert (
        math.isnan(eval(nan_call.removeprefix("add"))[1])
        and eval(inf_call.removeprefix("add"))[1] == math.inf
    )
    assert (
        p.prompt == HEP_ROW["prompt"]
        and p.reference_solution == HEP_ROW["prompt"] + HEP_ROW["canonical_solution"]
    )
    assert (
        p.description.startswith("Add two numbers.") and "def add(a: int, b: float) -> float" in p.description
    )


def test_evalplus_mbpp_restores_tuples_and_builds_def_prompt(tmp_path):
    (p,) = load_evalplus(_jsonl(tmp_path / "m.jsonl", [MBPPP_ROW]), "mbppplus")
    assert p.tests[0].call == "similar_elements((3, 4, 5, 6), (5, 7, 4, 10))"  # lists -> tuples as EvalPlus
    assert p.plus_tests == ()
    assert p.prompt.startswith('def similar_elements(test_tup1, test_tup2):\n    """\n    Write a function')
    assert "assert set(similar_elements((3, 4), (4, 5)))" in p.prompt
    compile(p.prompt + "    pass\n", "<prompt>", "exec")  # the prompt is valid Python
    assert p.reference_solution.startswith("def similar_elements")


def test_mbpp_splits_asserts_and_skip_reasons(tmp_path):
    path = _jsonl(tmp_path / "mbpp.jsonl", MBPP_ROWS)
    (train,) = load_mbpp(path, "train")
    (val,) = load_mbpp(path, "val")
    assert (train.id, train.split, train.entry_point, val.id) == ("mbpp/601", "train", "double", "mbpp/520")
    assert train.tests[0] == TestCase("double(2)", Pending(answer="4"))
    assert train.tests[1] == TestCase("double(0.1)", Pending(check="math.isclose(double(0.1), 0.2)"))
    assert train.metadata["skipped_tests"] == [
        {"assert": "assert double(y) == 2", "reason": "call uses non-builtin names ['y']"}
    ]
    assert "\r" not in train.reference_solution and train.imports == ("import math",)
    assert train.prompt.startswith("def double(x):") and "assert double(2) == 4" in train.prompt
    with pytest.raises(DatasetError, match="mbpp split 'dev'"):
        load_mbpp(path, "dev")


def test_parse_assert_forms():
    def parse(src: str, called: str = "candidate") -> tuple:
        return parse_assert(ast.parse(src).body[0], called, "f", {"math"})

    assert parse("assert candidate(1) == 2") == (TestCase("f(1)", Pending(answer="2")), "")
    assert parse("assert 2 == candidate(1)") == (TestCase("f(1)", Pending(answer="2")), "")
    assert parse("assert not candidate('(')")[0] == TestCase("f('(')", Pending(check="not f('(')"))
    assert parse("assert abs(candidate(2) - 1.5) < 1e-6")[0].expected == Pending(
        check="abs(f(2) - 1.5) < 1e-06"
    )
    assert parse("assert f(1) == pytest.approx(0.5)", "f")[0].expected == Pending(answer="0.5")
    assert parse("assert candidate(x) == 1") == (None, "call uses non-builtin names ['x']")
    assert parse("assert candidate(candidate(1)) == 1")[1] == "2 calls of candidate"
    assert parse("assert 1 == 2")[1] == "0 calls of candidate"
    assert parse("assert candidate(1) == helper(2)")[1] == "assert uses unknown names ['helper']"


def test_humaneval_from_package_extracts_check_asserts():
    problems = load_humaneval()
    assert len(problems) == 164 and len({p.id for p in problems}) == 164
    first = problems[0]
    assert first.tests[0] == TestCase(
        "has_close_elements([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3)", Pending(answer="True")
    )
    assert first.reference_solution.startswith("from typing import List")
    # Problems whose asserts all sit in loops/helpers get no tests (prepare rejects and reports them).
    assert 0 < sum(1 for p in problems if not p.tests) <= 10
    assert sum(len(p.tests) for p in problems) > 1000


# --------------------------------------------------------------------------------------------------
# KodCode through datasets.load_dataset (same code path as a hub id)
# --------------------------------------------------------------------------------------------------

KOD_TEST = """from solution import two_sum

def test_basic():
    nums = [2, 7, 11]
    assert two_sum(nums, 9) == [0, 1]

def test_float():
    assert two_sum([1, 2], 3) == pytest.approx([0, 1])

def test_loop():
    for n in range(3):
        assert two_sum([n], n) is not None
"""


def _kod_rows() -> list[dict]:
    base = {"style": "instruct", "subset": "Leetcode", "question": "Return indices of two numbers adding to target.",
            "solution": "def two_sum(nums, target):\n    seen = {}\n    for i, x in enumerate(nums):\n"
                        "        if target - x in seen:\n            return [seen[target - x], i]\n        seen[x] = i\n    return []\n",
            "test": KOD_TEST,
            "test_info": [{"function_name": "two_sum", "function_declaration": "def two_sum(nums, target):",
                           "parameter_list": "(nums, target)", "docstring": "Two sum."}]}
    return [{**base, "question_id": "Leetcode_1", "gpt_difficulty": "hard"},
            {**base, "question_id": "Leetcode_2", "gpt_difficulty": "easy"}]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_kodcode_fixture_through_load_dataset(tmp_path, fmt):
    import datasets

    rows = _kod_rows()
    path = tmp_path / f"kod.{fmt}"
    if fmt == "parquet":
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    else:
        _jsonl(path, rows)
    (p,) = load_kodcode(str(path), "hard")
    assert (p.id, p.source, p.split, p.entry_point) == ("kodcode/Leetcode_1", "kodcode", "train", "two_sum")
    assert [t.call for t in p.tests] == ["two_sum([2, 7, 11], 9)", "two_sum([1, 2], 3)"]  # nums substituted
    assert p.tests[1].expected == Pending(answer="[0, 1]")  # pytest.approx unwrapped
    assert [s["reason"] for s in p.metadata["skipped_tests"]] == ["inside For"]
    assert p.prompt.startswith('def two_sum(nums, target):\n    """\n    Return indices')
    assert len(load_kodcode(str(path), "")) == 2  # empty difficulty = all rows


def test_kodcode_missing_column_and_corrupt_line(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "solution"} for r in _kod_rows()]
    path = _jsonl(tmp_path / "kod.jsonl", rows)
    with pytest.raises(DatasetError, match=r"kod\.jsonl: missing field\(s\) \['solution'\]"):
        load_kodcode(str(path))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_kod_rows()[0]) + "\n{oops\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"bad\.jsonl:2: invalid JSON"):
        load_kodcode(str(bad))


# --------------------------------------------------------------------------------------------------
# Reference resolution and the prepared format
# --------------------------------------------------------------------------------------------------


def _problem(tests: tuple[TestCase, ...], **kw) -> Problem:
    return Problem(id="t/1", source="mbpp", split="train", prompt="def f(x):\n", description="d", entry_point="f",
                   reference_solution="def f(x):\n    return x\n", tests=tests, **kw)


def test_resolve_fills_values_and_drops_disagreeing_tests():
    tests = (
        TestCase("f(1)", Pending(answer="1")),
        TestCase("f(2)", Pending(answer="3")),
        TestCase("f(3)", Pending(check="f(3) > 0")),
        TestCase("f(4)", PENDING),
        TestCase("f(5)", 5.0000001),
        TestCase("f(6)", 7),
    )
    p = _problem(tests)
    assert reference_exprs(p) == ["f(1)", "f(2)", "f(3)", "f(4)", "f(5)", "f(6)", "1", "3", "f(3) > 0"]
    ok = [CallOutcome("ok", v) for v in (1, 2, 3)]
    outcomes = [*ok, CallOutcome("timeout", error="TimeoutError"), CallOutcome("ok", 5), CallOutcome("ok", 6)]
    outcomes += [CallOutcome("ok", 1), CallOutcome("ok", 3), CallOutcome("ok", False)]
    filled, excluded = resolve(p, outcomes, 1e-6, 1e-6)
    assert filled.tests == (TestCase("f(1)", 1), TestCase("f(5)", 5))
    assert [e["reason"] for e in excluded] == [
        "claim_mismatch",
        "claim_mismatch",
        "reference_timeout",
        "expected_mismatch",
    ]
    assert filled.metadata["reference_passes"] is True
    with pytest.raises(ValueError, match="outcomes"):
        resolve(p, outcomes[:-1], 1e-6, 1e-6)


def test_resolve_uses_the_task_atol():
    p = _problem((TestCase("f(1)", Pending(answer="0.5")),), atol=1e-3)
    filled, excluded = resolve(p, [CallOutcome("ok", 0.5004), CallOutcome("ok", 0.5)], 0.0, 0.0)
    assert filled.tests == (TestCase("f(1)", 0.5004),) and excluded == []


def test_prepared_parquet_round_trip_and_errors(tmp_path):
    values = [float("nan"), (1, "a"), {1, 2}, {"k": [None, b"x"]}, -0.0, 10**40]
    p = _problem(tuple(TestCase(f"f({i})", v) for i, v in enumerate(values)), imports=("import math",), atol=1e-4,
                 plus_tests=(TestCase("f(9)", True),), metadata={"reference_passes": True, "family": "x"})
    path = save_prepared([p], tmp_path / "sub" / "train.parquet")
    (back,) = load_prepared(path)
    assert back.imports == ("import math",) and back.atol == 1e-4 and back.metadata == p.metadata
    assert math.isnan(back.tests[0].expected) and back.tests[1:] == p.tests[1:]
    assert type(back.tests[1].expected) is tuple and back.plus_tests == p.plus_tests
    assert [f.name for f in path.parent.iterdir()] == ["train.parquet"]  # no temp file left
    with pytest.raises(DatasetError, match="not filled"):
        save_prepared([_problem((TestCase("f(1)", PENDING),))], tmp_path / "x.parquet")
    assert not (tmp_path / "x.parquet").exists()
    with pytest.raises(DatasetError, match="file not found"):
        load_prepared(tmp_path / "none.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"junk")
    with pytest.raises(DatasetError, match="junk.parquet: not a readable parquet"):
        load_prepared(tmp_path / "junk.parquet")
    assert is_pending(PENDING) and not is_pending(None)


# --------------------------------------------------------------------------------------------------
# The offline copies (skipped when absent)
# --------------------------------------------------------------------------------------------------


def test_shared_data_counts(shared_data_dir):
    cfg = Config()
    assert len(load_source("humanevalplus", "test", cfg, shared_data_dir)) == 164
    mbppplus = load_source("mbppplus", "test", cfg, shared_data_dir)
    assert len(mbppplus) == 378 and sum(len(p.plus_tests) for p in mbppplus) > 30000
    train = load_source("mbpp", "train", cfg, shared_data_dir)
    val = load_source("mbpp_val", "val", cfg, shared_data_dir)
    assert (len(train), len(val)) == (374, 90)
    assert {p.split for p in train} == {"train"} and {p.split for p in val} == {"val"}
    assert sum(len(p.tests) for p in train) >= 3 * 374 - 10
