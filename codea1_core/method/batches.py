"""Pure helpers of one training iteration: the problem sampler, per-iteration seeds, training batches.

What it does: everything of docs/method.md §3 that is arithmetic rather than I/O — which problems step ``t``
draws (§3 step 1), the sampling seed of an iteration, the Code-LLM and Test-LLM GRPO batches built from
rollouts and scores (§3 steps 11-14, §9, §10), and the config fingerprint that decides whether a checkpoint
may be resumed.
What it does not: generate, execute, track or save anything (no prefect/mlflow/sandbox imports here; the
Prefect tasks in ``tasks/`` call these functions).

The sampler is a pure function of ``(seed, step)``: a resumed run needs only the step number as its data
cursor and draws exactly the batches an uninterrupted run would have drawn.

Run: imported by ``flows/train.py``; tested through ``tests/flows/test_train_flow.py``.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from typing import Any

# Sections whose values do not change what is trained: a checkpoint stays resumable across them.
_RESUME_NEUTRAL = ("orchestration", "tracking", "eval", "distributed")
_RESUME_NEUTRAL_KEYS = ("sandbox.workers", "rollout.batch_size", "data.data_dir")


def steps_per_epoch(n_problems: int, batch_size: int) -> int:
    """floor(|D| / B): the last partial batch is dropped (§3 step 1)."""
    if batch_size <= 0:
        raise ValueError(f"data.train_batch_size must be positive, got {batch_size}")
    return n_problems // batch_size


def total_steps(n_problems: int, batch_size: int, epochs: int, max_steps: int = 0) -> int:
    """Training steps: floor(|D| / B) x epochs, capped by ``max_steps`` when it is > 0."""
    steps = steps_per_epoch(n_problems, batch_size) * epochs
    return min(steps, max_steps) if max_steps > 0 else steps


def batch_indices(n_problems: int, batch_size: int, seed: int, step: int) -> list[int]:
    """Problem indices of training step ``step`` (0-based): a fresh seeded shuffle per epoch (§3 step 1).

    Each epoch visits every problem of the full batches once; the permutation of epoch ``e`` is seeded
    with ``(seed, e)`` so the draw depends only on the step number.
    """
    per_epoch = steps_per_epoch(n_problems, batch_size)
    if per_epoch == 0:
        raise ValueError(
            f"{n_problems} training problems < data.train_batch_size={batch_size}: no full batch"
        )
    epoch, offset = divmod(step, per_epoch)
    order = list(range(n_problems))
    random.Random(f"sampler:{seed}:{epoch}").shuffle(order)
    return order[offset * batch_size : (offset + 1) * batch_size]


def iteration_seed(seed: int, iteration: int, role: str) -> int:
    """Sampling seed of ``role`` at ``iteration``, derived from (cfg.seed, iteration) so a resumed run reproduces."""
    digest = hashlib.sha256(f"{seed}:{iteration}:{role}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def config_fingerprint(flat: dict[str, Any]) -> str:
    """Hash of the settings that define a training run (resume-neutral sections excluded)."""
    kept = {
        k: v
        for k, v in sorted(flat.items())
        if k.split(".")[0] not in _RESUME_NEUTRAL and k not in _RESUME_NEUTRAL_KEYS
    }
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class GroupBatch:
    """Flat GRPO training samples: one row per completion, grouped advantages already computed (§10)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    advantages: list[float]
    zero_variance_groups: int
    groups: int
    in_zero_variance_group: list[bool] = field(default_factory=list)
    """Per sample: True when its group had zero reward variance (D9: what ``skip_zero_variance_groups`` skips)."""

    def __len__(self) -> int:
        return len(self.advantages)

    def concat(self, other: GroupBatch) -> GroupBatch:
        """Both roles' samples in one batch (Self-Play: one model learns from both, §18.2)."""
        return GroupBatch(
            self.prompt_ids + other.prompt_ids,
            self.completion_ids + other.completion_ids,
            self.advantages + other.advantages,
            self.zero_variance_groups + other.zero_variance_groups,
            self.groups + other.groups,
            self.in_zero_variance_group + other.in_zero_variance_group,
        )


def build_group_batch(groups: list[tuple[list[Any], list[float], list[bool]]], grpo: Any) -> GroupBatch:
    """GRPO samples from ``(completions, rewards, mask)`` groups; masked members are left out (D4).

    ``completions`` carry ``prompt_ids`` and ``token_ids``; advantages are (R - mean)/(std + eps) over the
    unmasked members of a group (§10, D8); zero-variance groups keep advantage 0 and are counted (D9).
    """
    from codea1_core.method.grpo import group_advantages, is_zero_variance

    prompt_ids: list[list[int]] = []
    completion_ids: list[list[int]] = []
    advantages: list[float] = []
    flags: list[bool] = []
    zero = 0
    for completions, rewards, mask in groups:
        flat = is_zero_variance(rewards, mask)
        zero += flat
        adv = group_advantages(rewards, mask, grpo.adv_eps)
        for comp, a, keep in zip(completions, adv, mask, strict=True):
            if keep:
                prompt_ids.append(list(comp.prompt_ids))
                completion_ids.append(list(comp.token_ids))
                advantages.append(float(a))
                flags.append(flat)
    return GroupBatch(prompt_ids, completion_ids, advantages, zero, len(groups), flags)


def code_groups(
    code_completions: list[list[Any]], scores: list[Any]
) -> list[tuple[list[Any], list[float], list[bool]]]:
    """Code-LLM groups: the M codes of each problem (§3 step 12: all B*M samples)."""
    return [
        (comps, list(s.code_rewards), list(s.code_mask))
        for comps, s in zip(code_completions, scores, strict=True)
    ]


def test_groups(
    test_completions: list[list[list[Any]]], scores: list[Any], update_n: int
) -> tuple[list[tuple[list[Any], list[float], list[bool]]], list[list[int]]]:
    """Test-LLM groups picked by TOPVAR: per problem the N suites of the highest-spread code(s) (§9).

    ``test_completions[b][m]`` are the N completions written against code m of problem b. Returns the groups
    and, per problem, the selected code indices.
    """
    from codea1_core.method.grpo import topvar_select

    groups = []
    picked: list[list[int]] = []
    for comps_b, s in zip(test_completions, scores, strict=True):
        chosen = topvar_select(s.test_rewards, s.test_mask, s.code_mask, update_n) if s.test_rewards else []
        picked.append(list(chosen))
        for m in chosen:
            groups.append((comps_b[m], list(s.test_rewards[m]), list(s.test_mask[m])))
    return groups, picked


def sample_rows(
    problems: list[Any],
    code_completions: list[list[Any]],
    test_completions: list[list[list[Any]]] | None,
    scores: list[Any],
    limit: int,
) -> list[dict[str, Any]]:
    """The sample-rollouts table logged per iteration: problem, code, its first test suite, rewards, outcome."""
    rows: list[dict[str, Any]] = []
    for b, (problem, comps, s) in enumerate(zip(problems, code_completions, scores, strict=True)):
        for m, comp in enumerate(comps):
            if len(rows) >= limit:
                return rows
            test_r = s.test_rewards[m] if m < len(s.test_rewards) else []
            suite = test_completions[b][m][0].text if test_completions else ""
            rows.append(
                {
                    "problem": problem.id,
                    "code": comp.text[:2000],
                    "tests": suite[:2000],
                    "code_reward": float(s.code_rewards[m]),
                    "test_rewards": json.dumps([round(float(r), 4) for r in test_r]),
                    "outcome": "masked" if not s.code_mask[m] else "scored",
                }
            )
    return rows
