"""HF ``generate`` for small Qwen2 decoders on the CPU, without its per-token overhead: exact, or shared-prompt.

What it does: :func:`sample` runs the sampling loop of ``transformers``' ``GenerationMixin._sample`` for the
settings :class:`codea1_core.models.policy.Policy` uses (temperature/top-k/top-p warpers, EOS + max-length
stopping, finished rows padded), in one of two modes (``rollout.share_prompt``):

* shared-prompt (the default, :func:`_sample_shared`): each prompt is prefilled once and its ``n`` samples
  attend over one copy of its keys/values (:class:`_SharedPromptCache`), tokens are drawn by inverse CDF
  from uniforms drawn up front, and prompts whose samples all stopped leave the batch. Same distribution
  as ``generate``, other random numbers, logits equal to float rounding (``tests/core/models/cpu_decode/test_shared_decode.py``).
  Every row's numbers are independent of the other rows in its batch (ghost rows up to a multiple of
  :data:`~codea1_core.models.cpu_decode.forward.BATCH_INVARIANT_ROWS`, and MKL's ``COMPATIBLE`` branch, which
  ``model.cpu_numerics: reproducible`` pins), so the prompts of a small model are decoded by one process per
  core (warm forked workers, :mod:`codea1_core.models.cpu_decode.workers`; :func:`_decode_split`) with the same
  tokens as in one process. In any other MKL mode (``native``) a batched GEMM may round with its batch count,
  so the decode stays in one process (:func:`~codea1_core.models.cpu_numerics.batch_invariant_gemm`);
* exact (``share_prompt=False``, or ``n == 1``): the same tokens and raw-logit log-probs as ``generate``, bit
  for bit, given the same torch RNG state. It differs only in bookkeeping that does not touch the numbers:

* the prefill is the model's own forward (HF masks and cache), then the keys/values move into one
  preallocated buffer per layer; each decode step writes one column in place and attends over a view of
  the filled prefix (HF's ``DynamicCache`` copies the whole cache with ``torch.cat`` every token);
* the decode-step attention mask is a view of one preallocated boolean mask (HF rebuilds it every token);
* the generated ids live in one preallocated buffer (no growing ``input_ids``);
* the draw is the same ``torch.multinomial(softmax(scores))`` over every row (finished rows included), so
  the RNG stream, and therefore every later token, is the one ``generate`` would have consumed; on the CPU
  when a core is left over by the intra-op threads, its Exp(1) noise is drawn one step ahead by a worker
  thread from a copy of the generator (:class:`_NoiseStream`), overlapping the next forward.

The decode step is :class:`codea1_core.models.cpu_decode.forward.DecodeStep`: HF's Qwen2 ops in HF's order on the
model's tensors (its rotary and attention functions called directly), without the forward's per-token
plumbing. ``tests/core/models/cpu_decode/test_engine.py`` compares its logits bitwise with HF's forward, and tokens and
log-probs for exact equality with ``generate``.

What it does not: run on GPUs (not checked there: HF ``generate`` or vLLM), beam search, assisted
decoding, repetition penalties or any other logits processor, sliding-window or linear-attention caches,
model families it was not checked on. :func:`unsupported_reason`
says when a model is outside that set; :class:`~codea1_core.models.policy.Policy` then calls ``generate``.

Run: ``pytest tests/core/models/cpu_decode/test_engine.py tests/core/models/cpu_decode/test_shared_decode.py``; throughput: ``python bench/rollout_bench.py``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from codea1_core.models import cpu_numerics
from codea1_core.models.cpu_decode import forward, workers

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class PromptState:
    """What the prefill leaves per prompt for the shared decode: its keys/values per layer and its padding bias.

    ``keys[l]`` is ``[prompts, kv_heads, head_dim, prompt_len]`` (stored transposed, so the score product is a
    plain GEMM), ``values[l]`` ``[prompts, kv_heads, prompt_len, head_dim]``, ``bias`` ``[prompts, 1, 1,
    prompt_len]`` (0, or -inf on left padding; None when nothing is padded).
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    bias: torch.Tensor | None

    @classmethod
    def from_prefill(cls, prefill_cache: Any, prompt_mask: torch.Tensor) -> PromptState:
        """The prompts' keys and values from HF's prefill cache, and their padding bias from ``prompt_mask``."""
        keys = [layer.keys.transpose(-1, -2).contiguous() for layer in prefill_cache.layers]
        values = [layer.values.contiguous() for layer in prefill_cache.layers]
        bias = None
        if not bool(prompt_mask.all()):
            zero = torch.zeros((), dtype=keys[0].dtype, device=prompt_mask.device)
            bias = torch.where(prompt_mask.bool(), zero, float("-inf"))[:, None, None, :]
        return cls(keys, values, bias)

    @property
    def count(self) -> int:
        """Number of prompts held."""
        return self.keys[0].shape[0]

    def select(self, prompts: torch.Tensor) -> PromptState:
        """These prompts only (indices, in order); ``self`` when that is all of them."""
        if prompts.numel() == self.count and bool(
            (prompts == torch.arange(self.count, device=prompts.device)).all()
        ):
            return self
        bias = None if self.bias is None else self.bias.index_select(0, prompts)
        return PromptState([k.index_select(0, prompts) for k in self.keys],
                           [v.index_select(0, prompts) for v in self.values], bias)  # fmt: skip


