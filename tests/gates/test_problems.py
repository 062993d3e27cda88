"""The prepared-problem gate (gates.problems): one failure code per check, every offending id named."""

from __future__ import annotations

import json

import pytest

from codea1_core.types import Problem, TestCase
from gates.errors import DataQualityError
from gates.problems import check_problems


def _problem(pid: str, **kw) -> Problem:
    base = dict(
        id=pid,
        source="lab",
        split="train",
        prompt="def f(x):\n",
        description="d",
        entry_point="f",
        reference_solution="def f(x):\n    return x\n",
        tests=(TestCase("f(1)", 1),),
        metadata={"reference_passes": True},
    )
    return Problem(**{**base, **kw})


def test_check_problems_names_every_offending_id(tmp_path):
    problems = [
        _problem("a"),
        _problem("a"),
        _problem("c", prompt=""),
        _problem("d", entry_point="not an identifier"),
        _problem("e", tests=()),
        _problem("f", metadata={}),
        _problem("g", split="dev"),
        _problem("h", reference_solution=""),
    ]
    with pytest.raises(DataQualityError) as info:
        check_problems(problems, tmp_path / "q.json")
    err = info.value
    assert err.report_path == tmp_path / "q.json" and str(tmp_path / "q.json") in str(err)
    failures = json.loads(err.report_path.read_text())["failures"]
    assert failures == {
        "duplicate_id": ["a", "a"],
        "empty_prompt": ["c"],
        "bad_entry_point": ["d"],
        "no_golden_tests": ["e"],
        "reference_not_passing": ["f"],
        "bad_split": ["g"],
        "empty_reference": ["h"],
    }
    assert err.ids == ["a", "c", "d", "e", "f", "g", "h"]
    with pytest.raises(DataQualityError, match="empty problem set"):
        check_problems([])
