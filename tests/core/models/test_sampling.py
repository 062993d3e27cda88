"""The one builder of sampling settings (``codea1_core/models/sampling.py``) and the callers that use it."""

from __future__ import annotations

import pytest

from codea1_core.config import Config
from codea1_core.models.sampling import SamplingParams, sampling_params
from codea1_core.types import Problem, TestCase

CFG = Config().replace(
    **{
        "rollout.temperature": 0.9,
        "rollout.top_p": 0.8,
        "rollout.top_k": 7,
        "rollout.max_new_tokens_code": 11,
        "rollout.max_new_tokens_test": 13,
        "rollout.max_prompt_tokens_test": 17,
        "eval.temperature": 0.3,
        "eval.top_p": 0.6,
        "eval.max_new_tokens": 19,
        "seed": 5,
    }
)


def test_rollout_settings_per_role() -> None:
    assert sampling_params(CFG, "rollout", "code", 3) == SamplingParams(0.9, 0.8, 7, 11, 3, 0)
    assert sampling_params(CFG, "rollout", "test", 4) == SamplingParams(0.9, 0.8, 7, 13, 4, 17)


def test_eval_settings_are_the_same_for_both_roles() -> None:
    want = SamplingParams(temperature=0.3, top_p=0.6, top_k=0, max_new_tokens=19, seed=9, max_prompt_tokens=0)
    assert sampling_params(CFG, "eval", "code", 9) == want == sampling_params(CFG, "eval", "test", 9)


def test_unknown_stage_or_role_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="stage: expected 'rollout' or 'eval', got 'train'"):
        sampling_params(CFG, "train", "code", 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="role: expected 'code' or 'test', got 'coder'"):
        sampling_params(CFG, "rollout", "coder", 0)


class _Recorder:
    """A policy that records the settings it is asked to sample with and returns empty completions."""

    def __init__(self) -> None:
        self.seen: list[SamplingParams] = []

    def generate(self, prompts: list, n: int, sampling: SamplingParams) -> list[list]:
        from codea1_core.models.policy import Completion

        self.seen.append(sampling)
        return [[Completion("", [], [], [], "stop") for _ in range(n)] for _ in prompts]


def _problem() -> Problem:
    return Problem(
        id="t/1",
        source="lab",
        split="train",
        prompt="def f(x):\n",
        description="d",
        entry_point="f",
        reference_solution="def f(x):\n    return x\n",
        tests=(TestCase("f(1)", 1),),
    )


def test_training_rollouts_use_the_builder_with_the_iteration_seed() -> None:
    from codea1_core.method.batches import iteration_seed
    from tasks.rollout import rollout_code, rollout_tests

    pol = _Recorder()
    rollout_code.fn(pol, [_problem()], CFG, 2)
    rollout_tests.fn(pol, [_problem()], [["def f(x):\n    return x\n"]], CFG, 2, False)
    assert pol.seen == [
        sampling_params(CFG, "rollout", "code", iteration_seed(5, 2, "code")),
        sampling_params(CFG, "rollout", "test", iteration_seed(5, 2, "test")),
    ]


def test_evaluation_generations_use_the_builder() -> None:
    """Codes at ``seed``, tests at ``seed + 1`` (the seeds evaluation always used)."""
    from tasks.evaluate import generate_codes
    from tasks.evaluate_tests import generate_suites

    pol = _Recorder()
    generate_codes([_problem()], pol, CFG, 2)
    generate_suites([_problem()], pol, CFG)
    assert pol.seen == [sampling_params(CFG, "eval", "code", 5), sampling_params(CFG, "eval", "test", 6)]
