"""GPU checks: the lockstep two-role GRPO step and batched rollout on a Qwen2.5-Coder-1.5B-shaped model.

A random-init model with Qwen2.5-Coder-1.5B's config (bf16, LoRA r=16 on all projections, the default
``model.*`` settings) is built locally; nothing is downloaded. Each test prints its measurements
(peak memory, step time, tokens/s) on one ``GPU-BENCH`` line; run with ``pytest -m gpu -s``.
Skipped, with the reason, on machines without CUDA.
"""

from __future__ import annotations

import random
import time

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
    ),
]

PROMPT_TOKENS, COMPLETION_TOKENS, SAMPLES = 512, 256, 16


@pytest.fixture(scope="module")
def model_1p5b(tmp_path_factory):
    from codea1_core.models.tiny_model import build_tiny_model, random_init_like

    work = tmp_path_factory.mktemp("gpu")
    tiny = build_tiny_model(work / "tiny", ["def f(x):\n    return x\n", "assert f(1) == 1\n"] * 50)
    return str(random_init_like("Qwen/Qwen2.5-Coder-1.5B-Instruct", work / "qwen1p5b", tokenizer_dir=tiny))


def _cfg(**overrides):
    from codea1_core.config import Config

    base = {"model.device": "cuda", "model.dtype": "bfloat16", "grpo.micro_batch_tokens": 8192}
    return Config().replace(**{**base, **overrides})


def _batch(vocab: int, seed: int):
    from codea1_core.models.policy import TrainBatch

    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(PROMPT_TOKENS)] for _ in range(SAMPLES)]
    completions = [
        [rng.randrange(3, vocab) for _ in range(rng.randint(COMPLETION_TOKENS // 2, COMPLETION_TOKENS))]
        for _ in range(SAMPLES)
    ]
    advantages = [rng.gauss(0.0, 1.0) for _ in range(SAMPLES)]
    return TrainBatch(prompts, completions, advantages)


def _trainable(policy) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in policy.model.named_parameters() if p.requires_grad}


def test_two_role_grpo_step_lora_1p5b(model_1p5b):
    from codea1_core.models.policy import Policy

    torch.cuda.reset_peak_memory_stats()
    code, test = Policy(model_1p5b, _cfg(), role="code"), Policy(model_1p5b, _cfg(), role="test")
    loaded_gb = torch.cuda.memory_allocated() / 2**30
    vocab = len(code.tokenizer)
    base_probe = next(p for k, p in code.model.named_parameters() if "embed_tokens" in k).detach().clone()
    test_before = _trainable(test)
    times = {}
    for policy, seed in ((code, 0), (test, 1)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        metrics = policy.step(_batch(vocab, seed))
        torch.cuda.synchronize()
        times[policy.role] = time.perf_counter() - t0
        assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values()), metrics
        assert metrics["grad_norm"] > 0
        if policy is code:  # the code step must leave the test policy untouched
            for k, v in _trainable(test).items():
                assert torch.equal(v, test_before[k]), k
    assert torch.equal(next(p for k, p in code.model.named_parameters() if "embed_tokens" in k), base_probe)
    peak_gb = torch.cuda.max_memory_allocated() / 2**30
    print(
        f"\nGPU-BENCH two-role step: {torch.cuda.get_device_name()} | 2 x Qwen2.5-Coder-1.5B-shape bf16 LoRA r=16 | "
        f"{SAMPLES} samples x ({PROMPT_TOKENS} prompt + <= {COMPLETION_TOKENS} completion) per role | "
        f"weights {loaded_gb:.1f} GiB | peak {peak_gb:.1f} GiB | step code {times['code']:.2f} s, "
        f"test {times['test']:.2f} s"
    )


def test_batched_generate_1p5b(model_1p5b):
    from codea1_core.models.policy import Policy, SamplingParams

    prompts = [[{"role": "user", "content": f"Write f{i}(x) returning x + {i}."}] for i in range(16)]
    rates = {}
    for batch_size in (1, 16):
        policy = Policy(model_1p5b, _cfg(**{"rollout.batch_size": batch_size}), role="code")
        policy.generate(prompts[:1], 1, SamplingParams(max_new_tokens=4))  # warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        outs = policy.generate(prompts, 4, SamplingParams(max_new_tokens=64, seed=0))
        torch.cuda.synchronize()
        tokens = sum(len(c.token_ids) for group in outs for c in group)
        rates[batch_size] = tokens / (time.perf_counter() - t0)
        assert all(len(c.logprobs) == len(c.token_ids) for group in outs for c in group)
        del policy
        torch.cuda.empty_cache()
    print(
        f"\nGPU-BENCH generate: 16 prompts x n=4 x 64 new tokens | one prompt per call {rates[1]:.0f} tok/s | "
        f"16 prompts per call {rates[16]:.0f} tok/s ({rates[16] / rates[1]:.1f}x)"
    )
    assert rates[16] > rates[1]
