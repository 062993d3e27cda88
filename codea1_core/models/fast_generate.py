"""Token-for-token ``generate`` for small HF decoders, without the per-token cache and mask overhead.

What it does: :func:`sample` runs the same sampling loop as ``transformers``' ``GenerationMixin._sample`` for
the settings :class:`codea1_core.models.policy.Policy` uses (temperature/top-k/top-p warpers, EOS + max-length
stopping, finished rows padded) and returns the same tokens and raw-logit log-probs, bit for bit, given
the same torch RNG state. It differs only in bookkeeping that does not touch the numbers:

* the prefill is the model's own forward (HF masks and cache), then the keys/values move into one
  preallocated buffer per layer; each decode step writes one column in place and attends over a view of
  the filled prefix (HF's ``DynamicCache`` copies the whole cache with ``torch.cat`` every token);
* the decode-step attention mask is a view of one preallocated boolean mask (HF rebuilds it every token);
* the generated ids live in one preallocated buffer (no growing ``input_ids``);
* the draw is the same ``torch.multinomial(softmax(scores))`` over every row (finished rows included), so
  the RNG stream, and therefore every later token, is the one ``generate`` would have consumed; on the CPU
  when a core is left over by the intra-op threads, its Exp(1) noise is drawn one step ahead by a worker
  thread from a copy of the generator (:class:`_NoiseStream`), overlapping the next forward.

The decode step is :class:`codea1_core.models.decode_step.DecodeStep`: HF's Qwen2 ops in HF's order on the
model's tensors (its rotary and attention functions called directly), without the forward's per-token
plumbing. ``tests/test_fast_generate.py`` compares its logits bitwise with HF's forward, and tokens and
log-probs for exact equality with ``generate``.

What it does not: run on GPUs (not checked there: HF ``generate`` or vLLM), beam search, assisted
decoding, repetition penalties or any other logits processor, sliding-window or linear-attention caches,
model families it was not checked on. :func:`unsupported_reason`
says when a model is outside that set; :class:`~codea1_core.models.policy.Policy` then calls ``generate``.

Run: ``pytest tests/test_fast_generate.py``; throughput: ``python bench/rollout_bench.py``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from codea1_core.models import decode_step

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


@dataclass(frozen=True)
class Sampled:
    """New tokens ``[rows, steps]`` (pad after a row's stop, as ``generate`` returns them) and their log-probs.

    ``logprobs[r, t]`` is log-softmax of the raw logits at step t, taken at ``tokens[r, t]``.
    """

    tokens: torch.Tensor
    logprobs: torch.Tensor


class _ViewCache:
    """Per-layer key/value buffers preallocated for prompt + new tokens; ``update`` writes one column.

    Duck-types the one method HF attention calls on a cache (``update``) and returns views of the filled
    prefix, so attention sees tensors of exactly the shape and values ``DynamicCache`` would return.
    """

    def __init__(self, prefill_cache: Any, total_len: int) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        for layer in prefill_cache.layers:
            k, v = layer.keys, layer.values
            kb = k.new_empty((*k.shape[:2], total_len, k.shape[3]))
            vb = v.new_empty((*v.shape[:2], total_len, v.shape[3]))
            kb[:, :, : k.shape[2]] = k
            vb[:, :, : v.shape[2]] = v
            self.keys.append(kb)
            self.values.append(vb)
        self.length = prefill_cache.layers[0].keys.shape[2]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Store this step's key/value column and return the filled prefix (length + 1)."""
        end = self.length + key_states.shape[2]
        self.keys[layer_idx][:, :, self.length : end] = key_states
        self.values[layer_idx][:, :, self.length : end] = value_states
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]


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
    return decode_step.unsupported_reason(base)


def _decode_mask(attention_mask: torch.Tensor, total_len: int) -> torch.Tensor | None:
    """Boolean ``[rows, 1, 1, total_len]`` key mask for decode steps, or None without padding.

    HF's SDPA mask for one query token is the padding mask (causality is trivially satisfied), and it is
    skipped entirely when nothing is padded; generated tokens are never masked (``generate`` appends ones).
    """
    if bool(attention_mask.all()):
        return None
    mask = attention_mask.new_ones((attention_mask.shape[0], 1, 1, total_len), dtype=torch.bool)
    mask[:, 0, 0, : attention_mask.shape[1]] = attention_mask.bool()
    return mask


