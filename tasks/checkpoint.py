"""The checkpoint task of the train flow: one atomic, verified checkpoint per iteration.

What it does: :func:`checkpoint` (task run ``checkpoint[it=N]``, retried once) writes the iteration's
checkpoint with :func:`workspace.checkpoints.save_checkpoint` and returns its folder. The Mistake Book comes
as the file the merge task wrote this step, copied byte for byte (the book is serialised once per step).
What it does not: decide when to checkpoint (the train flow does) or how a checkpoint is laid out, verified
and resumed (:mod:`workspace.checkpoints`, :mod:`workspace.resume`).

Tests: ``pytest tests/tasks/test_checkpoint.py``.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from workspace.checkpoints import save_checkpoint


@task(name="checkpoint", task_run_name="checkpoint[it={iteration}]", cache_policy=NO_CACHE, retries=1)
def checkpoint(
    checkpoint_dir: str,
    iteration: int,
    policies: dict[str, Any],
    book: str | None,
    state: dict[str, Any],
    keep: int = 2,
) -> str:
    """Prefect task: :func:`workspace.checkpoints.save_checkpoint`; returns the folder path."""
    return str(save_checkpoint(checkpoint_dir, iteration, policies, book, state, keep))
