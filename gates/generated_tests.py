"""The generated-test gate (docs/method.md D5): GX screens generated tests before they reach the sandbox.

What it does: :func:`gate_columns` lays out one row per test the parser kept, ``(problem_id, suite_id,
call, answer, entry_point, check)``, where ``check`` is the reason code the parser recorded
(``codea1_core.method.validity.suite_checks``, ``ParsedSuite.checks``). :func:`check_tests` runs GX
expectations over those rows; each failed expectation is a reason code (the first, in this order, is a row's
reason):

    ``missing_field``  a key column is null               ``call_too_long`` / ``answer_too_long``
    then the row's ``check`` when it is not ``ok``:
    ``call_syntax``    not one Python expression          ``not_a_call``     top node is not a call
    ``wrong_function`` calls something else than the entry point (strict parse mode only)
    ``dunder``         a ``__name__`` or ``.__attr__``      ``forbidden_name`` eval/exec/open/import...
    ``walrus``         ``:=`` (would bind names in the namespace the next calls run in)
    ``answer_syntax`` / ``answer_dunder`` / ``answer_forbidden_name`` / ``answer_walrus``
    ``expected_not_literal`` the answer is not plain data or names the entry point (``tests.literal_answers``)
    ``duplicate``      the same call source earlier in the same suite (calls come ``ast.unparse``-normalized)

Lambdas and comprehensions are accepted (higher-order functions take callables). Statements
(``import``, ``x = 1``, ``del``...) cannot parse as an expression: ``call_syntax``. Sources are NFKC-normalised
before every check, as Python does for identifiers (``ｅｖａｌ`` is ``eval``). These checks
are data quality, **not** security: untrusted code is contained by the sandbox only.
Rejected share > ``tests.max_rejected_frac`` raises :class:`~gates.errors.DataQualityError` with the report
path.

What it does not: run code, parse model responses or apply a test-validity rule in Python
(``codea1_core.method.parsing`` and ``codea1_core.method.validity`` do that, once per test).
How to run: ``check_tests(gate_columns(problems, suites), cfg.tests, report_path)`` (the Prefect task is
``tasks.quality.gx_gate_tests``); ``pytest tests/gates/test_generated_tests.py``;
``python -m bench.gate_bench`` times the parse-and-gate step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from codea1_core.atomic import write_json_atomic
from codea1_core.config import TestsConfig
from codea1_core.method.validity import OK
from codea1_core.types import ParsedSuite, Problem
from gates.errors import DataQualityError
from gates.gx import gx_context

DEFAULT_REPORT_DIR = Path("outputs/quality")
_KEY_COLUMNS = ("problem_id", "suite_id", "call", "answer", "entry_point")
_COLUMNS = (*_KEY_COLUMNS, "check")


@dataclass(frozen=True)
class GateResult:
    """Outcome of :func:`check_tests`: one reason per row (``"ok"`` when accepted)."""

    accepted_mask: np.ndarray
    reasons: list[str]
    counts: dict[str, int]
    """Rejected rows per reason code."""
    rejected_rate: float
    report_path: Path | None

    def metrics(self) -> dict[str, float]:
        """``test/rejected_rate`` and ``test/rejected/<reason>`` counts (MLflow keys)."""
        out = {"test/rejected_rate": float(self.rejected_rate)}
        out.update({f"test/rejected/{reason}": float(n) for reason, n in sorted(self.counts.items())})
        return out


def gate_columns(
    problems: Sequence[Problem], suites: Sequence[Sequence[Sequence[ParsedSuite]]]
) -> dict[str, list]:
    """The gate's columns for ``suites[b][m][n]`` (tests of ``problems[b]``): one row per kept test, in
    (b, m, n, test) order, with the parser's reason code as ``check``; ``suite_id`` is ``"b/m/n"``."""
    table: dict[str, list] = {column: [] for column in _COLUMNS}
    for b, (problem, per_problem) in enumerate(zip(problems, suites, strict=True)):
        for m, per_code in enumerate(per_problem):
            for n, suite in enumerate(per_code):
                if len(suite.checks) != len(suite.tests):
                    raise ValueError(
                        f"suite {b}/{m}/{n}: {len(suite.checks)} checks for {len(suite.tests)} tests"
                    )
                k = len(suite.tests)
                table["problem_id"] += [problem.id] * k
                table["suite_id"] += [f"{b}/{m}/{n}"] * k
                table["call"] += [t.call for t in suite.tests]
                table["answer"] += [t.answer for t in suite.tests]
                table["entry_point"] += [problem.entry_point] * k
                table["check"] += suite.checks
    return table


