"""GRPO: advantages on known groups, TOPVAR, and a policy loss checked against a hand calculation (§9, §10)."""

from __future__ import annotations

import math

import pytest
import torch

from codea1_core.method.grpo import (
    batch_advantages,
    group_advantages,
    is_zero_variance,
    policy_loss,
    token_logprobs,
    topvar_select,
)

# --------------------------------------------------------------------------------------------------
# Advantages
# --------------------------------------------------------------------------------------------------


def test_group_advantages_known_group():
    # mean 0.5, unbiased std sqrt(1/3): A = ±0.5 / (0.57735 + 1e-6)
    adv = group_advantages([1.0, 0.0, 0.0, 1.0])
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert adv == pytest.approx([expected, -expected, -expected, expected], abs=1e-12)
    assert sum(adv) == pytest.approx(0.0, abs=1e-12)


def test_group_advantages_uses_unbiased_std_and_eps():
    adv = group_advantages([3.0, 1.0], eps=0.5)
    # mean 2, unbiased std sqrt(2); population std would be 1
    assert adv == pytest.approx([1 / (math.sqrt(2) + 0.5), -1 / (math.sqrt(2) + 0.5)], abs=1e-12)


def test_masked_members_get_zero_and_stay_out_of_statistics():
    adv = group_advantages([1.0, 100.0, 0.0, 1.0, 0.0], mask=[True, False, True, True, True])
    unmasked = group_advantages([1.0, 0.0, 1.0, 0.0])
    assert adv[1] == 0.0
    assert [adv[0], adv[2], adv[3], adv[4]] == pytest.approx(unmasked, abs=1e-12)


def test_zero_variance_and_singleton_groups_get_zero():
    assert group_advantages([0.7, 0.7, 0.7]) == [0.0, 0.0, 0.0]
    assert group_advantages([0.3]) == [0.0]
    assert group_advantages([0.0, 1.0], mask=[True, False]) == [0.0, 0.0]
    assert is_zero_variance([0.7, 0.7]) and is_zero_variance([1.0]) and is_zero_variance([])
    assert is_zero_variance([0.0, 1.0], mask=[False, True])
    assert not is_zero_variance([0.0, 1.0])


def test_batch_advantages_counts_zero_variance_groups():
    adv, zero = batch_advantages([[1.0, 0.0], [0.5, 0.5], [2.0]], [[True, True], [True, True], [True]])
    assert zero == 2
    assert adv[1] == [0.0, 0.0] and adv[2] == [0.0]
    assert adv[0][0] > 0 > adv[0][1]


def test_mask_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="mask has 1 entries for 2 rewards"):
        group_advantages([0.0, 1.0], mask=[True])


# --------------------------------------------------------------------------------------------------
# TOPVAR
# --------------------------------------------------------------------------------------------------


def test_topvar_picks_highest_population_std():
    rewards = [[0.5, 0.5, 0.5, 0.5], [0.0, 1.0, 0.0, 1.0], [0.2, 0.4, 0.2, 0.4], [0.0, 0.0, 0.0, 1.0]]
    assert topvar_select(rewards, None, None) == [1]
    assert topvar_select(rewards, None, None, update_n=3) == [1, 3, 2]


def test_topvar_ties_go_to_lowest_index_and_masked_codes_never_win():
    rewards = [[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 5.0]]
    assert topvar_select(rewards, None, [True, True, True, False]) == [1]
    assert topvar_select(rewards, None, [True, False, True, False]) == [2]
    assert topvar_select(rewards, None, [False, False, False, False]) == []


def test_topvar_respects_suite_mask():
    # code 0's spread comes only from a masked (infrastructure-failed) suite
    rewards = [[0.0, 0.0, 9.0], [0.0, 0.5, 0.0]]
    mask = [[True, True, False], [True, True, True]]
    assert topvar_select(rewards, mask, None) == [1]
    assert topvar_select(rewards, None, None) == [0]
    assert topvar_select([[1.0], [0.0, 1.0]], [[False], [True, True]], None, update_n=2) == [1]


