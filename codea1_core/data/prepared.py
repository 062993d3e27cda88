"""Reference verification and the prepared parquet files (docs/method.md D1).

What it does:

* :func:`reference_exprs` / :func:`resolve`: the pure half of reference verification. The ``prepare``
  flow evaluates every golden call and every dataset claim beside the reference in the sandbox;
  :func:`resolve` fills the expected values from those outcomes and drops (with a reason) the tests the
  reference cannot run or whose dataset claim disagrees with it.
* :func:`chunk_exprs` / :func:`rerun_alone`: how the reference's expressions are cut into sandbox
  programs, and which results are re-run in a program of their own (a time-out, memory error or
  over-budget result can come from the calls before it in the same program: rerun alone, whether an
  input survives depends only on the input, never on the chunking). The prepare flow and the slow
  canonical-solutions test use both.
* :func:`save_prepared` / :func:`load_prepared`: one parquet file of problems per split; expected values
  are ``values.encode`` bytes (never pickle); writes are atomic (``codea1_core.atomic``).
* :func:`prepared_record` / :func:`check_record`: each file records, in its parquet metadata, the params
  that decided its content (sources, caps, seeds, the lab's sizes, the reference limits and tolerances);
  train and evaluate refuse a file whose record differs from their config, or that has none, naming the keys
  and the command that prepares the right data. The record sits in each file, not beside them, so a file
  copied alone or left by an interrupted prepare can never be paired with another run's record.

What it does not: run code (the ``prepare`` flow does, in the sandbox) or read raw sources
(``codea1_core.data.datasets``). How to run: ``load_prepared("data/prepared/train.parquet")``; tests in
``tests/core/data/test_datasets.py`` (``test_resolve_*``, ``test_prepared_parquet_round_trip_and_errors``) and
``tests/flows/test_prepare.py``; the record in ``tests/core/data/test_prepared.py``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from codea1_core.atomic import atomic_path
from codea1_core.config import Config
from codea1_core.data.dataset_types import DatasetError, is_pending
from codea1_core.data.evalplus_rules import EVALPLUS_SOURCES
from codea1_core.types import Problem, TestCase

# --------------------------------------------------------------------------------------------------
# Reference verification (pure: the prepare flow runs the jobs in the sandbox)
# --------------------------------------------------------------------------------------------------

CHUNK_CALLS = 100
"""Expressions per sandbox program (a reference runs in several programs when it has many tests)."""
RERUN_ALONE = ("timeout", "memory", "unsupported_output")
"""Statuses that may come from the program's earlier calls (time, memory, the per-program result
budget): such a call of a multi-call chunk is run again in a program of its own."""


def chunk_exprs(exprs: list[str], size: int = CHUNK_CALLS) -> list[list[str]]:
    """``exprs`` cut into consecutive programs of at most ``size`` expressions."""
    return [exprs[i : i + size] for i in range(0, len(exprs), size)]


def rerun_alone(exprs: list[str], outcomes: list[Any]) -> list[int]:
    """Indices of ``outcomes`` (of one multi-call program) to run again alone (:data:`RERUN_ALONE`)."""
    if len(exprs) < 2:
        return []
    return [i for i, o in enumerate(outcomes) if o.status in RERUN_ALONE]


def _claims(problem: Problem) -> list[str]:
    tests = problem.tests + problem.plus_tests
    return [
        t.expected.answer or t.expected.check
        for t in tests
        if is_pending(t.expected) and (t.expected.answer or t.expected.check)
    ]


def reference_exprs(problem: Problem) -> list[str]:
    """Expressions to evaluate beside the reference: every golden call, then every dataset claim."""
    return [t.call for t in problem.tests + problem.plus_tests] + _claims(problem)


def resolve(
    problem: Problem, outcomes: list[Any], rel_tol: float, abs_tol: float
) -> tuple[Problem, list[dict[str, str]]]:
    """Fill expected values from the reference outcomes of :func:`reference_exprs` (D1).

    A test is dropped (and returned as an exclusion ``{"call", "reason", "detail"}``) when the reference
    does not return a plain value on its call (``reference_<status>``), when the dataset's claim cannot
    be evaluated (``claim_error``) or disagrees with the reference (``claim_mismatch``), or when a
    given expected value differs from the reference's (``expected_mismatch``). Floats compare with
    ``values_equal`` and ``max(abs_tol, problem.atol)``. The caller handles ``infra_error`` first (D4).
    EvalPlus problems also get ``metadata["ref_time_s"]``: the reference's seconds per kept test (base
    then plus), from which the EvalPlus protocol derives each input's time limit.
    """
    from codea1_core.values import values_equal

    tests = problem.tests + problem.plus_tests
    if len(outcomes) != len(tests) + len(_claims(problem)):
        raise ValueError(
            f"{problem.id}: {len(outcomes)} outcomes for {len(reference_exprs(problem))} expressions"
        )
    atol = max(abs_tol, problem.atol)
    claim_outcomes = iter(outcomes[len(tests) :])
    kept: list[TestCase | None] = []
    times: list[float] = []
    excluded: list[dict[str, str]] = []

    def drop(test: TestCase, reason: str, detail: str = "") -> None:
        kept.append(None)
        excluded.append({"call": test.call[:300], "reason": reason, "detail": detail[:300]})

    for test, out in zip(tests, outcomes[: len(tests)], strict=True):
        # a Pending or None: the branches below read its fields only where a claim was evaluated (a Pending)
        pending: Any = test.expected if is_pending(test.expected) else None
        claim = next(claim_outcomes) if pending and (pending.answer or pending.check) else None
        if out.status != "ok":
            drop(test, f"reference_{out.status}", out.error)
        elif claim is not None and claim.status != "ok":
            drop(test, "claim_error", f"{pending.answer or pending.check}: {claim.error}")
        elif claim is not None and pending.answer and not values_equal(out.value, claim.value, rel_tol, atol):
            drop(test, "claim_mismatch", f"reference {out.value!r} != dataset {pending.answer}")
        elif claim is not None and pending.check and not claim.value:
            drop(test, "claim_mismatch", f"false on the reference: {pending.check}")
        elif pending is None and not values_equal(out.value, test.expected, rel_tol, atol):
            drop(test, "expected_mismatch", f"reference {out.value!r} != given {test.expected!r}")
        else:
            kept.append(TestCase(test.call, out.value))
            times.append(round(float(out.duration_s), 4))
    n = len(problem.tests)
    metadata = {**problem.metadata, "reference_passes": True, "excluded_tests": len(excluded)}
    if problem.source in EVALPLUS_SOURCES:
        metadata["ref_time_s"] = times
    filled = dataclasses.replace(
        problem,
        tests=tuple(t for t in kept[:n] if t is not None),
        plus_tests=tuple(t for t in kept[n:] if t is not None),
        metadata=metadata,
    )
    return filled, excluded


# --------------------------------------------------------------------------------------------------
# Prepared parquet files (expected values as ``values.encode`` bytes, never pickle)
# --------------------------------------------------------------------------------------------------

_STR_COLUMNS = (
    "id",
    "source",
    "split",
    "prompt",
    "description",
    "entry_point",
    "reference_solution",
    "metadata",
)


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [(c, pa.string()) for c in _STR_COLUMNS]
        + [("imports", pa.list_(pa.string())), ("atol", pa.float64()), ("passing", pa.bool_())]
        + [(f"{k}_calls", pa.list_(pa.string())) for k in ("tests", "plus")]
        + [(f"{k}_expected", pa.list_(pa.binary())) for k in ("tests", "plus")]
    )


def save_prepared(problems: list[Problem], path: str | Path, record: dict[str, Any] | None = None) -> Path:
    """Write problems to parquet atomically (:func:`codea1_core.atomic.atomic_path`), with ``record``
    (:func:`prepared_record`) in the file's metadata when given.

    Raises:
        DatasetError: A test's expected value is still :class:`Pending` or not encodable.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from codea1_core.values import encode

    def expected(p: Problem, tests: tuple[TestCase, ...]) -> list[bytes]:
        out = []
        for t in tests:
            if is_pending(t.expected):
                raise DatasetError(f"{p.id}: expected value of {t.call[:80]} not filled (run prepare)")
            try:
                out.append(encode(t.expected))
            except Exception as exc:  # the codec's own error type is not ours to name
                raise DatasetError(f"{p.id}: expected value of {t.call[:80]} not encodable: {exc}") from None
        return out

    cols: dict[str, list[Any]] = {name: [] for name in _schema().names}
    for p in problems:
        for c in _STR_COLUMNS[:-1]:
            cols[c].append(getattr(p, c))
        cols["metadata"].append(json.dumps(p.metadata, default=str, sort_keys=True))
        cols["imports"].append(list(p.imports))
        cols["atol"].append(float(p.atol))
        cols["passing"].append(bool(p.metadata.get("reference_passes", False)))
        for key, tests in (("tests", p.tests), ("plus", p.plus_tests)):
            cols[f"{key}_calls"].append([t.call for t in tests])
            cols[f"{key}_expected"].append(expected(p, tests))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    schema = _schema()
    if record is not None:
        schema = schema.with_metadata({RECORD_KEY: json.dumps(record, sort_keys=True)})
    with atomic_path(path) as tmp:
        pq.write_table(pa.table(cols, schema=schema), tmp)
    return path


