"""Mistake Book tasks: replay retrieval before execution, merge after scoring, persist every iteration.

What it does (docs/method.md §3 steps 7, 10; §8, D6): ``retrieve_replay`` takes up to ``top_k`` stored tests
per problem BEFORE this step's update; ``merge_mistake_book`` applies the official update rule per problem with
the outcome matrices' ``failed_tests()`` / ``passed_replay()`` (valid codes only, duplicates counted) and
writes the book JSON atomically (a DVC out; the step's checkpoint copies this file byte for byte, so the book
is serialised once per step). With ``mistake_book.enabled: false`` nothing is replayed or stored.
What it does not: implement the book (``codea1_core.method.mistake_book.MistakeBook`` is pure state).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from codea1_core.atomic import write_json_atomic
from codea1_core.config import Config


def retrieve_replay(book: Any, problems: list[Any], cfg: Config) -> list[list[Any]]:
    """Per problem, the replayed tests (the same list for all M codes, §3 step 7)."""
    if book is None or not cfg.mistake_book.enabled:
        return [[] for _ in problems]
    return [list(book.retrieve(p.id, cfg.mistake_book.top_k)) for p in problems]


@task(name="merge_mistake_book", task_run_name="merge_mistake_book[it={iteration}]", cache_policy=NO_CACHE)
def merge_mistake_book(
    book: Any, matrices: list[Any], iteration: int, path: str | Path | None = None
) -> dict[str, float]:
    """Update the book from this step's outcomes; ``mistake_book/`` metrics (size, added, removed, ...).

    Without a book (``golden`` mode, ``mistake_book.enabled: false``) an empty, disabled book is written, so
    the DVC out exists in every mode.
    """
    if book is None:
        if path is not None:
            from codea1_core.method.mistake_book import MistakeBook

            write_json_atomic(path, MistakeBook(enabled=False).to_dict(), fsync=True)
        return {}
    totals: dict[str, float] = {}
    replayed = passed = 0
    for matrix in matrices:
        if getattr(matrix, "problem_infra", False):
            continue  # D4: a problem whose reference job failed for infra reasons is not scored
        failed, passed_replay = matrix.failed_tests(), matrix.passed_replay()
        counts = book.update(matrix.problem_id, failed, passed_replay, iteration)
        for key, value in counts.items():
            if key != "size":
                totals[key] = totals.get(key, 0.0) + float(value)
        infra = getattr(matrix, "code_infra", ())
        flags = [
            f
            for m, row in enumerate(getattr(matrix, "replay_passed", None) or ())
            if not (m < len(infra) and infra[m])  # D4: an infra-masked code is never a replay failure
            for f in row
        ]
        replayed += len(flags)
        passed += sum(bool(f) for f in flags)
    metrics = {f"mistake_book/{k}": v for k, v in totals.items()}
    metrics["mistake_book/size"] = float(book.size())
    # nothing replayed (early in the first epoch): not a rate of 0 — NaN, like code/pass_hist (§8)
    metrics["mistake_book/replay_pass_rate"] = passed / replayed if replayed else float("nan")
    if path is not None:
        write_json_atomic(path, book.to_dict(), fsync=True)
    return metrics
