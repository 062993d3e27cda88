"""Prefect tasks for the data-quality gates (docs/method.md D5): prepared problems and generated tests.

What it does: :func:`validate_problems` runs the prepared-problem gate (:mod:`gates.problems`) on a problem
set before it is written; :func:`gx_gate_tests` runs the generated-test gate (:mod:`gates.generated_tests`)
on the rows of one training step. Both raise ``gates.errors.DataQualityError`` when the gate fails.
What it does not: hold the GX context, the frames or the expectations (package ``gates``), parse responses or
apply a test-validity rule (``codea1_core.method``).
How to run: ``gx_gate_tests.fn(gates.generated_tests.gate_columns(problems, suites), cfg.tests, path)``;
``pytest tests/tasks/test_quality.py tests/gates``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from codea1_core.config import TestsConfig
from codea1_core.types import Problem
from gates.generated_tests import GateResult, check_tests
from gates.problems import check_problems


@task(name="validate_problems", cache_policy=NO_CACHE)
def validate_problems(problems: list[Problem], report_path: str | Path | None = None) -> dict[str, Any]:
    """Check a problem set (:func:`gates.problems.check_problems`); returns the report."""
    return check_problems(problems, report_path)


@task(name="gx_gate_tests", cache_policy=NO_CACHE)
def gx_gate_tests(
    rows: pd.DataFrame | dict[str, list] | list[dict[str, Any]],
    cfg: TestsConfig,
    report_path: str | Path | None = None,
) -> GateResult:
    """Screen generated tests (:func:`gates.generated_tests.check_tests`); one reason per row."""
    return check_tests(rows, cfg, report_path)