class _NoiseStream:
    """The Exp(1) noise ``torch.multinomial(probs, 1)`` draws, one ``[rows, vocab]`` block per step, drawn ahead.

    On the CPU, ``multinomial`` with one sample is ``argmax(probs / q)`` with ``q = exponential_(1)`` drawn from
    the default generator (serially, a few ms per step at 128 x 1.5k). Drawing the same blocks from a copy of
    the generator in a worker thread, one step ahead, overlaps that with the next forward; the division and
    argmax stay on the caller's thread, so the token is the one ``multinomial`` returns, bit for bit.
    ``close`` leaves the default generator where ``multinomial`` would have left it after the consumed steps.
    """

    def __init__(self, shape: tuple[int, int], dtype: torch.dtype) -> None:
        self.shape, self.dtype = shape, dtype
        self.generator = torch.Generator()
        self.generator.set_state(torch.get_rng_state())
        self.state_after: torch.Tensor | None = None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="codea1-noise")
        self.pending: Future = self.pool.submit(self._draw)

    def _draw(self) -> tuple[torch.Tensor, torch.Tensor]:
        noise = torch.empty(self.shape, dtype=self.dtype).exponential_(1, generator=self.generator)
        return noise, self.generator.get_state()

    def next(self) -> torch.Tensor:
        """This step's noise block; the next one starts drawing at once."""
        noise, self.state_after = self.pending.result()
        self.pending = self.pool.submit(self._draw)
        return noise

    def close(self) -> None:
        """Stop the worker and advance the default generator past the consumed blocks only."""
        self.pending.cancel()
        self.pool.shutdown(wait=True)
        if self.state_after is not None:
            torch.set_rng_state(self.state_after)


def _spare_core(device: torch.device) -> bool:
    """True when a CPU decode leaves a core idle for the noise worker (more cores than intra-op threads).

    The intra-op thread count is never changed to make room: a GEMM's rounding can depend on it, and the
    tokens must stay the ones ``generate`` samples with the caller's setting.
    """
    if device.type != "cpu":
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores > torch.get_num_threads()


def _draw(scores: torch.Tensor, noise: _NoiseStream | None, do_sample: bool) -> torch.Tensor:
    """``generate``'s token choice: multinomial over softmax(scores), or argmax when not sampling."""
    if not do_sample:
        return torch.argmax(scores, dim=-1)
    probs = torch.nn.functional.softmax(scores, dim=-1)
    if noise is None:
        return torch.multinomial(probs, num_samples=1).squeeze(1)
    if not bool((probs.max() < float("inf")) & (probs.min() >= 0)):  # multinomial's own input check
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    return torch.argmax(probs / noise.next(), dim=-1)


def _prefill(base: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple:
    """``generate``'s prefill: the model's forward with its positions and last-position logits only.

    Every row is prefilled, the ``n`` copies of a prompt included: prefilling a prompt once and repeating
    its keys/values is NOT bit-identical (a GEMM's rounding can depend on a row's place in the batch).
    Returns (float32 logits ``[rows, vocab]``, HF cache, last positions ``[rows, 1]``).
    """
    # generate's positions count real tokens only (left padding at 0)
    positions = attention_mask.long().cumsum(-1) - 1
    positions = positions.masked_fill(attention_mask == 0, 0)
    out = base(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=True,
               logits_to_keep=1, return_dict=True)  # fmt: skip
    return out.logits[:, -1].to(copy=True, dtype=torch.float32), out.cache, positions[:, -1:]


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
) -> Sampled:
    """Sample ``n`` completions per prompt exactly as ``generate`` on the ``n``-times repeated batch does.

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

    Returns:
        :class:`Sampled` on the CPU, with as many steps as ``generate`` would have run.
    """
    if max_new_tokens < 1 or n < 1:
        raise ValueError(f"max_new_tokens and n: expected >= 1, got {max_new_tokens} and {n}")
    base = _base_model(model)
    device = input_ids.device
    prompt_len = input_ids.shape[1]
    input_ids, attention_mask = input_ids.repeat_interleave(n, 0), attention_mask.repeat_interleave(n, 0)
    logits, prefill_cache, position = _prefill(base, input_ids, attention_mask)
    rows = logits.shape[0]
    cache = _ViewCache(prefill_cache, prompt_len + max_new_tokens - 1)
    del prefill_cache
    mask = _decode_mask(attention_mask, prompt_len + max_new_tokens - 1)
    eos = torch.tensor(list(eos_ids), device=device)
    tokens = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((rows, max_new_tokens), dtype=torch.float32, device=device)
    unfinished = torch.ones(rows, dtype=torch.bool, device=device)
    step = decode_step.DecodeStep(base, cache, mask)
    noise = _NoiseStream(tuple(logits.shape), logits.dtype) if do_sample and _spare_core(device) else None
    steps = 0
    try:
        for t in range(max_new_tokens):
            step_logprobs = torch.log_softmax(logits, dim=-1)  # the raw-logit log-probs Policy records
            scores = logits
            for warp in warpers:
                scores = warp(tokens[:, :t], scores)
            nxt = torch.where(
                unfinished, _draw(scores, noise, do_sample), pad_id
            )  # generate's pad of done rows
            tokens[:, t] = nxt
            logprobs[:, t] = step_logprobs.gather(1, nxt[:, None]).squeeze(1)
            steps = t + 1
            unfinished = unfinished & ~torch.isin(nxt, eos)
            if steps == max_new_tokens or not bool(unfinished.any()):
                break
            cache.length = prompt_len + t
            position = position + 1
            logits = step(nxt, position)
    finally:
        if noise is not None:
            noise.close()
    return Sampled(tokens[:, :steps].cpu(), logprobs[:, :steps].cpu())