def _test_frame(rows: pd.DataFrame | dict[str, list] | list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, dtype=object)  # object columns from the start: no string-array round trip
    if len(frame) and ("check" not in frame.columns or frame["check"].isna().any()):
        raise ValueError("gx_gate_tests: every row needs its 'check' code (the parser's ParsedSuite.checks)")
    frame = frame.reindex(columns=list(_COLUMNS)).reset_index(drop=True)
    return frame.astype(object).where(frame.notna(), None)


def _test_expectations(cfg: TestsConfig) -> list[tuple[str, Any]]:
    e = gx_context().gx.expectations
    return [
        *[("missing_field", e.ExpectColumnValuesToNotBeNull(column=c)) for c in _KEY_COLUMNS],
        ("call_too_long", e.ExpectColumnValueLengthsToBeBetween(column="call", max_value=cfg.max_call_chars)),
        (
            "answer_too_long",
            e.ExpectColumnValueLengthsToBeBetween(column="answer", max_value=cfg.max_answer_chars),
        ),
        ("check", e.ExpectColumnValuesToBeInSet(column="check", value_set=[OK])),
    ]


def check_tests(
    rows: pd.DataFrame | dict[str, list] | list[dict[str, Any]],
    cfg: TestsConfig,
    report_path: str | Path | None = None,
) -> GateResult:
    """Screen generated tests with GX; the first failed check (in the order above) is a row's reason.

    Args:
        rows: ``problem_id, suite_id, call, answer, entry_point, check`` per test: columns
            (:func:`gate_columns`), a frame or dicts.
        cfg: The ``tests`` config section (length limits, ``max_rejected_frac``).
        report_path: Where the JSON report goes (written atomically). None: written only when the gate
            raises, to ``outputs/quality/gate_tests.json``.

    Raises:
        DataQualityError: The rejected share exceeds ``cfg.max_rejected_frac``.
        ValueError: A row without its ``check`` code.
    """
    frame = _test_frame(rows)
    n = len(frame)
    reasons = np.full(n, OK, dtype=object)
    if n:
        failed = gx_context().run(
            f"tests-{cfg.max_call_chars}-{cfg.max_answer_chars}", _test_expectations(cfg), frame
        )
        checks = frame["check"].to_numpy()
        for code, positions in reversed(list(failed.items())):  # earlier checks win: write them last
            if positions:
                idx = np.asarray(positions, dtype=int)
                reasons[idx] = checks[idx] if code == "check" else code
    accepted = reasons == OK
    counts = dict(Counter(r for r in reasons if r != OK))
    rate = float((~accepted).sum() / n) if n else 0.0
    report = {
        "n_rows": n,
        "accepted": int(accepted.sum()),
        "rejected_rate": rate,
        "counts": counts,
        "max_rejected_frac": cfg.max_rejected_frac,
        "examples": {
            r: frame.loc[reasons == r, ["problem_id", "suite_id", "call"]]
            .head(3)
            .astype(str)
            .to_dict("records")
            for r in counts
        },
    }
    too_many = n > 0 and rate > cfg.max_rejected_frac
    path = (
        Path(report_path) if report_path else (DEFAULT_REPORT_DIR / "gate_tests.json" if too_many else None)
    )
    if path is not None:
        write_json_atomic(path, report, indent=2)
    if too_many:
        raise DataQualityError(
            f"generated-test gate: {rate:.1%} of {n} rows rejected (> tests.max_rejected_frac="
            f"{cfg.max_rejected_frac}); top reasons {Counter(counts).most_common(3)}",
            path,
        )
    return GateResult(accepted, [str(r) for r in reasons], counts, rate, path)
