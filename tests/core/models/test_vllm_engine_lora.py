"""A real vLLM engine (the CPU build) serving both roles as LoRA adapters: log-prob parity, sync, adapter-only batches.

One engine for the whole module (start-up takes 30-50 s on 2 cores), on the lab's tiny Qwen2 shape in float32.
The tests need ``vllm``: they run in ``.venv-vllm`` (``make test-vllm``; ``make test`` runs them too).

Run: ``.venv-vllm/bin/python -m pytest -m vllm tests/core/models/test_vllm_engine_lora.py``.
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


def lora_cfg(tmp) -> Config:
    return Config().replace(
        **{
            "model.device": "cpu",
            "model.dtype": "float32",
            "rollout.max_model_len": 512,
            "grpo.lr": 5.0e-2,  # one step moves the adapter far enough for the sync check to see it
            "grpo.warmup_steps": 0,
            "orchestration.checkpoint_dir": str(tmp / "train"),
        }
    )


def nudge_adapter(policy: Policy, seed: int) -> None:
    """Random ``lora_B`` (peft initialises it to zero): the adapter then changes every log-prob."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(config, {role: policy}, rollout): one shared engine, both roles' adapters synced once."""
    pytest.importorskip("vllm")
    from codea1_core.models.tiny_model import build_tiny_model
    from codea1_core.models.vllm_engine import VllmRollout

    tmp = tmp_path_factory.mktemp("vllm_lora")
    model = str(build_tiny_model(tmp / "model", VLLM_CORPUS * 3, vocab_size=300, seed=0))
    cfg = lora_cfg(tmp)
    policies = {role: Policy(model, cfg, role=role) for role in ("code", "test")}
    nudge_adapter(policies["code"], 1)
    nudge_adapter(policies["test"], 2)
    rollout = VllmRollout(cfg, {"code": model, "test": model}, tmp / "adapters")
    for policy in policies.values():
        rollout.sync(policy)
    yield cfg, policies, rollout
    for engine in {id(e): e for e in rollout.engines.values()}.values():
        engine.llm_engine.engine_core.shutdown()


def gaps(policy: Policy, groups: list, reference: bool = False) -> list[float]:
    """Per completion: max |engine log-prob - the policy's recomputation| (``reference``: adapter disabled)."""
    flat = [c for group in groups for c in group]
    batch = TrainBatch([c.prompt_ids for c in flat], [c.token_ids for c in flat], [0.0] * len(flat))
    recomputed = policy._logprobs_no_grad(batch, list(range(len(flat))), reference=reference)
    return [float((torch.tensor(c.logprobs) - recomputed[i]).abs().max()) for i, c in enumerate(flat)]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_both_roles_logprobs_equal_the_policy_recomputation(served, temperature):
    """Each role's adapter on the one engine: the log-probs of the sampled tokens equal the training policy's
    (raw, temperature-1) recomputation within 1e-5, at the rollout temperature and at the evaluation's; and they
    are the adapter's, not the base model's."""
    _, policies, rollout = served
    sp = SamplingParams(
        max_new_tokens=12, seed=3, temperature=temperature, top_p=0.9 if temperature < 1 else 1.0
    )
    for role in ("code", "test", "code"):  # interleaved: each call serves only its own role's adapter
        groups = rollout.generate(role, PROMPTS, 3, sp)
        assert sum(len(c.token_ids) for g in groups for c in g) > 12
        assert max(gaps(policies[role], groups)) < PARITY
        assert min(gaps(policies[role], groups, reference=True)) > 1e-3


