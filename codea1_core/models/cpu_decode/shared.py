"""The shared-prompt CPU decoder: one prefill and one key/value copy per prompt, ``generate``'s distribution.

What it does: :func:`sample_shared` (``rollout.share_prompt``, the default): each prompt is prefilled once and
its ``n`` samples attend over one copy of its keys/values (:class:`_SharedPromptCache`), tokens are drawn by
inverse CDF from uniforms drawn up front, and prompts whose samples all stopped leave the batch. Same
distribution as ``generate``, other random numbers, logits equal to float rounding
(``tests/core/models/cpu_decode/test_shared_decode.py``). Every row's numbers are independent of the other rows
in its batch (ghost rows up to a multiple of :data:`~codea1_core.models.cpu_decode.forward.BATCH_INVARIANT_ROWS`,
and MKL's ``COMPATIBLE`` branch, which ``model.cpu_numerics: reproducible`` pins), so the prompts of a small
model are decoded by one process per core (warm forked workers, :mod:`codea1_core.models.cpu_decode.workers`;
:func:`_decode_split`) with the same tokens as in one process. In any other MKL mode (``native``) a batched
GEMM may round with its batch count, so the decode stays in one process
(:func:`~codea1_core.models.cpu_numerics.batch_invariant_gemm`).

What it does not: check that the model is supported, or pick the mode
(:func:`codea1_core.models.cpu_decode.engine.sample` does both). Run:
``pytest tests/core/models/cpu_decode/test_shared_decode.py``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from codea1_core.models import cpu_numerics
from codea1_core.models.cpu_decode import forward, workers
from codea1_core.models.cpu_decode.prefill import Sampled, prefill

log = logging.getLogger(__name__)


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
        return PromptState(
            [k.index_select(0, prompts) for k in self.keys],
            [v.index_select(0, prompts) for v in self.values],
            bias,
        )


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

    def attend(
        self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float
    ) -> torch.Tensor:
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


SMALL_MODEL_HIDDEN = 256
"""Hidden size up to which :func:`sample_shared` decodes on one intra-op thread (the prefill keeps the caller's
count): at such widths a decode step is ~100 sub-millisecond ops, and a second thread buys little wall time
for twice the CPU (``bench/rollout_bench.py --threads 1,2``); one thread also keeps the decode's rounding
independent of ``model.cpu_threads``. The core left idle goes to a second decode process instead
(:func:`_decode_split`)."""


SPLIT_MIN_TOKENS = 2048
"""Rows x new tokens (at most) each decode process must have. Handing a part over costs time and every
process repeats each step's fixed overhead, while rows often stop long before ``max_new_tokens``: the lab's
code rollout (32 x 96, a few dozen tokens per row after the warm start) runs slower split than in one process
at 2 threads, its test rollout (128 x 128) faster. A rollout below twice this stays in one."""


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

        Each row's numbers do not depend on which other rows share its batch
        (``tests/core/models/cpu_decode/test_shared_decode.py``
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
        meta = {
            "layers": len(state.keys),
            "n": self.n,
            "eos": list(self.eos),
            "pad_id": self.pad_id,
            "do_sample": self.do_sample,
            "warpers": list(self.warpers),
            "max_new": self.tokens.shape[1],
        }
        return tensors, meta


def _worker_job(base: Any, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> tuple[dict, int]:
    """A decode worker's job (:mod:`codea1_core.models.cpu_decode.workers`): :meth:`_Decode.run` over all its
    prompts."""
    layers = range(meta["layers"])
    state = PromptState(
        [tensors[f"keys.{i}"] for i in layers], [tensors[f"values.{i}"] for i in layers], tensors.get("bias")
    )
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


def sample_shared(
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
    """:func:`~codea1_core.models.cpu_decode.engine.sample` with ``share_prompt``: the same distribution, one
    prefill and one key/value copy per prompt.

    What differs from ``generate``, beyond float rounding (attention sums in another order):

    * random numbers: each row's token at step ``t`` is the inverse CDF of ``softmax(scores)`` at one uniform
      ``u[row, t]``, all drawn up front from the default generator (``rows x max_new_tokens`` of them, so it
      ends in the same place whatever stops early). ``generate`` draws a ``[rows, vocab]`` exponential block
      per step (at the lab's test rollout, more time than the forward); the same seed therefore
      gives other tokens than ``generate``'s, from the same distribution
      (``tests/core/models/cpu_decode/test_shared_decode.py``);
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
    logits, prefill_cache, position = prefill(base, input_ids, attention_mask)
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
    """One token per row from ``softmax(scores)`` at the row's uniform in [0, 1): the first index whose CDF
    exceeds it."""
    cdf = torch.softmax(scores, dim=-1, dtype=torch.float32).cumsum_(dim=-1)
    total = cdf[:, -1:]
    if not bool(((total > 0) & (total < float("inf"))).all()):  # what multinomial refuses (nan/inf logits)
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    chosen = torch.searchsorted(cdf, uniforms[:, None] * total, right=True).squeeze(1)
    return chosen.clamp_(max=scores.shape[1] - 1)
