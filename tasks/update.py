"""Update tasks: one lockstep GRPO step of the Code LLM and of the Test LLM (docs/method.md §3 steps 13-15, §10).

What it does: hands the GRPO samples built by ``codea1_core.method.batches`` (advantages per group, TOPVAR groups for
the Test LLM) to ``Policy.step`` and prefixes the returned metrics (``code/``, ``test/``, ``grpo/``). Both
policies update in the same training step from the same rollouts, generated before either update. Timings a
policy reports (``time/...``, e.g. the vLLM engine's sync) keep their name.
What it does not: compute advantages or select samples (pure, in ``codea1_core.method.batches`` / ``grpo``).
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from codea1_core.method.batches import GroupBatch


def _step(policy: Any, batch: GroupBatch, role: str) -> dict[str, float]:
    from codea1_core.models.policy import TrainBatch

    metrics = {f"grpo/{role}/zero_variance_groups": float(batch.zero_variance_groups)}
    metrics[f"grpo/{role}/samples"] = float(len(batch))
    ranks = getattr(policy, "data_parallel", None)  # several ranks: all step, unless every batch is empty
    if (len(batch) if ranks is None else ranks.total(len(batch))) == 0:
        return metrics
    flags = batch.in_zero_variance_group or None
    out = policy.step(TrainBatch(batch.prompt_ids, batch.completion_ids, batch.advantages, None, flags))
    numbers = {k: float(v) for k, v in out.items() if isinstance(v, (int, float))}
    metrics.update({k if k.startswith("time/") else f"grpo/{role}/{k}": v for k, v in numbers.items()})
    return metrics


@task(name="update_code", task_run_name="update_code[it={iteration}]", cache_policy=NO_CACHE)
def update_code(policy: Any, batch: GroupBatch, iteration: int) -> dict[str, float]:
    """GRPO step of the Code LLM on all B*M code samples (§3 step 12)."""
    return _step(policy, batch, "code")


@task(name="update_test", task_run_name="update_test[it={iteration}]", cache_policy=NO_CACHE)
def update_test(policy: Any, batch: GroupBatch, iteration: int) -> dict[str, float]:
    """GRPO step of the Test LLM on the TOPVAR groups (§3 step 11, §9)."""
    return _step(policy, batch, "test")
