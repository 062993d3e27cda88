"""A real vLLM engine (the CPU build) under full fine-tuning: each update's weights pushed into the running engine.

One engine for the whole module (start-up takes 30-50 s on 2 cores), on the lab's tiny Qwen2 shape in float32.
The tests need ``vllm``: they run in ``.venv-vllm`` (``make test-vllm``; ``make test`` runs them too).

Run: ``.venv-vllm/bin/python -m pytest -m vllm tests/core/models/test_vllm_engine_full.py``.
"""

from __future__ import annotations

import pytest
import torch
from support import VLLM_CORPUS

from codea1_core.config import Config
from codea1_core.models.policy import Policy, SamplingParams, TrainBatch

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

PROMPTS = [[{"role": "user", "content": "Write add."}], [{"role": "user", "content": "Write sub."}]]
PARITY = 1e-5
"""The engine's log-probs vs the policy's recomputation, float32 (docs/method.md §11.1)."""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(policy, rollout): the code role's full-fine-tuning policy and its engine, started from the same weights."""
    pytest.importorskip("vllm")
    from codea1_core.models.tiny_model import build_tiny_model
    from codea1_core.models.vllm_engine import VllmRollout

    tmp = tmp_path_factory.mktemp("vllm_full")
    model = str(build_tiny_model(tmp / "model", VLLM_CORPUS * 3, vocab_size=300, seed=0))
    cfg = Config().replace(
        **{
            "model.device": "cpu",
            "model.dtype": "auto",  # float32 on a CPU: the engine serves the policy's dtype
            "model.finetune": "full",
            "rollout.max_model_len": 512,
            "grpo.lr": 1.0e-2,  # one step moves the weights far enough for the push check to see it
            "grpo.warmup_steps": 0,
        }
    )
    policy = Policy(model, cfg, role="code")
    rollout = VllmRollout(cfg, {"code": model}, tmp / "unused")
    yield policy, rollout
    rollout.engines["code"].llm_engine.engine_core.shutdown()


def gaps(policy: Policy, groups: list) -> list[float]:
    """Per completion: max |engine log-prob - the policy's recomputation|."""
    flat = [c for group in groups for c in group]
    batch = TrainBatch([c.prompt_ids for c in flat], [c.token_ids for c in flat], [0.0] * len(flat))
    recomputed = policy._logprobs_no_grad(batch, list(range(len(flat))), reference=False)
    return [float((torch.tensor(c.logprobs) - recomputed[i]).abs().max()) for i, c in enumerate(flat)]


def test_each_update_is_pushed_into_the_running_engine(served):
    """Full fine-tuning with vLLM: after every GRPO step the engine's log-probs equal the updated policy's
    within 1e-5 (float32), without an engine restart; without the push they are the old weights' (far apart)."""
    from codea1_core.models.vllm_engine import VllmPolicy

    policy, rollout = served
    engine = rollout.engines["code"]
    assert engine.llm_engine.vllm_config.lora_config is None  # no LoRA: the policy's whole weights are served
    code = VllmPolicy(policy, rollout)
    sp = SamplingParams(max_new_tokens=12, seed=5)
    groups = code.generate(
        PROMPTS, 4, sp
    )  # the first generate pushes too (a resumed policy differs from disk)
    assert rollout.versions["code"] == 1 and max(gaps(policy, groups)) < PARITY
    for step in (1, 2):
        flat = [c for g in groups for c in g]
        batch = TrainBatch([c.prompt_ids for c in flat], [c.token_ids for c in flat], [1.0, -1.0] * 4)
        metrics = code.step(batch)
        assert metrics["time/sync_code_s"] > 0.0 and rollout.versions["code"] == 1 + step
        assert min(gaps(policy, [flat])) > 1e-3  # the update moved every sample's log-probs
        groups = code.generate(PROMPTS, 4, sp)
        assert max(gaps(policy, groups)) < PARITY
    assert rollout.engines["code"] is engine  # the same engine throughout
