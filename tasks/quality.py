"""Great Expectations data-quality gates: prepared problems and generated tests (docs/method.md D5).

What it does:
  * :func:`validate_problems` checks a problem set before it is written or trained on: schema, unique
    ids, non-empty prompt / reference, an identifier entry point, golden tests present and the
    ``passing`` flag (``metadata["reference_passes"]``, set by ``prepare`` after the reference passed
    every golden test in the sandbox). Any failure raises :class:`DataQualityError` naming the ids.
  * :func:`gx_gate_tests` screens generated tests before they reach the sandbox: one row per test the
    parser kept, ``(problem_id, suite_id, call, answer, entry_point, check)`` (:func:`gate_columns` builds
    the columns from parsed suites), where ``check`` is the reason code the parser recorded
    (``codea1_core.method.validity.suite_checks``, ``ParsedSuite.checks``). GX expectations over that frame
    decide, and each failed expectation is a reason code (the first, in this order, is a row's reason):

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
    Rejected share > ``tests.max_rejected_frac`` raises :class:`DataQualityError` with the report path.

What it does not: run code, parse model responses or apply a test-validity rule in Python
(``codea1_core.method.parsing`` and ``codea1_core.method.validity`` do that, once per test).
GX runs on one ephemeral context created on first use and reused (progress bars off).
How to run: ``gx_gate_tests.fn(gate_columns(problems, suites), cfg.tests, report_path)``;
``pytest tests/tasks/test_quality.py``; ``python -m bench.gate_bench`` times the parse-and-gate step.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from codea1_core.atomic import write_json_atomic
from codea1_core.config import TestsConfig
from codea1_core.method.validity import OK
from codea1_core.types import ParsedSuite, Problem

DEFAULT_REPORT_DIR = Path("outputs/quality")
_KEY_COLUMNS = ("problem_id", "suite_id", "call", "answer", "entry_point")
_COLUMNS = (*_KEY_COLUMNS, "check")


class DataQualityError(Exception):
    """A data-quality gate failed; ``report_path`` (when set) holds the full JSON report."""

    def __init__(self, message: str, report_path: Path | None = None, ids: Iterable[str] = ()):
        super().__init__(message if report_path is None else f"{message} (report: {report_path})")
        self.report_path = report_path
        self.ids = list(ids)


@dataclass(frozen=True)
class GateResult:
    """Outcome of :func:`gx_gate_tests`: one reason per row (``"ok"`` when accepted)."""

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


# --------------------------------------------------------------------------------------------------
# GX plumbing: one ephemeral context, one validation definition per (gate, parameters)
# --------------------------------------------------------------------------------------------------


class _Gx:
    def __init__(self) -> None:
        import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        self.gx = gx
        self.ctx = gx.get_context(mode="ephemeral")
        self.ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        self.source = self.ctx.data_sources.add_pandas("codea1")
        self.definitions: dict[str, Any] = {}

    def run(
        self, name: str, expectations: list[tuple[str, Any]], frame: pd.DataFrame
    ) -> dict[str, list[int]]:
        """Validate ``frame``; returns ``{code: unexpected row positions}`` for every expectation."""
        with _LOCK:  # one GX context shared by every thread of the task runner
            return self._run(name, expectations, frame)

    def _run(
        self, name: str, expectations: list[tuple[str, Any]], frame: pd.DataFrame
    ) -> dict[str, list[int]]:
        if name not in self.definitions:
            asset = self.source.add_dataframe_asset(name)
            suite = self.ctx.suites.add(self.gx.ExpectationSuite(name=name))
            for _, expectation in expectations:
                suite.add_expectation(expectation)
            batch = asset.add_batch_definition_whole_dataframe(name)
            self.definitions[name] = self.ctx.validation_definitions.add(
                self.gx.ValidationDefinition(name=name, data=batch, suite=suite)
            )
        result = self.definitions[name].run(
            batch_parameters={"dataframe": frame}, result_format={"result_format": "COMPLETE"}
        )
        by_key = {(e.expectation_type, e.column): code for code, e in expectations}  # unique per suite
        out: dict[str, list[int]] = {code: [] for code, _ in expectations}
        for res in result.results:
            if res.exception_info.get("raised_exception"):
                raise RuntimeError(
                    f"GX expectation failed to run: {res.exception_info.get('exception_message')}"
                )
            code = by_key[(res.expectation_config.type, res.expectation_config.kwargs.get("column"))]
            out[code] += list(res.result.get("unexpected_index_list") or [])
        return out


_GX: _Gx | None = None
_LOCK = threading.RLock()


def _gx() -> _Gx:
    global _GX
    with _LOCK:
        if _GX is None:
            _GX = _Gx()
    return _GX


# --------------------------------------------------------------------------------------------------
# Problems
# --------------------------------------------------------------------------------------------------


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
    e = _gx().gx.expectations
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


@task(name="validate_problems", cache_policy=NO_CACHE)
def validate_problems(problems: list[Problem], report_path: str | Path | None = None) -> dict[str, Any]:
    """Check a problem set with GX; returns the report (also written to ``report_path`` when given).

    Raises:
        DataQualityError: Empty set, or any check failed (the message names check and ids).
    """
    if not problems:
        raise DataQualityError("validate_problems: empty problem set")
    frame = _problem_frame(problems)
    failed = _gx().run("problems", _problem_expectations(), frame)
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


# --------------------------------------------------------------------------------------------------
# Generated tests
# --------------------------------------------------------------------------------------------------


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
    frame = pd.DataFrame(rows)
    if len(frame) and ("check" not in frame.columns or frame["check"].isna().any()):
        raise ValueError("gx_gate_tests: every row needs its 'check' code (the parser's ParsedSuite.checks)")
    frame = frame.reindex(columns=list(_COLUMNS)).reset_index(drop=True)
    return frame.astype(object).where(frame.notna(), None)


def _test_expectations(cfg: TestsConfig) -> list[tuple[str, Any]]:
    e = _gx().gx.expectations
    return [
        *[("missing_field", e.ExpectColumnValuesToNotBeNull(column=c)) for c in _KEY_COLUMNS],
        ("call_too_long", e.ExpectColumnValueLengthsToBeBetween(column="call", max_value=cfg.max_call_chars)),
        (
            "answer_too_long",
            e.ExpectColumnValueLengthsToBeBetween(column="answer", max_value=cfg.max_answer_chars),
        ),
        ("check", e.ExpectColumnValuesToBeInSet(column="check", value_set=[OK])),
    ]


@task(name="gx_gate_tests", cache_policy=NO_CACHE)
def gx_gate_tests(
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
        failed = _gx().run(
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