class _SharedPromptCache:
    """Each prompt's keys/values once, each row's generated keys/values apart; attention over both in one softmax.

    The ``n`` rows of a prompt attend over the same prompt keys: the prompt part of a decode step is one
    ``[n * heads_per_kv, head_dim] x [head_dim, prompt_len]`` product per (prompt, kv head) instead of ``n``
    matrix-vector products over ``n`` copies, so the prompt's keys/values are read once per step, not ``n``
    times (at the lab's test rollout they are most of the decode step's memory traffic). The scores of both
    parts go through one float32 softmax, as in HF's eager attention; the sums run in another order than one
    SDPA call per row does, so the logits agree with ``generate``'s to float rounding, not bitwise
    (``tests/core/models/cpu_decode/test_shared_decode.py``: every log-prob within 1e-5 of HF's forward).
    """

    def __init__(self, prompts: PromptState, n: int, max_new: int) -> None:
        self.n, self.prompt_len = n, prompts.keys[0].shape[-1]
        self.prompt_keys, self.prompt_values, self.prompt_bias = prompts.keys, prompts.values, prompts.bias
        count, kv_heads, head_dim, _ = self.prompt_keys[0].shape
        rows = count * n
        self.keys = [k.new_empty((rows, kv_heads, max_new, head_dim)) for k in self.prompt_keys]
        self.values = [v.new_empty((rows, kv_heads, max_new, head_dim)) for v in self.prompt_values]
        self.length = self.prompt_len

    def keep(self, prompts: torch.Tensor, rows: torch.Tensor) -> None:
        """Keep only these prompts (indices into the current ones) and their rows (``prompts[i] * n + j``)."""
        self.prompt_keys = [k.index_select(0, prompts) for k in self.prompt_keys]
        self.prompt_values = [v.index_select(0, prompts) for v in self.prompt_values]
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        if self.prompt_bias is not None:
            self.prompt_bias = self.prompt_bias.index_select(0, prompts)

    def attend(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               scaling: float) -> torch.Tensor:  # fmt: skip
        """Store this step's key/value column; attention output ``[rows, 1, heads, head_dim]`` (HF's layout).

        ``query`` is ``[rows, heads, 1, head_dim]``, ``key``/``value`` ``[rows, kv_heads, 1, head_dim]``; rows are
        prompt-major (row ``p * n + j`` is sample ``j`` of prompt ``p``), query head ``h`` reads kv head
        ``h // (heads // kv_heads)`` (HF's ``repeat_kv``). Scores are laid out ``[prompts, kv_heads, n * group,
        keys]`` so that the prompt part is one batched GEMM with no copy of the keys.
        """
        t = self.length - self.prompt_len  # generated columns already stored
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys[:, :, t : t + 1] = key
        values[:, :, t : t + 1] = value
        keys, values = keys[:, :, : t + 1], values[:, :, : t + 1]
        prompt_keys, prompt_values = self.prompt_keys[layer_idx], self.prompt_values[layer_idx]
        prompts, kv_heads, head_dim, prompt_len = prompt_keys.shape
        rows, heads = query.shape[0], query.shape[1]
        n, group = self.n, heads // kv_heads
        shared = (prompts, kv_heads, n * group, -1)  # [p, kv, (j, g), .] from rows' [(p, j), (kv, g), 1, .]
        per_row = (prompts, n, kv_heads, group, -1)
        q_shared = query.reshape(per_row).transpose(1, 2).reshape(shared)
        scores_prompt = torch.matmul(q_shared, prompt_keys).mul_(scaling)
        if self.prompt_bias is not None:
            scores_prompt.add_(self.prompt_bias)
        scores_new = torch.matmul(query.reshape(rows, kv_heads, group, head_dim), keys.transpose(-1, -2))
        scores_new = scores_new.mul_(scaling).reshape(per_row).transpose(1, 2).reshape(shared)
        scores = torch.cat([scores_prompt, scores_new], dim=-1)
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        out = torch.matmul(weights[..., :prompt_len], prompt_values)  # [p, kv, (j, g), head_dim]
        w_new = weights[..., prompt_len:].reshape(prompts, kv_heads, n, group, -1).transpose(1, 2)
        out_new = torch.matmul(w_new.reshape(rows, kv_heads, group, -1), values)  # [(p, j), kv, g, head_dim]
        out = out.reshape(prompts, kv_heads, n, group, head_dim).transpose(1, 2).reshape(out_new.shape)
        return out.add_(out_new).reshape(rows, 1, heads, head_dim)


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
    share_prompt: bool = False,
) -> Sampled:
    """Sample ``n`` completions per prompt as ``generate`` on the ``n``-times repeated batch does (see ``share_prompt``).

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
        share_prompt: :func:`_sample_shared`: the same distribution from other random numbers, logits equal to
            float rounding (False, or ``n == 1``: bit for bit ``generate``, the same RNG state after).

    Returns:
        :class:`Sampled` on the CPU, with as many steps as ``generate`` would have run.
    """
    if max_new_tokens < 1 or n < 1:
        raise ValueError(f"max_new_tokens and n: expected >= 1, got {max_new_tokens} and {n}")
    base = _base_model(model)
    device = input_ids.device
    prompt_len = input_ids.shape[1]
    if share_prompt and n > 1:
        return _sample_shared(base, input_ids, attention_mask, n, max_new_tokens, eos_ids, pad_id, do_sample,
                              warpers)  # fmt: skip
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


