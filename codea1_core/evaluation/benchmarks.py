"""Adapters for the external benchmarks of docs/method.md §12.2-§12.3: BigCodeBench and UnLeakedTestBench.

What it does: reads a local copy of each public release (JSON array, JSON lines or parquet) and turns
its rows into :class:`~codea1_core.types.Problem` objects the evaluator understands.

* **BigCodeBench** (``bigcode/bigcodebench`` on the hub, splits ``v0.1.x``; fields ``task_id``,
  ``complete_prompt``, ``instruct_prompt``, ``canonical_solution``, ``code_prompt``, ``test``,
  ``entry_point``, ``doc_struct``, ``libs``). Its tests are a ``unittest`` class ``TestCases``, not
  input/output pairs, so each problem gets one synthetic call, ``__codea1_bcb_check__()``, that runs the
  test class after the candidate and returns ``True`` when every test passed. The unittest source is
  appended to the program through ``Problem.metadata["test_program"]`` (see
  :func:`codea1_core.method.outcomes.candidate_program`). ``split="complete"`` prompts with ``complete_prompt``
  (the paper's setting), ``"instruct"`` with ``instruct_prompt``. The reference is
  ``code_prompt + canonical_solution``. Many tasks need third-party libraries (``libs``) and more time
  than the default per-call limit: raise ``sandbox.call_timeout_s`` for it.
* **UnLeakedTestBench** (``huangd1999/UnLeakedTestBench``, ``dataset/ULT.jsonl``, which is a JSON
  array despite its name; fields ``task_id``, ``code`` (the function under test, the reference) and
  ``prompt`` (its description); ``func_name`` when present, else the first top-level ``def``). Its
  ground-truth tests are not released, so problems carry none: it is a Test-LLM benchmark
  (pass@5 / mut@5 / Mul on the reference).

What it does not: download anything (pass a path to a local copy) or run code.

Also :func:`load_benchmark` (any evaluation set by name) and :func:`lab_subsets` (the lab's seen/unseen split).

How to run: ``load_bigcodebench(path)`` / ``load_unleakedtestbench(path)``; tests in
``tests/core/evaluation/test_evaluation.py`` write tiny fixtures in the public formats.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from codea1_core.config import Config
from codea1_core.types import Problem, TestCase

BCB_CHECK_CALL = "__codea1_bcb_check__()"

_BCB_HARNESS = """

def __codea1_bcb_check__():
    import unittest as _ut
    _suite = _ut.defaultTestLoader.loadTestsFromTestCase(TestCases)
    _result = _ut.TestResult()
    _suite.run(_result)
    return _result.testsRun > 0 and _result.wasSuccessful()
