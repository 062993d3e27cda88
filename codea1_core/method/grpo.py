"""GRPO pieces shared by both policies (docs/method.md §9, §10, D8, D9).

What:
  * :func:`group_advantages` — outcome advantages A = (R − mean)/(std_unbiased + eps) per group (§10, D8);
    masked members (infrastructure failures, D4) get 0 and stay out of the statistics; a zero-variance
    group gets 0 everywhere (D9), which :func:`is_zero_variance` lets the caller count.
  * :func:`topvar_select` — TOPVAR: the code(s) per problem whose test rewards spread most (§9).
  * :func:`token_logprobs` and :func:`policy_loss` — the per-token PPO-clip loss with clip-higher,
    dual clip and the k3 KL to the frozen initial policy, token-mean aggregated (§10).
  * :func:`blocked_token_logprobs` — the same log-probs (and entropies) from final hidden states and the
    LM head, one token block at a time, so full-vocabulary float32 logits never exist for a whole
    micro-batch (at a 152k vocabulary and 32k tokens they would be ~20 GB kept for backward).

What not: no models, optimizers or batching — :mod:`codea1_core.models.policy` builds mini/micro-batches, calls
:func:`policy_loss` and steps the optimizer. Rewards come from :mod:`codea1_core.method.rewards`.

Masks: everywhere in this module ``True`` (or 1) means *included* (a usable sample, a response token);
``False`` members are masked out.

How to run: ``python -m pytest tests/core/method/test_grpo.py -q``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.utils.checkpoint

LOG_RATIO_CLAMP = 20.0
"""|log ρ| and |δ| are clamped to 20 before ``exp`` (as verl does), so a stale token cannot overflow."""


# --------------------------------------------------------------------------------------------------
# Advantages and TOPVAR (plain Python: groups are tiny)
# --------------------------------------------------------------------------------------------------


def _included(n: int, mask: Sequence[bool] | None, what: str) -> list[bool]:
    if mask is None:
        return [True] * n
    if len(mask) != n:
        raise ValueError(f"{what}: mask has {len(mask)} entries for {n} rewards")
    return [bool(m) for m in mask]


def is_zero_variance(
    rewards: Sequence[float], mask: Sequence[bool] | None = None, tol: float = 1e-12
) -> bool:
    """True when the included rewards carry no GRPO signal: fewer than two, or all equal within ``tol`` (D9)."""
    keep = _included(len(rewards), mask, "is_zero_variance")
    vals = [float(r) for r, k in zip(rewards, keep, strict=True) if k]
    return len(vals) < 2 or max(vals) - min(vals) <= tol


def group_advantages(
    rewards: Sequence[float], mask: Sequence[bool] | None = None, eps: float = 1e-6
) -> list[float]:
    """GRPO outcome advantages of one group (§10): A_i = (R_i − mean)/(std_unbiased + eps).

    Groups are the M codes of a problem (Code LLM) or the N suites of one code (Test LLM). Computed in
    float64 from the rewards as given; the official code first rounds rewards to bfloat16 (§17 quirk 14).

    Args:
        rewards: One scalar reward per group member.
        mask: True for members that enter the statistics; False members (D4) get advantage 0.
        eps: The ε of the denominator (``grpo.adv_eps``).

    Returns:
        One advantage per member. A group with fewer than two included members, or zero variance,
        gets all zeros (D9).
    """
    keep = _included(len(rewards), mask, "group_advantages")
    vals = [float(r) for r, k in zip(rewards, keep, strict=True) if k]
    if is_zero_variance(vals):
        return [0.0] * len(rewards)
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))  # unbiased, as torch.std
    return [(float(r) - mean) / (std + eps) if k else 0.0 for r, k in zip(rewards, keep, strict=True)]


def batch_advantages(
    groups: Sequence[Sequence[float]], masks: Sequence[Sequence[bool]] | None = None, eps: float = 1e-6
) -> tuple[list[list[float]], int]:
    """:func:`group_advantages` for many groups; also returns how many groups had zero variance (D9 metric)."""
    out, zero = [], 0
    for i, rewards in enumerate(groups):
        mask = masks[i] if masks is not None else None
        zero += is_zero_variance(rewards, mask)
        out.append(group_advantages(rewards, mask, eps))
    return out, zero


def _population_std(vals: list[float]) -> float:
    mean = sum(vals) / len(vals)
    return math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))


def topvar_select(
    test_rewards: Sequence[Sequence[float]],
    test_mask: Sequence[Sequence[bool]] | None,
    code_mask: Sequence[bool] | None,
    update_n: int = 1,
) -> list[int]:
    """TOPVAR (§9): indices of the ``update_n`` codes of one problem whose N test rewards spread most.

    VAR^m is the population standard deviation (divide by the number of included suites) of
    R_test(m, ·). Ties go to the lowest code index (the official order among ties is unspecified), so
    the choice is deterministic. A code whose ``code_mask`` is False, or whose suites are all masked,
    is never picked (D4).

    Args:
        test_rewards: M rows of N test rewards (row m = the suites written for code m).
        test_mask: M rows of N flags, True for suites that enter the statistics (None = all).
        code_mask: M flags, False for codes that must not be picked (None = all pickable).
        update_n: How many codes to keep (``grpo.update_n``).

    Returns:
        Up to ``update_n`` code indices, highest spread first (fewer when fewer codes are pickable).
    """
    if update_n < 1:
        raise ValueError(f"update_n must be >= 1, got {update_n}")
    n_codes = len(test_rewards)
    codes_ok = _included(n_codes, code_mask, "topvar_select code_mask")
    if test_mask is not None and len(test_mask) != n_codes:
        raise ValueError(f"topvar_select: test_mask has {len(test_mask)} rows for {n_codes} codes")
    spread = []
    for m, row in enumerate(test_rewards):
        keep = _included(len(row), test_mask[m] if test_mask is not None else None, f"topvar_select row {m}")
        vals = [float(r) for r, k in zip(row, keep, strict=True) if k]
        if codes_ok[m] and vals:
            spread.append((-_population_std(vals), m))
    return [m for _, m in sorted(spread)[:update_n]]


# --------------------------------------------------------------------------------------------------
# Token-level loss (torch)
# --------------------------------------------------------------------------------------------------


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """log π(ids) from ``logits`` of shape (B, T, V) and ``ids`` of shape (B, T), in float32.

    No shifting happens here: ``logits[:, t]`` must already be the distribution that produced
    ``ids[:, t]`` (for a causal LM pass ``logits[:, :-1]`` with ``ids[:, 1:]``). Half-precision
    logits are upcast one sequence at a time to bound memory.
    """
    if logits.shape[:-1] != ids.shape:
        raise ValueError(f"token_logprobs: logits {tuple(logits.shape)} do not match ids {tuple(ids.shape)}")
    if logits.dtype in (torch.float32, torch.float64):
        picked = torch.gather(logits, -1, ids.unsqueeze(-1)).squeeze(-1)
        return (picked - torch.logsumexp(logits, dim=-1)).float()
    rows = [
        torch.log_softmax(row.float(), dim=-1).gather(-1, row_ids.unsqueeze(-1)).squeeze(-1)
        for row, row_ids in zip(logits, ids, strict=True)
    ]
    return torch.stack(rows)


def _block_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    ids: torch.Tensor,
    entropy_sink: list | None,
) -> torch.Tensor:
    """log π(ids) of one token block: logits exist only for these tokens, upcast to float32.

    The block's entropy is appended to ``entropy_sink`` the first time only: activation checkpointing
    calls this again in backward, and the recomputation need not repeat it.
    """
    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    logz = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - logz
    if entropy_sink is not None and not entropy_sink:
        with torch.no_grad():
            logp = logits.detach() - logz.detach().unsqueeze(-1)
            entropy_sink.append(-(logp.exp() * logp).sum(-1))
    return picked


def blocked_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    ids: torch.Tensor,
    block_tokens: int = 1024,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(ids) and per-token entropy from final hidden states, ``block_tokens`` tokens at a time (float32).

    Equal to :func:`token_logprobs` of ``linear(hidden, weight, bias)``, but under autograd each block is
    recomputed in backward (activation checkpointing), so what is kept for backward is ``hidden`` itself,
    not ``tokens x vocab`` float32 logits; the peak extra memory is one block's logits.

    Args:
        hidden: (N, H) final hidden states, one row per predicted token (any float dtype).
        weight: (V, H) LM head weight.
        bias: (V,) LM head bias, or None.
        ids: (N,) the token each row predicts.
        block_tokens: Rows per block (the memory/speed trade-off; ``memory_plan`` assumes the same).
        with_entropy: Also return the entropies (a metric; the old/reference passes skip it).

    Returns:
        ``(logprobs, entropy)``, both (N,) float32 (``entropy`` None without ``with_entropy``; no gradient).
    """
    if hidden.shape[:-1] != ids.shape or hidden.dim() != 2:
        raise ValueError(
            f"blocked_token_logprobs: hidden {tuple(hidden.shape)} does not match ids {tuple(ids.shape)}"
        )
    if block_tokens < 1:
        raise ValueError(f"blocked_token_logprobs: block_tokens must be >= 1, got {block_tokens}")
    lps, ents = [], []
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    for start in range(0, hidden.shape[0], block_tokens):
        h, t = hidden[start : start + block_tokens], ids[start : start + block_tokens]
        sink: list | None = [] if with_entropy else None
        if grad:
            lp = torch.utils.checkpoint.checkpoint(
                _block_logprobs, h, weight, bias, t, sink, use_reentrant=False
            )
        else:
            lp = _block_logprobs(h, weight, bias, t, sink)
        lps.append(lp)
        ents.extend(sink or [])
    empty = hidden.new_zeros(0, dtype=torch.float32)
    entropy = (torch.cat(ents) if ents else empty) if with_entropy else None
    return (torch.cat(lps) if lps else empty), entropy


