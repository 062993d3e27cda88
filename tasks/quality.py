"""Great Expectations data-quality gates: prepared problems and generated tests (docs/method.md D5).

What it does:
  * :func:`validate_problems` checks a problem set before it is written or trained on: schema, unique
    ids, non-empty prompt / reference, an identifier entry point, golden tests present and the
    ``passing`` flag (``metadata["reference_passes"]``, set by ``prepare`` after the reference passed
    every golden test in the sandbox). Any failure raises :class:`DataQualityError` naming the ids.
  * :func:`gx_gate_tests` screens generated tests ``(problem_id, suite_id, call, answer, entry_point)``
    before they reach the sandbox. Per-row check columns are the reason codes of
    :mod:`codea1_core.method.validity` (the rules the parser applies too; memoised per distinct source); GX
    expectations over the frame decide, and each failed expectation is a reason code:

    ``missing_field``  a key column is null               ``call_too_long`` / ``answer_too_long``
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

What it does not: run code or parse model responses (``codea1_core.method.parsing`` does that).
GX runs on one ephemeral context created on first use and reused (progress bars off).
How to run: ``gx_gate_tests.fn(rows, cfg.tests, report_path)``; ``pytest tests/tasks/test_quality.py``;
``python -m bench.gate_bench`` times 20,000 rows.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from codea1_core.atomic import write_json_atomic
from codea1_core.config import TestsConfig
from codea1_core.method.validity import OK, answer_reason, call_reason
from codea1_core.types import Problem

DEFAULT_REPORT_DIR = Path("outputs/quality")
_KEY_COLUMNS = ("problem_id", "suite_id", "call", "answer", "entry_point")
_OK, _NOT_CHECKED = OK, "not_checked"


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


def _test_frame(rows: pd.DataFrame | list[dict[str, Any]], cfg: TestsConfig) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(_KEY_COLUMNS)).reset_index(drop=True)
    frame = frame.astype(object).where(frame.notna(), None)
    call_memo: dict[tuple[str, str], str] = {}
    answer_memo: dict[tuple[str, str], str] = {}
    call_check, answer_check = [], []
    for call, ep, answer in zip(frame["call"], frame["entry_point"], frame["answer"], strict=True):
        if not isinstance(call, str) or not isinstance(ep, str) or len(call) > cfg.max_call_chars:
            call_check.append(_NOT_CHECKED)  # the null / length expectations report these rows
        else:
            key = (call, ep)
            if key not in call_memo:
                call_memo[key] = call_reason(call.strip(), ep, cfg.parse_mode == "official")
            call_check.append(call_memo[key])
        if not isinstance(answer, str) or len(answer) > cfg.max_answer_chars:
            answer_check.append(_NOT_CHECKED)
        else:
            akey = (answer, ep if isinstance(ep, str) else "")
            if akey not in answer_memo:
                answer_memo[akey] = answer_reason(answer.strip(), akey[1], cfg.literal_answers)
            answer_check.append(answer_memo[akey])
    frame["call_check"], frame["answer_check"] = call_check, answer_check
    # Calls arrive normalized by codea1_core.method.parsing (ast.unparse), so equal source = same call.
    keys = pd.DataFrame(
        {
            "p": frame["problem_id"].astype(str),
            "s": frame["suite_id"].astype(str),
            "c": frame["call"].astype(str).str.strip(),
        }
    )
    frame["is_repeat"] = (frame["call_check"] == _OK) & keys[frame["call_check"] == _OK].duplicated(
        keep="first"
    ).reindex(frame.index, fill_value=False)
    return frame


def _test_expectations(cfg: TestsConfig) -> list[tuple[str, Any]]:
    e = _gx().gx.expectations
    ok = [_OK, _NOT_CHECKED]
    return [
        *[("missing_field", e.ExpectColumnValuesToNotBeNull(column=c)) for c in _KEY_COLUMNS],
        ("call_too_long", e.ExpectColumnValueLengthsToBeBetween(column="call", max_value=cfg.max_call_chars)),
        (
            "answer_too_long",
            e.ExpectColumnValueLengthsToBeBetween(column="answer", max_value=cfg.max_answer_chars),
        ),
        ("call_check", e.ExpectColumnValuesToBeInSet(column="call_check", value_set=ok)),
        ("answer_check", e.ExpectColumnValuesToBeInSet(column="answer_check", value_set=ok)),
        ("duplicate", e.ExpectColumnValuesToBeInSet(column="is_repeat", value_set=[False])),
    ]


@task(name="gx_gate_tests", cache_policy=NO_CACHE)
def gx_gate_tests(
    rows: pd.DataFrame | list[dict[str, Any]], cfg: TestsConfig, report_path: str | Path | None = None
) -> GateResult:
    """Screen generated tests with GX; the first failed check (in the order above) is a row's reason.

    Args:
        rows: ``problem_id, suite_id, call, answer, entry_point`` per test (frame or dicts).
        cfg: The ``tests`` config section (length limits, ``max_rejected_frac``).
        report_path: Where the JSON report goes (written atomically). None: written only when the gate
            raises, to ``outputs/quality/gate_tests.json``.

    Raises:
        DataQualityError: The rejected share exceeds ``cfg.max_rejected_frac``.
    """
    frame = _test_frame(rows, cfg)
    n = len(frame)
    reasons = np.full(n, _OK, dtype=object)
    if n:
        failed = _gx().run(
            f"tests-{cfg.max_call_chars}-{cfg.max_answer_chars}", _test_expectations(cfg), frame
        )
        for code, positions in reversed(list(failed.items())):  # earlier checks win: write them last
            if positions:
                idx = np.asarray(positions, dtype=int)
                reasons[idx] = (
                    frame["call_check"].to_numpy()[idx]
                    if code == "call_check"
                    else (frame["answer_check"].to_numpy()[idx] if code == "answer_check" else code)
                )
    accepted = reasons == _OK
    counts = dict(Counter(r for r in reasons if r != _OK))
    rate = float((~accepted).sum() / n) if n else 0.0
    report = {
        "n_rows": n, "accepted": int(accepted.sum()), "rejected_rate": rate, "counts": counts,
        "max_rejected_frac": cfg.max_rejected_frac,
        "examples": {r: frame.loc[reasons == r, ["problem_id", "suite_id", "call"]].head(3).astype(str)
                     .to_dict("records") for r in counts},
    }  # fmt: skip
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