SMALL_MODEL_HIDDEN = 256
"""Hidden size up to which :func:`_sample_shared` decodes on one intra-op thread (the prefill keeps the caller's
count): at such widths a decode step is ~100 sub-millisecond ops. Measured on the lab's test rollout (one
decode, 2 cores): 1 thread 1.27-1.31 s wall for 1.3 s of CPU, 2 threads 1.09-1.10 s for 2.2 s — ~15 % faster for
twice the CPU; one thread also keeps the decode's rounding independent of ``model.cpu_threads``. The core left
idle goes to a second decode process instead (:func:`_decode_split`)."""

SPLIT_MIN_TOKENS = 2048
"""Rows x new tokens (at most) each decode process must have. Handing a part over costs a few ms and every
process repeats each step's ~2 ms of fixed overhead, while rows often stop long before ``max_new_tokens``: the
lab's code rollout (32 x 96, ~22 tokens per row after the warm start) measured slower split than in one
process at 2 threads, its test rollout (128 x 128) 1.2-1.3x faster. A rollout below twice this stays in one."""

SPLIT_ENV = "CODEA1_DECODE_PROCESSES"
"""Environment variable: the most processes one shared decode may use (``1``: one; default: one per core this
process may run on, see :func:`_split_processes`). The tokens and log-probs are the same for every count
(``tests/core/models/cpu_decode/test_shared_decode.py``)."""

SPLIT_GRACE_S = 30.0
"""How long the caller waits for a worker's part beyond the time its own part took; then the worker is killed
and the caller decodes that part itself (a worker that hangs or dies costs time, never a result)."""