def load_prepared(path: str | Path) -> list[Problem]:
    """Read a parquet file written by :func:`save_prepared`; errors name the file, column or row id."""
    import pyarrow.parquet as pq

    from codea1_core.values import decode

    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: file not found (run `codea1 prepare` / `dvc repro prepare`)")
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid/OSError for corrupt files
        raise DatasetError(f"{path}: not a readable parquet file: {exc}") from None
    missing = [n for n in _schema().names if n not in table.column_names]
    if missing:
        raise DatasetError(f"{path}: missing column(s) {missing}")
    problems = []
    for row in table.to_pylist():
        try:
            tests = {
                k: tuple(
                    TestCase(c, decode(e))
                    for c, e in zip(row[f"{k}_calls"], row[f"{k}_expected"], strict=True)
                )
                for k in ("tests", "plus")
            }
            metadata = json.loads(row["metadata"] or "{}")
        except Exception as exc:  # decode/json/zip errors: name the row
            raise DatasetError(f"{path}: row {row.get('id')!r}: cannot decode: {exc}") from None
        problems.append(
            Problem(
                **{c: row[c] for c in _STR_COLUMNS[:-1]},
                imports=tuple(row["imports"] or ()),
                atol=row["atol"],
                tests=tests["tests"],
                plus_tests=tests["plus"],
                metadata=metadata,
            )
        )
    return problems