def _masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over mask > 0; values under the mask are never read (padding may hold inf)."""
    return torch.where(mask > 0, x * mask, torch.zeros((), dtype=x.dtype, device=x.device)).sum()


@torch.no_grad()
def _loss_metrics(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    loss_pg: torch.Tensor,
    loss_clip: torch.Tensor,
    loss_dual: torch.Tensor,
    clipped: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> dict[str, float]:
    """Token means of the loss and of where each clip binds (see :func:`policy_loss`)."""
    n = max(float(mask.sum().item()), 1.0)

    def frac(flags: torch.Tensor) -> float:
        return float(_masked_sum(flags.to(mask.dtype), mask).item()) / n

    return {
        "pg_loss": float(_masked_sum(loss_pg, mask).item()) / n,
        "clip_frac_low": frac(clipped & (ratio < 1.0 - clip_low)),
        "clip_frac_high": frac(clipped & (ratio > 1.0 + clip_high)),
        "dual_clip_frac": frac((adv < 0) & (loss_clip > loss_dual)),
        "ratio_mean": float(_masked_sum(ratio, mask).item()) / n,
    }


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip_c: float = 10.0,
    kl_coef: float = 0.001,
    kl_clamp: float = 10.0,
    num_tokens_total: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip + clip-higher + dual-clip policy loss with the k3 KL penalty, token-mean (§10, D8).

    Per response token, with ρ = exp(lp − old):
    L_clip = max(−A·ρ, −A·clip(ρ, 1−clip_low, 1+clip_high)); if A < 0, L = min(L_clip, −c·A).
    δ = ref − lp, kl = clip(exp(δ) − δ − 1, −kl_clamp, kl_clamp).
    Loss = token_mean(L) + kl_coef · token_mean(kl).

    Args:
        logprobs: (B, T) current-policy log-probs (with grad).
        old_logprobs: (B, T) log-probs of the policy that sampled (recomputed before the update).
        ref_logprobs: (B, T) log-probs of the frozen initial policy; None skips the KL term
            (and reports ``kl`` = 0).
        advantages: (B,) per-sample advantages (broadcast to tokens) or (B, T).
        mask: (B, T) 1 for response tokens, 0 for prompt/padding.
        clip_low: PPO clip range below 1 (``grpo.clip_low``).
        clip_high: PPO clip range above 1 (``grpo.clip_high``).
        dual_clip_c: Dual-clip constant c (``grpo.dual_clip_c``).
        kl_coef: Weight of the k3 estimate (``grpo.kl_coef``).
        kl_clamp: Clamp of the k3 estimate (``grpo.kl_clamp``).
        num_tokens_total: When a mini-batch is split into micro-batches, the mini-batch's total number of
            response tokens: the token sums here are divided by it instead of by this micro-batch's own
            count, so summing the micro-batch losses (gradient accumulation) gives exactly the
            mini-batch token mean (§10 weights each micro-batch by its token share; this is that weight).

    Returns:
        ``(loss, metrics)``; metrics are floats over this call's tokens: ``pg_loss``, ``kl``,
        ``clip_frac_low`` (A<0, ρ<1−low: the lower clip is active), ``clip_frac_high`` (A>0,
        ρ>1+high), ``dual_clip_frac`` (A<0 and the dual clip binds), ``ratio_mean``, ``tokens``.
    """
    mask = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1).expand_as(logprobs)
    log_ratio = torch.clamp(logprobs - old_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss_clip = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual = torch.minimum(loss_clip, -dual_clip_c * adv)
    loss_pg = torch.where(adv < 0, loss_dual, loss_clip)

    tokens = float(mask.sum().item())
    denom = float(num_tokens_total) if num_tokens_total is not None else max(tokens, 1.0)
    pg = _masked_sum(loss_pg, mask) / denom
    loss = pg
    kl_mean = 0.0
    if ref_logprobs is not None:
        delta = torch.clamp(ref_logprobs - logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        kl = torch.clamp(torch.exp(delta) - delta - 1.0, -kl_clamp, kl_clamp)
        kl_term = _masked_sum(kl, mask) / denom
        loss = pg + kl_coef * kl_term
        kl_mean = float(_masked_sum(kl.detach(), mask).item()) / max(tokens, 1.0)

    metrics = _loss_metrics(
        ratio, adv, loss_pg, loss_clip, loss_dual, loss_clipped > loss_unclipped, mask, clip_low, clip_high
    )
    metrics.update(kl=kl_mean, tokens=tokens)
    return loss, metrics
