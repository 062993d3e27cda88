"""Scoring and in-training validation tasks.

What it does: ``score`` turns a step's outcome matrices into rewards and masks with the pure
``codea1_core.method.rewards`` functions (docs/method.md §7, D4, D7) and averages their metrics; ``validate`` runs the
periodic Code-LLM validation (§3 step 16) with the benchmark protocol, ``tasks.evaluate.evaluate_code``
(the Code-LLM half of evaluation only: the train stage does not depend on the mutant generator).
What it does not: execute code or touch the Mistake Book.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from codea1_core.atomic import atomic_path
from codea1_core.config import Config
from tasks.evaluate import evaluate_code


@task(name="score", task_run_name="score[it={iteration}]", cache_policy=NO_CACHE)
def score(
    matrices: list[Any], cfg: Config, iteration: int, golden: bool = False
) -> tuple[list[Any], dict[str, float]]:
    """Per-problem ``ProblemScores`` (§7; golden: §7.4) and their step-level means (``code/``, ``test/``)."""
    from codea1_core.method.rewards import aggregate_metrics, golden_scores, score_problem

    scores = [golden_scores(m) if golden else score_problem(m, cfg.reward) for m in matrices]
    return scores, aggregate_metrics(scores)


@task(name="validate", task_run_name="validate[it={iteration}]", cache_policy=NO_CACHE)
def validate(
    policy: Any, problems: list[Any], cfg: Config, executor: Any, iteration: int
) -> dict[str, float]:
    """Validate the Code LLM on the held-out ``val`` problems; metrics are ``code/val/...``."""
    result = evaluate_code(policy, problems, cfg, executor, "val")
    return {k: float(v) for k, v in result.items() if _num(v)}


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def write_outcomes(path: str | Path, matrices: list[Any]) -> Path:
    """The step's outcome rows as parquet (written atomically) so every reward can be re-derived."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [row for m in matrices for row in _rows(m)]
    try:  # lists stay parquet lists, so ``OutcomeMatrix.from_rows`` reads the rows back unchanged
        table = pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # a row shape parquet cannot hold: nested -> JSON text
        frame = pd.DataFrame(rows)
        for col in frame.columns:
            if frame[col].map(lambda v: isinstance(v, (list, dict, tuple))).any():
                frame[col] = frame[col].map(lambda v: json.dumps(v, default=str))
        table = pa.Table.from_pandas(frame, preserve_index=False)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return path


def _rows(matrix: Any) -> list[dict[str, Any]]:
    if hasattr(matrix, "to_rows"):
        return list(matrix.to_rows())
    return [{"problem_id": getattr(matrix, "problem_id", ""), "data": json.dumps(matrix, default=str)}]
