"""Sampling settings: the :class:`SamplingParams` of one ``generate`` call and the one place they are built.

What it does: :func:`sampling_params` turns the config into the settings of a training rollout
(``rollout.*``, docs/method.md §3 step 2) or of an evaluation, ``solve`` or ``attack`` generation (``eval.*``,
§13). Every backend reads the same object: HF ``generate`` and :mod:`codea1_core.models.cpu_decode.engine`
through :meth:`codea1_core.models.policy.Policy.generate` (temperature / top-k / top-p warpers, greedy at
temperature 0), vLLM through :meth:`codea1_core.models.vllm_engine.VllmRollout.generate`.
What it does not: choose seeds (training derives them with ``batches.iteration_seed``, evaluation from
``cfg.seed``; both are the caller's), or sample anything.

Run: ``pytest tests/core/models/test_sampling.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from codea1_core.config import Config

Stage = Literal["rollout", "eval"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings for one :meth:`Policy.generate` call (temperature 0 = greedy)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    seed: int = 0
    max_prompt_tokens: int = 0
    """Prompt length limit in tokens (0 = none); a longer prompt raises :class:`PromptTooLongError`."""


def sampling_params(cfg: Config, stage: Stage, role: str, seed: int) -> SamplingParams:
    """The settings of one generation of ``role`` (``code`` / ``test``) at ``stage``, with ``seed``.

    ``rollout`` (§3 step 2; the paper samples at temperature 1.0, top-p 1.0, no top-k): ``rollout.temperature``,
    ``top_p``, ``top_k``, ``max_new_tokens_<role>``; Test-LLM prompts are limited to
    ``rollout.max_prompt_tokens_test`` (an over-long one is an error), code prompts were filtered before
    the rollout (``data.max_prompt_tokens``). ``eval`` (§13, EvalPlus protocol): ``eval.temperature``,
    ``eval.top_p``, ``eval.max_new_tokens`` for both roles, no top-k, no prompt limit.
    """
    if role not in ("code", "test"):
        raise ValueError(f"role: expected 'code' or 'test', got {role!r}")
    if stage == "rollout":
        r = cfg.rollout
        return SamplingParams(
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            max_new_tokens=r.max_new_tokens_code if role == "code" else r.max_new_tokens_test,
            seed=seed,
            max_prompt_tokens=r.max_prompt_tokens_test if role == "test" else 0,
        )
    if stage == "eval":
        e = cfg.eval
        return SamplingParams(
            temperature=e.temperature, top_p=e.top_p, top_k=0, max_new_tokens=e.max_new_tokens, seed=seed
        )
    raise ValueError(f"stage: expected 'rollout' or 'eval', got {stage!r}")
