"""HF ``generate`` for small Qwen2 decoders on the CPU, without its per-token overhead: exact, or shared-prompt.

What it does: :func:`sample` runs the sampling loop of ``transformers``' ``GenerationMixin._sample`` for the
settings :class:`codea1_core.models.policy.Policy` uses (temperature/top-k/top-p warpers, EOS + max-length
stopping, finished rows padded), with one of two decoders (``rollout.share_prompt``):

* shared-prompt (the default, :func:`codea1_core.models.cpu_decode.shared.sample_shared`): each prompt is
  prefilled once and its ``n`` samples attend over one copy of its keys/values; the same distribution as
  ``generate`` from other random numbers, logits equal to float rounding;
* exact (``share_prompt=False``, or ``n == 1``, :func:`codea1_core.models.cpu_decode.exact.sample_exact`): the
  same tokens and raw-logit log-probs as ``generate``, bit for bit, given the same torch RNG state.

Both start from ``generate``'s prefill (:mod:`codea1_core.models.cpu_decode.prefill`) and run the decode step
:class:`codea1_core.models.cpu_decode.forward.DecodeStep`: HF's Qwen2 ops in HF's order on the model's tensors
(its rotary and attention functions called directly), without the forward's per-token plumbing.
``tests/core/models/cpu_decode/test_engine.py`` compares its logits bitwise with HF's forward, and tokens and
log-probs for exact equality with ``generate``.

What it does not: run on GPUs (not checked there: HF ``generate`` or vLLM), beam search, assisted
decoding, repetition penalties or any other logits processor, sliding-window or linear-attention caches,
model families it was not checked on. :func:`unsupported_reason`
says when a model is outside that set; :class:`~codea1_core.models.policy.Policy` then calls ``generate``.

Run: ``pytest tests/core/models/cpu_decode/test_engine.py
tests/core/models/cpu_decode/test_shared_decode.py``; throughput: ``python bench/rollout_bench.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from codea1_core.models.cpu_decode import exact, forward, shared
from codea1_core.models.cpu_decode.prefill import Sampled

SUPPORTED_MODEL_TYPES: frozenset[str] = frozenset({"qwen2"})
"""Model families whose HF forward accepts ``cache`` + a prepared mask dict, checked by the equality test."""


_ALLOWED_GENERATION_KEYS: frozenset[str] = frozenset(
    {"bos_token_id", "eos_token_id", "pad_token_id", "transformers_version", "_from_model_config"}
    | {
        "do_sample",
        "temperature",
        "top_p",
        "top_k",
        "repetition_penalty",
    }  # Policy passes all five explicitly
)
"""``generation_config`` keys that cannot add a logits processor or stopping rule to ``Policy``'s call."""


def _base_model(model: Any) -> Any:
    """The HF model under a PEFT wrapper (LoRA layers are injected into its modules, so they still apply)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def unsupported_reason(model: Any) -> str | None:
    """Why :func:`sample` cannot reproduce ``generate`` for ``model`` (None when it can)."""
    base = _base_model(model)
    config = getattr(base, "config", None)
    if config is None or getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return f"model type {getattr(config, 'model_type', None)!r} not in {sorted(SUPPORTED_MODEL_TYPES)}"
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager"):
        return f"attention implementation {config._attn_implementation!r} (sdpa/eager only)"
    if getattr(config, "use_sliding_window", False) or "sliding_attention" in (config.layer_types or []):
        return "sliding-window attention"
    device = next(base.parameters()).device
    if device.type != "cpu":  # HF's CUDA loop defers its stop checks; equality and speed unchecked there
        return f"device {device.type} (checked on the CPU only)"
    extra = set(base.generation_config.to_diff_dict()) - _ALLOWED_GENERATION_KEYS
    if extra:
        return f"generation_config sets {sorted(extra)} (could add processors)"
    return forward.unsupported_reason(base)


@torch.no_grad()
def sample(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    n: int = 1,
    max_new_tokens: int,
    eos_ids: Sequence[int],
    pad_id: int,
    do_sample: bool,
    warpers: Sequence[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = (),
    share_prompt: bool = False,
) -> Sampled:
    """Sample ``n`` completions per prompt as ``generate`` on the ``n``-times repeated batch does (see
    ``share_prompt``).

    Args:
        model: An HF causal LM (or PEFT wrapper) for which :func:`unsupported_reason` is None, in eval mode.
        input_ids: Left-padded prompt ids ``[prompts, prompt_len]`` on the model's device, each prompt once.
        attention_mask: Its 0/1 mask.
        n: Completions per prompt; row ``r`` of the result belongs to prompt ``r // n``.
        max_new_tokens: Sampling steps at most (``generate``'s ``max_new_tokens``, >= 1).
        eos_ids: Tokens that end a row.
        pad_id: Token written into finished rows.
        do_sample: Multinomial sampling (True) or greedy argmax (False).
        warpers: HF logits warpers applied in order after the raw log-probs are recorded.
        share_prompt: :func:`~codea1_core.models.cpu_decode.shared.sample_shared`: the same distribution from
            other random numbers, logits equal to float rounding (False, or ``n == 1``:
            :func:`~codea1_core.models.cpu_decode.exact.sample_exact`, bit for bit ``generate``, the same RNG
            state after).

    Returns:
        :class:`~codea1_core.models.cpu_decode.prefill.Sampled` on the CPU, with as many steps as ``generate``
        would have run.
    """
    if max_new_tokens < 1 or n < 1:
        raise ValueError(f"max_new_tokens and n: expected >= 1, got {max_new_tokens} and {n}")
    base = _base_model(model)
    if share_prompt and n > 1:
        return shared.sample_shared(
            base, input_ids, attention_mask, n, max_new_tokens, eos_ids, pad_id, do_sample, warpers
        )
    return exact.sample_exact(
        base, input_ids, attention_mask, n, max_new_tokens, eos_ids, pad_id, do_sample, warpers
    )
