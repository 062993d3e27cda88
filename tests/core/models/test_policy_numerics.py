"""Real-model numerics of the update: bf16 full fine-tuning learns; blocked log-probs match.

All on a tiny random-init Qwen2 model built locally (no downloads), CPU.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")

from codea1_core.config import Config  # noqa: E402
from codea1_core.method.grpo import blocked_token_logprobs, token_logprobs  # noqa: E402
from codea1_core.models.policy import Policy, SamplingParams, TrainBatch  # noqa: E402
from codea1_core.models.tiny_model import build_tiny_model  # noqa: E402

CORPUS = ["def add(a, b):\n    return a + b\n", "assert add(1, 2) == 3\n", "Write add(a, b) in Python."] * 20
PROMPTS = [
    [{"role": "user", "content": "Write add(a, b)."}],
    [{"role": "user", "content": "Sum two numbers."}],
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return str(build_tiny_model(tmp_path_factory.mktemp("num") / "model", CORPUS, vocab_size=300, seed=0))


def make_policy(tiny_dir, **overrides) -> Policy:
    base = {"model.device": "cpu", "grpo.warmup_steps": 1, "grpo.mini_batches": 1, "grpo.weight_decay": 0.0}
    torch.manual_seed(0)
    return Policy(tiny_dir, Config().replace(**{**base, **overrides}), role="code", total_steps=100)


def fixed_batch(pol: Policy) -> TrainBatch:
    outs = pol.generate(PROMPTS, 3, SamplingParams(max_new_tokens=8, seed=3))
    flat = [c for g in outs for c in g]
    adv = [(-1.0) ** i * (0.5 + 0.1 * i) for i in range(len(flat))]
    return TrainBatch([c.prompt_ids for c in flat], [c.token_ids for c in flat], adv)


def weights(pol: Policy) -> dict[str, torch.Tensor]:
    return {k: p.detach().float().clone() for k, p in pol.model.named_parameters() if p.requires_grad}


@pytest.fixture(scope="module")
def fp32_and_bf16_runs(tiny_dir):
    runs = {}
    for dtype in ("float32", "bfloat16"):
        pol = make_policy(tiny_dir, **{"model.finetune": "full", "model.dtype": dtype, "grpo.lr": 1.0e-6})
        batch = fixed_batch(make_policy(tiny_dir))  # the same float32 rollouts for both runs
        before = weights(pol)
        for _ in range(4):
            pol.step(batch)
        runs[dtype] = (pol, {k: weights(pol)[k] - before[k] for k in before})
    return runs


def test_bf16_full_finetune_moves_weights_like_fp32(fp32_and_bf16_runs):
    """Bug: AdamW on bf16 weights rounded almost every lr-1e-6 update away (~2% of elements moved).

    With float32 master weights the bf16 full fine-tuning run moves its weights like the float32 run:
    nearly every element moves, with the same sign and a similar total size.
    """
    _, ref = fp32_and_bf16_runs["float32"]
    _, got = fp32_and_bf16_runs["bfloat16"]
    d_ref = torch.cat([v.flatten() for v in ref.values()])
    d_got = torch.cat([v.flatten() for v in got.values()])
    moved = (d_got != 0).float().mean().item()
    assert moved > 0.9, f"only {moved:.1%} of the weights moved"
    big = d_ref.abs() > 0.5 * d_ref.abs().median()
    same_sign = (torch.sign(d_got[big]) == torch.sign(d_ref[big])).float().mean().item()
    assert same_sign > 0.9, f"only {same_sign:.1%} of the updates have the fp32 run's sign"
    ratio = (d_got.norm() / d_ref.norm()).item()
    assert 0.7 < ratio < 1.3, f"update size {ratio:.2f}x the fp32 run's"


def test_bf16_full_finetune_keeps_fp32_master_and_optimizer_state(fp32_and_bf16_runs):
    pol, _ = fp32_and_bf16_runs["bfloat16"]
    assert all(p.dtype == torch.float32 for p in pol.model.parameters())
    state = [s for s in pol.optimizer.state.values() if "exp_avg" in s]
    assert state and all(s["exp_avg"].dtype == torch.float32 for s in state)
    assert all(p.dtype == torch.bfloat16 for p in pol.ref_model.parameters())  # frozen: no master copy


def test_lora_adapters_stay_fp32_over_a_bf16_base(tiny_dir):
    pol = make_policy(tiny_dir, **{"model.dtype": "bfloat16"})
    trainable = [p for p in pol.model.parameters() if p.requires_grad]
    frozen = [p for p in pol.model.parameters() if not p.requires_grad]
    assert trainable and all(p.dtype == torch.float32 for p in trainable)
    assert all(p.dtype == torch.bfloat16 for p in frozen)


# ------------------------------------------------------------------------------------------ blocked log-probs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocked_logprobs_match_full_logits_values_and_grads(dtype):
    torch.manual_seed(0)
    hidden = torch.randn(37, 16, dtype=dtype, requires_grad=True)
    weight = (torch.randn(50, 16) * 0.3).to(dtype).requires_grad_(True)
    ids = torch.randint(0, 50, (37,))
    full = token_logprobs(torch.nn.functional.linear(hidden, weight)[None], ids[None])[0]
    g_full = torch.autograd.grad(full.sum(), (hidden, weight))
    blocked, entropy = blocked_token_logprobs(hidden, weight, None, ids, block_tokens=8)
    g_blocked = torch.autograd.grad(blocked.sum(), (hidden, weight))
    torch.testing.assert_close(blocked, full, atol=1e-5, rtol=1e-5)
    for a, b in zip(g_blocked, g_full, strict=True):
        torch.testing.assert_close(
            a.float(), b.float(), atol=1e-2 if dtype == torch.bfloat16 else 1e-5, rtol=1e-2
        )
    logp = torch.log_softmax(torch.nn.functional.linear(hidden, weight).float(), -1)
    torch.testing.assert_close(entropy, -(logp.exp() * logp).sum(-1).detach(), atol=1e-5, rtol=1e-5)
    assert not entropy.requires_grad


def test_policy_logprobs_match_the_full_logits_path(tiny_dir):
    """The blocked update path gives today's values: log-softmax of the model's own logits, same tokens."""
    pol = make_policy(tiny_dir)
    batch = fixed_batch(pol)
    samples = list(zip(batch.prompt_ids, batch.completion_ids, strict=True))
    pol.model.eval()
    with torch.no_grad():
        lp, cmask, ent = pol._forward(samples)
        for row, (p, c) in enumerate(samples):
            logits = pol.model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1 : len(p) + len(c) - 1]
            logp = torch.log_softmax(logits.float(), -1)
            expected = logp.gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
            torch.testing.assert_close(lp[row, : len(c)], expected, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(ent[row, : len(c)], -(logp.exp() * logp).sum(-1), atol=1e-5, rtol=1e-5)
            assert cmask[row].sum() == len(c)


def test_bf16_full_finetune_checkpoint_keeps_the_fp32_master(fp32_and_bf16_runs, tiny_dir, tmp_path):
    """A resume must not round the master weights to bf16 (the 1e-6 moves would be lost on every resume)."""
    pol, _ = fp32_and_bf16_runs["bfloat16"]
    pol.save(tmp_path / "ckpt")
    resumed = make_policy(
        tiny_dir, **{"model.finetune": "full", "model.dtype": "bfloat16", "grpo.lr": 1.0e-6}
    )
    resumed.load(tmp_path / "ckpt")
    for (k, a), b in zip(pol.model.named_parameters(), resumed.model.parameters(), strict=True):
        assert b.dtype == torch.float32 and torch.equal(a.detach(), b.detach()), k
