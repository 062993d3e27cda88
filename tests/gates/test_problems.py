"""The prepared-problem gate (gates.problems): one failure code per check, every offending id named."""

from __future__ import annotations

import json

import pytest
from support import gated_problem

from gates.errors import DataQualityError
from gates.problems import check_problems


def test_check_problems_names_every_offending_id(tmp_path):
    problems = [
        gated_problem("a"),
        gated_problem("a"),
        gated_problem("c", prompt=""),
        gated_problem("d", entry_point="not an identifier"),
        gated_problem("e", tests=()),
        gated_problem("f", metadata={}),
        gated_problem("g", split="dev"),
        gated_problem("h", reference_solution=""),
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