def test_every_request_carries_its_roles_adapter(served, tmp_path):
    """No request without an adapter reaches a LoRA engine (vLLM's CPU LoRA kernels can apply the last adapter's
    delta to adapter-less requests batched with adapter ones): generate hands each call the role's current
    ``LoRARequest``, and refuses a role that has none yet."""
    from codea1_core.models.vllm_engine import VllmRollout

    cfg, policies, rollout = served
    engine = rollout.engines["code"]
    seen = []
    real = engine.generate

    def spy(prompts, params, lora_request=None, **kwargs):
        seen.append(lora_request)
        return real(prompts, params, lora_request=lora_request, **kwargs)

    engine.generate = spy
    try:
        for role in ("code", "test"):
            rollout.generate(role, PROMPTS, 2, SamplingParams(max_new_tokens=4, seed=1))
        fresh = VllmRollout(
            cfg, {"code": rollout.base_paths["code"]}, tmp_path, llm_factory=lambda **_: engine
        )
        with pytest.raises(RuntimeError, match="no adapter synced yet"):
            fresh.generate("code", PROMPTS, 1, SamplingParams(max_new_tokens=4))
    finally:
        del engine.generate
    assert seen == [rollout.lora_requests["code"], rollout.lora_requests["test"]]
    assert all(r is not None for r in seen)


def test_after_a_step_and_sync_the_engine_samples_from_the_updated_adapter(served):
    """A GRPO step through :class:`VllmPolicy` syncs the new adapter (a new version, a new id): the engine's
    log-probs equal the updated policy's; without the sync they would be the old adapter's (checked: far apart)."""
    from codea1_core.models.vllm_engine import VllmPolicy

    _, policies, rollout = served
    code = VllmPolicy(policies["code"], rollout)
    code._stale = False  # the fixture synced it
    old_request = rollout.lora_requests["code"]
    sp = SamplingParams(max_new_tokens=12, seed=7)
    groups = code.generate(PROMPTS, 4, sp)
    flat = [c for g in groups for c in g]
    batch = TrainBatch([c.prompt_ids for c in flat], [c.token_ids for c in flat], [1.0, -1.0] * 4)
    before = gaps(policies["code"], [flat])
    metrics = code.step(batch)
    assert max(before) < PARITY and metrics["time/sync_code_s"] > 0.0
    new_request = rollout.lora_requests["code"]
    assert (
        new_request.lora_int_id != old_request.lora_int_id and new_request.lora_path != old_request.lora_path
    )
    stale = gaps(policies["code"], [flat])  # the old samples' engine log-probs vs the updated policy
    assert min(stale) > 1e-3
    after = code.generate(PROMPTS, 4, sp)
    assert max(gaps(policies["code"], after)) < PARITY


def test_a_batch_over_the_prefill_token_budget(served):
    """More prompt tokens in one call than vLLM schedules per step (4096) with per-request seeds: on the CPU
    build a prompt prefilled in chunks kills the engine (its seeded generator cannot rewind), so the engine
    prefills whole prompts; the samples are still the adapter's and reproducible."""
    _, policies, rollout = served
    text = "assert add(1, 2) == 3\n" * 12
    long = [[{"role": "user", "content": f"Write add number {i}. {text}"}] for i in range(16)]
    sp = SamplingParams(max_new_tokens=3, seed=11)
    groups = rollout.generate("code", long, 4, sp)
    assert sum(len(c.prompt_ids) for g in groups for c in g) > 3 * 4096
    assert max(gaps(policies["code"], groups)) < PARITY
    again = rollout.generate("code", long[:2], 4, sp)
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in groups[:2]]


def test_streaming_the_rollout_samples_what_generate_samples(served):
    """The train step's overlap reads the rollout prompt by prompt as the engine finishes them (``on_chunk``):
    the real engine's loop gives each prompt once, with the tokens and log-probs one ``generate`` call gives."""
    _, _, rollout = served
    prompts = [*PROMPTS, [{"role": "user", "content": "Write mul."}]]
    sp = SamplingParams(max_new_tokens=10, seed=7)
    whole = rollout.generate("test", prompts, 3, sp)
    seen: list = []
    streamed = rollout.generate("test", prompts, 3, sp, on_chunk=lambda i, rows: seen.append((i, rows)))
    assert sorted(i for i, _ in seen) == [0, 1, 2]
    for i, rows in seen:
        assert rows == [streamed[i]]
    for a, b in zip(whole, streamed, strict=True):
        assert [c.token_ids for c in a] == [c.token_ids for c in b]
        assert [c.logprobs for c in a] == [c.logprobs for c in b]