@dataclass
class _Decode:
    """Everything one shared decode needs after the prefill; :meth:`run` decodes a subset of its prompts.

    ``tokens`` / ``logprobs`` hold every row of the call (prompt-major); a run writes only its own rows, so
    runs on disjoint prompts — here, or in a worker process whose rows are copied in — fill them together.
    """

    base: Any
    prompts: PromptState
    logits: torch.Tensor  # [rows, vocab] float32: the prefill's last logits, each prompt's repeated n times
    position: torch.Tensor  # [rows, 1]
    uniforms: torch.Tensor  # [rows, max_new_tokens]
    tokens: torch.Tensor  # [rows, max_new_tokens] long, pad-filled
    logprobs: torch.Tensor  # [rows, max_new_tokens] float32, zero-filled
    n: int
    eos: list[int]
    pad_id: int
    do_sample: bool
    warpers: Sequence[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]

    def rows(self, prompts: torch.Tensor) -> torch.Tensor:
        """The row indices of ``prompts`` (row ``p * n + j`` is sample ``j`` of prompt ``p``)."""
        return (prompts[:, None] * self.n + torch.arange(self.n, device=prompts.device)).reshape(-1)

    def run(self, prompts: torch.Tensor) -> int:
        """Decode the rows of ``prompts`` (ascending indices); returns the steps they ran (their longest row).

        Each row's numbers do not depend on which other rows share its batch (``tests/core/models/cpu_decode/test_shared_decode.py``
        checks split against whole bitwise), so any partition of the prompts gives the same result.
        """
        n, device = self.n, self.logits.device
        live = self.rows(prompts)  # rows in the batch
        max_new_tokens = self.tokens.shape[1]
        cache = _SharedPromptCache(self.prompts.select(prompts), n, max_new_tokens - 1)
        logits, position = self.logits[live], self.position[live]
        prompt_len = cache.prompt_len
        eos = torch.tensor(self.eos, device=device)
        unfinished = torch.ones(live.numel(), dtype=torch.bool, device=device)
        step = forward.DecodeStep(self.base, cache, None, min_rows=forward.BATCH_INVARIANT_ROWS)
        steps = 0
        for t in range(max_new_tokens):
            scores = logits
            for warp in self.warpers:
                scores = warp(self.tokens[live, :t], scores)
            if self.do_sample:
                nxt = _inverse_cdf(scores, self.uniforms[live, t])
            else:
                nxt = torch.argmax(scores, dim=-1)
            nxt = torch.where(unfinished, nxt, self.pad_id)  # generate's pad of done rows
            self.tokens[live, t] = nxt
            logprob = logits.gather(1, nxt[:, None]).squeeze(1) - torch.logsumexp(logits, dim=-1)
            # 0 after a row's stop (unused by Policy): the same whichever rows shared the batch
            self.logprobs[live, t] = torch.where(unfinished, logprob, 0.0)
            steps = t + 1
            unfinished = unfinished & ~torch.isin(nxt, eos)
            if steps == max_new_tokens or not bool(unfinished.any()):
                break
            groups = unfinished.view(-1, n).any(dim=1)
            done = int(groups.numel() - groups.sum())
            if done and done * 8 >= groups.numel():  # drop finished prompts once they are 1/8 of the batch
                keep = groups.nonzero().squeeze(1)
                row_keep = (keep[:, None] * n + torch.arange(n, device=device)).reshape(-1)
                cache.keep(keep, row_keep)
                live, unfinished = live[row_keep], unfinished[row_keep]
                position, nxt = position[row_keep], nxt[row_keep]
            cache.length = prompt_len + t
            position = position + 1
            logits = step(nxt, position)
        return steps

    def part(self, prompts: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """What a worker needs to decode ``prompts``: tensors (copied into its shared memory) and settings."""
        live, state = self.rows(prompts), self.prompts.select(prompts)
        tensors = {
            "logits": self.logits[live],
            "position": self.position[live],
            "uniforms": self.uniforms[live],
        }
        for layer, (keys, values) in enumerate(zip(state.keys, state.values, strict=True)):
            tensors[f"keys.{layer}"], tensors[f"values.{layer}"] = keys, values
        if state.bias is not None:
            tensors["bias"] = state.bias
        meta = {"layers": len(state.keys), "n": self.n, "eos": list(self.eos), "pad_id": self.pad_id,
                "do_sample": self.do_sample, "warpers": list(self.warpers), "max_new": self.tokens.shape[1]}  # fmt: skip
        return tensors, meta


def _worker_job(base: Any, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> tuple[dict, int]:
    """A decode worker's job (:mod:`codea1_core.models.cpu_decode.workers`): :meth:`_Decode.run` over all its prompts."""
    layers = range(meta["layers"])
    state = PromptState([tensors[f"keys.{i}"] for i in layers], [tensors[f"values.{i}"] for i in layers],
                        tensors.get("bias"))  # fmt: skip
    rows, max_new = tensors["logits"].shape[0], meta["max_new"]
    decode = _Decode(
        base=base,
        prompts=state,
        logits=tensors["logits"],
        position=tensors["position"],
        uniforms=tensors["uniforms"],
        tokens=torch.full((rows, max_new), meta["pad_id"], dtype=torch.long),
        logprobs=torch.zeros((rows, max_new), dtype=torch.float32),
        n=meta["n"],
        eos=meta["eos"],
        pad_id=meta["pad_id"],
        do_sample=meta["do_sample"],
        warpers=meta["warpers"],
    )
    steps = decode.run(torch.arange(state.count))
    return {"tokens": decode.tokens[:, :steps], "logprobs": decode.logprobs[:, :steps]}, steps


def _sample_shared(
    base: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    n: int,
    max_new_tokens: int,
    eos_ids: Sequence[int],
    pad_id: int,
    do_sample: bool,
    warpers: Sequence[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]],
    processes: int | None = None,
) -> Sampled:
    """:func:`sample` with ``share_prompt``: the same distribution, one prefill and one key/value copy per prompt.

    What differs from ``generate``, beyond float rounding (attention sums in another order):

    * random numbers: each row's token at step ``t`` is the inverse CDF of ``softmax(scores)`` at one uniform
      ``u[row, t]``, all drawn up front from the default generator (``rows x max_new_tokens`` of them, so it
      ends in the same place whatever stops early). ``generate`` draws a ``[rows, vocab]`` exponential block
      per step (6 ms on one core at the lab's test rollout, more than the forward); the same seed therefore
      gives other tokens than ``generate``'s, from the same distribution (``tests/core/models/cpu_decode/test_shared_decode.py``);
    * work skipped: once all ``n`` rows of a prompt have stopped, its rows leave the batch (their tokens are
      pad from then on, as ``generate`` writes them; their log-probs 0, unused by ``Policy``);
    * small models (:data:`SMALL_MODEL_HIDDEN`) decode on one intra-op thread per process, in as many processes
      as there are cores (:func:`_decode_split`; ``processes``: None = :func:`_split_processes`): the same
      tokens and log-probs for every count, bit for bit — in MKL's ``COMPATIBLE`` branch only; in any other
      MKL mode one process (:func:`~codea1_core.models.cpu_numerics.batch_invariant_gemm`).
    """
    device = input_ids.device
    prompts, _ = input_ids.shape
    rows = prompts * n
    uniforms = torch.rand((rows, max_new_tokens), device=device)
    logits, prefill_cache, position = _prefill(base, input_ids, attention_mask)
    state = PromptState.from_prefill(prefill_cache, attention_mask)
    del prefill_cache
    threads = torch.get_num_threads()
    single = device.type == "cpu" and base.config.hidden_size <= SMALL_MODEL_HIDDEN and threads > 1
    if processes is None:
        processes = _split_processes(base, device, prompts, rows * max_new_tokens)
    processes = max(1, min(processes, prompts))
    if processes > 1 and not cpu_numerics.batch_invariant_gemm():
        processes = 1  # outside MKL's COMPATIBLE branch a row's GEMM may round with its batch: no split
    decode = _Decode(
        base=base,
        prompts=state,
        logits=logits.repeat_interleave(n, 0),
        position=position.repeat_interleave(n, 0),
        uniforms=uniforms,
        tokens=torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device),
        logprobs=torch.zeros((rows, max_new_tokens), dtype=torch.float32, device=device),
        n=n,
        eos=[int(e) for e in eos_ids],
        pad_id=pad_id,
        do_sample=do_sample,
        warpers=warpers,
    )
    if single:
        torch.set_num_threads(1)
    try:
        steps = _decode_split(decode, processes)
    finally:
        if single:
            torch.set_num_threads(threads)
    return Sampled(decode.tokens[:, :steps].cpu(), decode.logprobs[:, :steps].cpu())


