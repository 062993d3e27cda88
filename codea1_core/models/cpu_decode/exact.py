"""The exact CPU decoder: ``generate``'s tokens and raw-logit log-probs, bit for bit, given the same RNG state.

What it does: :func:`sample_exact` (``rollout.share_prompt: false``, or ``n == 1``) decodes the ``n``-times
repeated batch as ``generate`` does. It differs only in bookkeeping that does not touch the numbers:

* the prefill is the model's own forward (HF masks and cache), then the keys/values move into one
  preallocated buffer per layer; each decode step writes one column in place and attends over a view of
  the filled prefix (HF's ``DynamicCache`` copies the whole cache with ``torch.cat`` every token);
* the decode-step attention mask is a view of one preallocated boolean mask (HF rebuilds it every token);
* the generated ids live in one preallocated buffer (no growing ``input_ids``);
* the draw is the same ``torch.multinomial(softmax(scores))`` over every row (finished rows included), so
  the RNG stream, and therefore every later token, is the one ``generate`` would have consumed; on the CPU
  when a core is left over by the intra-op threads, its Exp(1) noise is drawn one step ahead by a worker
  thread from a copy of the generator (:class:`_NoiseStream`), overlapping the next forward.

What it does not: check that the model is supported, or pick the mode
(:func:`codea1_core.models.cpu_decode.engine.sample` does both). Run:
``pytest tests/core/models/cpu_decode/test_engine.py`` (tokens, log-probs and RNG state equal to ``generate``'s).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from codea1_core.models.cpu_decode import forward
from codea1_core.models.cpu_decode.prefill import Sampled, prefill


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

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's key/value column and return the filled prefix (length + 1)."""
        end = self.length + key_states.shape[2]
        self.keys[layer_idx][:, :, self.length : end] = key_states
        self.values[layer_idx][:, :, self.length : end] = value_states
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]


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


def sample_exact(
    base: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    n: int,
    max_new_tokens: int,
    eos_ids: Sequence[int],
    pad_id: int,
    do_sample: bool,
    warpers: Sequence[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]],
) -> Sampled:
    """:func:`~codea1_core.models.cpu_decode.engine.sample` without ``share_prompt``: ``generate`` bit for bit.

    ``base`` is the HF model under any PEFT wrapper; the other arguments are ``sample``'s. Leaves the default
    generator where ``generate`` leaves it.
    """
    device = input_ids.device
    prompt_len = input_ids.shape[1]
    input_ids, attention_mask = input_ids.repeat_interleave(n, 0), attention_mask.repeat_interleave(n, 0)
    logits, prefill_cache, position = prefill(base, input_ids, attention_mask)
    rows = logits.shape[0]
    cache = _ViewCache(prefill_cache, prompt_len + max_new_tokens - 1)
    del prefill_cache
    mask = _decode_mask(attention_mask, prompt_len + max_new_tokens - 1)
    eos = torch.tensor(list(eos_ids), device=device)
    tokens = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((rows, max_new_tokens), dtype=torch.float32, device=device)
    unfinished = torch.ones(rows, dtype=torch.bool, device=device)
    step = forward.DecodeStep(base, cache, mask)
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
