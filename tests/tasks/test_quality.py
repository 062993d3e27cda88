"""The data-quality Prefect tasks (tasks.quality), via ``.fn``: each runs its gate and returns its result.

The gates themselves (codes, counts, reports, errors) are tested in ``tests/gates``.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from prefect.cache_policies import NO_CACHE
from support import checked_rows, gate_row, gated_problem

from codea1_core import config as config_mod
from gates.errors import DataQualityError
from tasks.quality import gx_gate_tests, validate_problems


def test_validate_problems_accepts_a_clean_set(tmp_path):
    report = validate_problems.fn([gated_problem("a"), gated_problem("b")], tmp_path / "q.json")
    assert report == {"n_problems": 2, "success": True, "failures": {}}
    assert json.loads((tmp_path / "q.json").read_text())["success"] is True


def test_validate_problems_raises_the_gates_error(tmp_path):
    with pytest.raises(DataQualityError, match=r"1 problem\(s\) failed the data gate: empty_prompt: c"):
        validate_problems.fn([gated_problem("a"), gated_problem("c", prompt="")], tmp_path / "q.json")


def test_gate_tests_accepts_a_dataframe_and_empty_input(tmp_path):
    frame = pd.DataFrame(checked_rows([gate_row("f(1)"), gate_row("f(2)")]))
    result = gx_gate_tests.fn(frame, config_mod.TestsConfig())
    assert result.accepted_mask.tolist() == [True, True] and result.report_path is None
    empty = gx_gate_tests.fn([], config_mod.TestsConfig())
    assert empty.rejected_rate == 0.0 and empty.reasons == []


def test_tasks_keep_their_names_and_are_never_cached():
    """Task names are what the Prefect UI and the run logs show; a gate must run on every call."""
    assert (validate_problems.name, gx_gate_tests.name) == ("validate_problems", "gx_gate_tests")
    assert validate_problems.cache_policy is NO_CACHE and gx_gate_tests.cache_policy is NO_CACHE