"""

BCB_FIELDS = (
    "task_id",
    "complete_prompt",
    "instruct_prompt",
    "canonical_solution",
    "code_prompt",
    "test",
    "entry_point",
)
ULT_FIELDS = ("task_id", "code", "prompt")


class BenchmarkFormatError(ValueError):
    """A benchmark file that does not match the public release format (names file and row)."""


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a JSON array, JSON-lines or parquet file, with errors that name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise BenchmarkFormatError(f"{path}: file not found")
    if path.suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict(orient="records")
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BenchmarkFormatError(f"{path}: invalid JSON array: {exc}") from None
    else:
        rows = []
        for line_no, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise BenchmarkFormatError(f"{path}:{line_no}: invalid JSON line: {exc}") from None
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise BenchmarkFormatError(f"{path}: row {i}: expected an object, got {type(row).__name__}")
    return rows


def _require(path: Path, i: int, row: dict[str, Any], names: tuple[str, ...]) -> None:
    missing = [n for n in names if not isinstance(row.get(n), str) or not row.get(n)]
    if missing:
        rid = row.get("task_id", "?")
        raise BenchmarkFormatError(
            f"{path}: row {i} (task_id {rid}): missing or empty field(s) {', '.join(missing)}"
        )


def _import_lines(source: str) -> tuple[str, ...]:
    """Top-level import statements; line by line, since ``code_prompt`` ends in a bodiless ``def``."""
    out = []
    for line in source.splitlines():
        if not line.startswith(("import ", "from ")):
            continue
        try:
            node = ast.parse(line).body[0]
        except SyntaxError:
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(ast.unparse(node))
    return tuple(out)


def load_bigcodebench(path: str | Path, split: str = "complete", max_problems: int = 0) -> list[Problem]:
    """BigCodeBench rows -> problems with one synthetic check call (see the module docstring)."""
    if split not in ("complete", "instruct"):
        raise BenchmarkFormatError(f"bigcodebench split must be 'complete' or 'instruct', got {split!r}")
    path = Path(path)
    problems = []
    for i, row in enumerate(read_rows(path)):
        _require(path, i, row, BCB_FIELDS)
        reference = row["code_prompt"] + row["canonical_solution"]
        problems.append(
            Problem(
                id=row["task_id"],
                source="bigcodebench",
                split="test",
                prompt=row["complete_prompt"] if split == "complete" else row["instruct_prompt"],
                description=row["instruct_prompt"],
                entry_point=row["entry_point"],
                reference_solution=reference,
                tests=(TestCase(call=BCB_CHECK_CALL, expected=True),),
                imports=_import_lines(row["code_prompt"]),
                metadata={"test_program": row["test"] + _BCB_HARNESS, "libs": row.get("libs", "")},
            )
        )
        if max_problems and len(problems) >= max_problems:
            break
    return problems


def _first_function(code: str) -> str | None:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return names[0] if names else None


def load_unleakedtestbench(path: str | Path, max_problems: int = 0) -> list[Problem]:
    """UnLeakedTestBench rows -> reference-only problems for the Test-LLM metrics."""
    path = Path(path)
    problems = []
    for i, row in enumerate(read_rows(path)):
        _require(path, i, {**row, "task_id": str(row.get("task_id", ""))}, ULT_FIELDS)
        entry = row.get("func_name") or _first_function(row["code"])
        if not entry:
            raise BenchmarkFormatError(
                f"{path}: row {i} (task_id {row['task_id']}): no top-level function in code"
            )
        problems.append(
            Problem(
                id=f"ult/{row['task_id']}",
                source="unleakedtestbench",
                split="test",
                prompt=row["prompt"],
                description=row["prompt"],
                entry_point=entry,
                reference_solution=row["code"],
                imports=_import_lines(row["code"]),
            )
        )
        if max_problems and len(problems) >= max_problems:
            break
    return problems


# --------------------------------------------------------------------------------------------------
# Benchmarks by name, and the lab's subsets
# --------------------------------------------------------------------------------------------------


def load_benchmark(cfg: Config, name: str) -> list[Problem]:
    """Problems of a benchmark by name, capped at ``eval.max_problems``.

    ``bigcodebench`` and ``unleakedtestbench`` read ``eval.bigcodebench_path`` / ``eval.ult_path``;
    every other name reads ``<data.prepared_dir>/eval_<name>.parquet`` (written by the prepare stage).
    """
    from codea1_core.data.prepared import load_prepared

    cap = cfg.eval.max_problems
    if name == "bigcodebench":
        if not cfg.eval.bigcodebench_path:
            raise FileNotFoundError("benchmark bigcodebench: set eval.bigcodebench_path to a local copy")
        return load_bigcodebench(cfg.eval.bigcodebench_path, max_problems=cap)
    if name == "unleakedtestbench":
        if not cfg.eval.ult_path:
            raise FileNotFoundError("benchmark unleakedtestbench: set eval.ult_path to a local ULT.jsonl")
        return load_unleakedtestbench(cfg.eval.ult_path, max_problems=cap)
    path = Path(cfg.data.prepared_dir) / f"eval_{name}.parquet"
    if not path.is_file():
        raise FileNotFoundError(
            f"benchmark {name}: {path} not found (run the prepare stage: python -m flows.prepare)"
        )
    problems = load_prepared(path)
    return problems[:cap] if cap else problems


def lab_subsets(problems: Sequence[Problem]) -> dict[str, list[int]]:
    """``seen`` / ``unseen`` problem indices of a lab set (training vs held-out families); ``{}`` otherwise.

    ``seen`` problems are new parameters of training families; ``unseen`` ones belong to families never
    trained on (``codea1_core.data.lab``). Sets with any non-lab problem, or with only one kind, get no
    subsets. Both evaluations report them as ``<bench>_seen`` / ``<bench>_unseen`` from the same samples.
    """
    from codea1_core.data.lab import FAMILIES

    kinds = []
    for p in problems:
        family = FAMILIES.get(str((p.metadata or {}).get("family", "")))
        if family is None or not p.id.startswith("lab/"):
            return {}
        kinds.append("unseen" if family.heldout else "seen")
    if len(set(kinds)) < 2:
        return {}
    return {name: [i for i, k in enumerate(kinds) if k == name] for name in ("seen", "unseen")}