# --------------------------------------------------------------------------------------------------
# What prepared a file: the record of its data params, checked where train and evaluate read it
# --------------------------------------------------------------------------------------------------

RECORD_KEY = "codea1.prepared_with"
"""Parquet metadata key of a prepared file's record (JSON: dotted key -> value)."""
_COMMON_KEYS = (
    "data.max_problems_per_source",
    "data.seed",
    "data.reference_call_timeout_s",
    "data.reference_memory_mb",
    "sandbox.float_rel_tol",
    "sandbox.float_abs_tol",
)
_SOURCE_KEYS = {
    "lab": ("lab.families", "lab.seed", "lab.train_per_family", "lab.heldout_per_family", "lab.golden_tests"),
    "kodcode": ("data.kodcode_path", "data.kodcode_difficulty"),
}
_SOURCE_KEYS["lab_heldout"] = _SOURCE_KEYS["lab"]
PREPARE_COMMAND = "`dvc repro prepare`, or `codea1 prepare` with this run's params and overrides"


def prepared_record(cfg: Config, group: str) -> dict[str, Any]:
    """The params that decide the content of prepared file ``group`` (``train``, ``val``, ``eval_<name>``):
    its sources (``data.train_sources`` / ``data.val_sources``; an eval file's name is its benchmark), caps,
    seeds, the reference limits and tolerances, and the keys of the sources it holds (the lab's sizes and
    seed, KodCode's file and difficulty). JSON values, as stored."""
    flat = cfg.flat()
    if group in ("train", "val"):
        keys = [f"data.{group}_sources", *_COMMON_KEYS]
        sources = list(flat[keys[0]])
    else:
        keys, sources = list(_COMMON_KEYS), [group.removeprefix("eval_")]
    for source in sources:
        keys += _SOURCE_KEYS.get(source, ())
    return json.loads(json.dumps({key: flat[key] for key in dict.fromkeys(keys)}))


def read_record(path: str | Path) -> dict[str, Any] | None:
    """The record in ``path``'s metadata (None when it has none); only the file's footer is read."""
    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(path).metadata or {}
    except Exception as exc:  # pyarrow raises ArrowInvalid/OSError for corrupt files
        raise DatasetError(f"{path}: not a readable parquet file: {exc}") from None
    raw = meta.get(RECORD_KEY.encode())
    if raw is None:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def check_record(path: str | Path, cfg: Config) -> None:
    """Refuse a prepared file that another config prepared, or that records nothing.

    Raises:
        DatasetError: One line naming the file, the differing keys (its value and this config's) and the
            command that prepares the right data; or saying that the file has no record.
    """
    path = Path(path)
    record = read_record(path)
    if record is None:
        raise DatasetError(
            f"{path}: no record of the data params that prepared it (written by an older codea1 or by hand): "
            f"prepare it again: {PREPARE_COMMAND}"
        )
    wanted = prepared_record(cfg, path.stem)
    differ = [key for key, value in wanted.items() if key in record and record[key] != value]
    keys = differ or [key for key in wanted if key not in record]  # another source's keys: its name says it
    diff = [f"{key}={record.get(key, '(not recorded)')!r} (this run: {wanted[key]!r})" for key in keys]
    if diff:
        raise DatasetError(
            f"{path} was prepared by another config: {', '.join(diff)}: prepare this run's data: {PREPARE_COMMAND}"
        )