# --------------------------------------------------------------------------------------------------
# Token log-probs
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_logprobs_match_log_softmax(dtype):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=gen).to(dtype)
    ids = torch.randint(0, 11, (2, 5), generator=gen)
    got = token_logprobs(logits, ids)
    want = torch.log_softmax(logits.float(), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    assert got.dtype == torch.float32
    assert torch.allclose(got, want, atol=1e-5)
    with pytest.raises(ValueError, match="do not match"):
        token_logprobs(logits, ids[:, :-1])


# --------------------------------------------------------------------------------------------------
# Policy loss: a hand-built batch (float64 so the hand calculation holds to 1e-6)
# --------------------------------------------------------------------------------------------------

# Sample 0 has A = +1, sample 1 has A = -2. Ratios per token (the last token of sample 0 is padding):
RATIOS = [[1.5, 0.5, 3.0], [0.5, 20.0, 1.1]]
MASK = [[1, 1, 0], [1, 1, 1]]
ADV = [1.0, -2.0]
DELTAS = [[0.1, -0.2, 5.0], [3.0, 0.0, -0.5]]  # δ = ref − lp; the padding token is ignored
LP = [[-1.0, -2.0, -0.5], [-0.7, -3.0, -1.2]]


def _batch():
    lp = torch.tensor(LP, dtype=torch.float64, requires_grad=True)
    old = lp.detach() - torch.log(torch.tensor(RATIOS, dtype=torch.float64))
    ref = lp.detach() + torch.tensor(DELTAS, dtype=torch.float64)
    return lp, old, ref, torch.tensor(ADV, dtype=torch.float64), torch.tensor(MASK, dtype=torch.float64)


def _hand_token_loss(a: float, rho: float, low=0.2, high=0.28, c=10.0) -> float:
    clipped = min(max(rho, 1 - low), 1 + high)
    loss = max(-a * rho, -a * clipped)
    return min(loss, -c * a) if a < 0 else loss


def test_policy_loss_matches_hand_calculation():
    lp, old, ref, adv, mask = _batch()
    loss, metrics = policy_loss(lp, old, ref, adv, mask, 0.2, 0.28, 10.0, kl_coef=0.001, kl_clamp=10.0)
    # Token by token (written out, not recomputed through the function):
    #  A=+1, ρ=1.5 -> clip high: max(-1.5, -1.28) = -1.28
    #  A=+1, ρ=0.5 -> max(-0.5, -0.8) = -0.5 (no clip: the low side only binds for A<0)
    #  A=-2, ρ=0.5 -> clip low: max(1.0, 1.6) = 1.6; dual min(1.6, 20) = 1.6
    #  A=-2, ρ=20  -> max(40, 2.56) = 40; dual clip: min(40, 20) = 20
    #  A=-2, ρ=1.1 -> max(2.2, 2.2) = 2.2
    pg_tokens = [-1.28, -0.5, 1.6, 20.0, 2.2]
    assert [_hand_token_loss(1, 1.5), _hand_token_loss(-2, 20.0)] == pytest.approx([-1.28, 20.0])
    pg = sum(pg_tokens) / 5
    kls = [math.exp(d) - d - 1 for d in (0.1, -0.2, 3.0, 0.0, -0.5)]
    kls[2] = 10.0  # e^3 - 4 = 16.09 is clamped to 10
    kl = sum(kls) / 5
    assert loss.item() == pytest.approx(pg + 0.001 * kl, abs=1e-6)
    assert metrics["pg_loss"] == pytest.approx(pg, abs=1e-6)
    assert metrics["kl"] == pytest.approx(kl, abs=1e-6)
    assert metrics["clip_frac_high"] == pytest.approx(1 / 5)
    assert metrics["clip_frac_low"] == pytest.approx(1 / 5)
    assert metrics["dual_clip_frac"] == pytest.approx(1 / 5)
    assert metrics["ratio_mean"] == pytest.approx((1.5 + 0.5 + 0.5 + 20 + 1.1) / 5, abs=1e-9)
    assert metrics["tokens"] == 5


def test_policy_loss_gradients_vanish_where_clipped_and_on_padding():
    lp, old, _, adv, mask = _batch()
    loss, _ = policy_loss(lp, old, None, adv, mask, kl_coef=0.0)
    loss.backward()
    grad = lp.grad
    # d(-A·ρ)/d lp = -A·ρ (ρ = exp(lp - old)); divided by 5 tokens
    assert grad[0, 1].item() == pytest.approx(-1.0 * 0.5 / 5, abs=1e-9)
    assert grad[1, 2].item() == pytest.approx(2.0 * 1.1 / 5, abs=1e-9)
    for t in [(0, 0), (1, 0), (1, 1), (0, 2)]:  # clip high, clip low, dual clip, padding
        assert grad[t].item() == 0.0, t


def test_micro_batches_with_num_tokens_total_accumulate_to_the_full_loss():
    lp, old, ref, adv, mask = _batch()
    full, _ = policy_loss(lp, old, ref, adv, mask)
    full.backward()
    full_grad = lp.grad.clone()
    lp.grad = None
    parts = [
        policy_loss(
            lp[i : i + 1], old[i : i + 1], ref[i : i + 1], adv[i : i + 1], mask[i : i + 1], num_tokens_total=5
        )[0]
        for i in range(2)
    ]
    total = parts[0] + parts[1]
    total.backward()
    assert total.item() == pytest.approx(full.item(), abs=1e-12)
    assert torch.allclose(lp.grad, full_grad, atol=1e-12)
    # without the weight, per-micro-batch token means do NOT add up to the mini-batch mean
    naive = sum(
        policy_loss(lp[i : i + 1], old[i : i + 1], ref[i : i + 1], adv[i : i + 1], mask[i : i + 1])[0]
        for i in range(2)
    )
    assert abs(naive.item() - full.item()) > 1e-3


def test_per_token_advantages_and_on_policy_ratio_of_one():
    lp = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[0.5, -0.5]], dtype=torch.float64)
    loss, metrics = policy_loss(lp, lp.detach(), lp.detach(), adv, torch.ones(1, 2))
    assert loss.item() == pytest.approx(0.0, abs=1e-12)  # ρ = 1, KL = 0, advantages cancel
    assert metrics["ratio_mean"] == pytest.approx(1.0)
    assert metrics["clip_frac_low"] == metrics["clip_frac_high"] == metrics["dual_clip_frac"] == 0.0


def test_padding_values_never_leak_into_loss_or_gradients():
    """Guards against padding positions holding -inf/huge log-probs (e.g. a padded old/ref row)."""
    lp, old, ref, adv, mask = _batch()
    old = old.clone()
    ref = ref.clone()
    old[0, 2] = float("-inf")
    ref[0, 2] = 1e9
    loss, metrics = policy_loss(lp, old, ref, adv, mask)
    clean, _ = policy_loss(*_batch())
    loss.backward()
    assert loss.item() == pytest.approx(clean.item(), abs=1e-12)
    assert torch.isfinite(lp.grad).all() and lp.grad[0, 2].item() == 0.0
    assert math.isfinite(metrics["kl"]) and math.isfinite(metrics["ratio_mean"])