def _split_processes(base: Any, device: torch.device, prompts: int, work: int) -> int:
    """How many processes decode one shared rollout: one per core, where the decode runs on one thread.

    Only plain small models (:data:`SMALL_MODEL_HIDDEN`, decoded on one thread; no PEFT layers, whose switches
    a worker's copy would not follow) on a Linux CPU; at most the cores this process may run on, the prompts,
    ``work`` (rows x new tokens) / :data:`SPLIT_MIN_TOKENS`, and :data:`SPLIT_ENV` when set.
    """
    if not hasattr(os, "fork") or sys.platform != "linux":
        return 1
    if device.type != "cpu" or base.config.hidden_size > SMALL_MODEL_HIDDEN:
        return 1
    if any(type(module).__module__.startswith("peft.") for module in base.modules()):
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    limit = os.environ.get(SPLIT_ENV, "").strip()
    if limit:
        try:
            cores = min(cores, max(1, int(limit)))
        except ValueError:
            log.warning("%s=%r is not a whole number: ignored", SPLIT_ENV, limit)
    return max(1, min(cores, prompts, work // SPLIT_MIN_TOKENS))


def _decode_split(decode: _Decode, processes: int) -> int:
    """Decode every prompt over ``processes`` processes, round robin: part 0 here, the others in warm workers.

    The workers (:mod:`codea1_core.models.cpu_decode.workers`, one pool per model, forked once) get their part's
    prefill state and the model's current weights through shared memory and return their rows, which are
    copied in. A worker that is busy with another thread's decode, fails, dies or hangs past
    :data:`SPLIT_GRACE_S` costs time only: its part is decoded here. Returns the steps of the longest row.
    """
    everything = torch.arange(decode.prompts.count)
    pool = workers.pool_for(decode.base, processes - 1, _worker_job) if processes > 1 else None
    if pool is None:
        return decode.run(everything)
    parts = [everything[i::processes] for i in range(processes)]
    with pool.claim() as mine:
        if not mine:
            return decode.run(everything)
        max_new = decode.tokens.shape[1]
        sent = []
        try:
            for index, part in enumerate(parts[1:]):
                tensors, meta = decode.part(part)
                out_bytes = part.numel() * decode.n * max_new * 12  # long tokens + float32 log-probs
                sent.append(pool.submit(index, tensors, meta, out_bytes))
            start = time.monotonic()
            steps = decode.run(parts[0])
        except BaseException:  # e.g. Ctrl-C: no worker may keep an answer nobody will read
            pool.abandon()
            raise
        deadline = time.monotonic() + (time.monotonic() - start) + SPLIT_GRACE_S
        for index, (part, ok) in enumerate(zip(parts[1:], sent, strict=True)):
            got = pool.result(index, deadline - time.monotonic()) if ok else None
            if got is None:
                steps = max(steps, decode.run(part))
                continue
            outputs, part_steps = got
            rows = decode.rows(part)
            decode.tokens[rows, :part_steps] = outputs["tokens"]
            decode.logprobs[rows, :part_steps] = outputs["logprobs"]
            steps = max(steps, part_steps)
    return steps


def _inverse_cdf(scores: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row from ``softmax(scores)`` at the row's uniform in [0, 1): the first index whose CDF exceeds it."""
    cdf = torch.softmax(scores, dim=-1, dtype=torch.float32).cumsum_(dim=-1)
    total = cdf[:, -1:]
    if not bool(((total > 0) & (total < float("inf"))).all()):  # what multinomial refuses (nan/inf logits)
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    chosen = torch.searchsorted(cdf, uniforms[:, None] * total, right=True).squeeze(1)
    return chosen.clamp_(max=scores.shape[1] - 1)
