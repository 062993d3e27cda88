"""The prepared-problem gate (docs/method.md D5): GX checks a problem set before it is written or trained on.

What it does: :func:`check_problems` lays the set out as one row per problem and checks schema, unique ids,
non-empty prompt / reference, an identifier entry point, golden tests present and the ``passing`` flag
(``metadata["reference_passes"]``, set by ``prepare`` after the reference passed every golden test in the
sandbox). Any failure raises :class:`~gates.errors.DataQualityError` naming the check and the ids.
What it does not: run a reference or a test (``flows/prepare.py`` does, in the sandbox).
How to run: ``check_problems(problems, report_path)`` (the Prefect task is
``tasks.quality.validate_problems``); ``pytest tests/gates/test_problems.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from codea1_core.atomic import write_json_atomic
from codea1_core.types import Problem
from gates.errors import DataQualityError
from gates.gx import gx_context


def _problem_frame(problems: list[Problem]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": [p.id for p in problems],
            "split": [p.split for p in problems],
            "prompt": [p.prompt or None for p in problems],
            "entry_point": [p.entry_point or None for p in problems],
            "reference_solution": [p.reference_solution or None for p in problems],
            "n_tests": [len(p.tests) for p in problems],
            "passing": [bool(p.metadata.get("reference_passes", False)) for p in problems],
        }
    )


def _problem_expectations() -> list[tuple[str, Any]]:
    e = gx_context().gx.expectations
    return [
        ("missing_id", e.ExpectColumnValuesToNotBeNull(column="id")),
        ("duplicate_id", e.ExpectColumnValuesToBeUnique(column="id")),
        ("bad_split", e.ExpectColumnValuesToBeInSet(column="split", value_set=["train", "val", "test"])),
        ("empty_prompt", e.ExpectColumnValuesToNotBeNull(column="prompt")),
        ("bad_entry_point", e.ExpectColumnValuesToMatchRegex(column="entry_point", regex=r"^[A-Za-z_]\w*$")),
        ("missing_entry_point", e.ExpectColumnValuesToNotBeNull(column="entry_point")),
        ("empty_reference", e.ExpectColumnValuesToNotBeNull(column="reference_solution")),
        ("no_golden_tests", e.ExpectColumnValuesToBeBetween(column="n_tests", min_value=1)),
        ("reference_not_passing", e.ExpectColumnValuesToBeInSet(column="passing", value_set=[True])),
    ]


def check_problems(problems: list[Problem], report_path: str | Path | None = None) -> dict[str, Any]:
    """Check a problem set with GX; returns the report (also written to ``report_path`` when given).

    Raises:
        DataQualityError: Empty set, or any check failed (the message names check and ids).
    """
    if not problems:
        raise DataQualityError("validate_problems: empty problem set")
    frame = _problem_frame(problems)
    failed = gx_context().run("problems", _problem_expectations(), frame)
    failures = {code: [str(frame.at[i, "id"]) for i in rows] for code, rows in failed.items() if rows}
    report = {"n_problems": len(problems), "success": not failures, "failures": failures}
    path = write_json_atomic(report_path, report, indent=2) if report_path else None
    if failures:
        detail = "; ".join(
            f"{code}: {', '.join(ids[:5])}{' ...' if len(ids) > 5 else ''}" for code, ids in failures.items()
        )
        bad_ids = sorted({i for ids in failures.values() for i in ids})
        raise DataQualityError(f"{len(bad_ids)} problem(s) failed the data gate: {detail}", path, bad_ids)
    return report
