"""One trainable policy (role ``code`` or ``test``): batched sampling and the lockstep GRPO step on HF models.

What it does: loads an HF causal LM + tokenizer, wraps it in a LoRA adapter (``model.finetune == "lora"``;
the reference policy is the same model with the adapter disabled, docs/method.md D8) or keeps a frozen
reference copy (``full``); samples completions in left-padded batches (:meth:`Policy.generate`: through
:mod:`codea1_core.models.cpu_decode.engine` where that reproduces HF ``generate`` token for token, else
``generate``); runs one
GRPO training step (:meth:`Policy.step`, docs/method.md §3 steps 13-15 and §10) with its own AdamW optimizer
and warm-up + cosine schedule; saves/loads resumable checkpoints and exports merged HF model directories.
Two ``Policy`` objects (code and test) live in one process and never share parameters or optimizers.

What it does not: compute rewards or advantages (``grpo.py``/``rewards.py``), nor run vLLM (``vllm_engine.py``).

Log-probs returned by :meth:`Policy.generate` are under the policy's *raw* logits (temperature 1, no top-p/k),
i.e. the quantity the GRPO ratio uses; the step recomputes old log-probs anyway (§3 step 13).

Run: ``pytest tests/core/models/test_policy.py``.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from codea1_core.config import Config, ConfigError
from codea1_core.models import policy_io
from codea1_core.models.sampling import SamplingParams

log = logging.getLogger(__name__)

LOGPROB_BLOCK_TOKENS = 1024
"""Completion tokens per LM-head block in the update: a block's float32 logits are its only vocab-sized tensor."""


class PromptTooLongError(ConfigError):
    """A prompt over its token limit: an error, never truncated (docs/method.md §3 step 5)."""


def check_prompt_lengths(lengths: list[int], limit: int, what: str) -> None:
    """Raise :class:`PromptTooLongError` naming the first over-long prompt when ``limit`` > 0."""
    over = [(i, n) for i, n in enumerate(lengths) if limit > 0 and n > limit]
    if over:
        i, n = over[0]
        raise PromptTooLongError(
            f"{what}: prompt {i} has {n} tokens > limit {limit} ({len(over)} of {len(lengths)} over); "
            "over-long prompts are not truncated (docs/method.md §3)"
        )


def prompt_lengths(tokenizer: Any, prompts: list[list[dict]], use_chat_template: bool) -> list[int]:
    """Token count of each rendered chat prompt, exactly as :meth:`Policy.generate` encodes it."""
    plain = not uses_chat_template(tokenizer, use_chat_template)
    texts = [render_messages(tokenizer, p, use_chat_template) for p in prompts]
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=plain)["input_ids"]] if texts else []


@dataclass(frozen=True)
class Completion:
    """One sampled response: ``token_ids`` include the EOS token if one was produced.

    ``logprobs[i]`` is log pi(token_ids[i]) under the raw (temperature-1) logits of the sampling policy;
    ``finish_reason`` is ``stop`` (EOS produced) or ``length`` (``max_new_tokens`` reached).
    """

    text: str
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


@dataclass
class TrainBatch:
    """One role's GRPO training batch: sample i is ``prompt_ids[i] + completion_ids[i]`` with ``advantages[i]``."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    advantages: list[float]
    old_logprobs: list[list[float]] | None = None
    in_zero_variance_group: list[bool] | None = None
    """Per sample: its GRPO group had zero variance (D9). None: fall back to advantage == 0."""


class _RawLogprobRecorder:
    """Logits processor placed before the sampling warpers: records log pi(chosen token) under raw logits.

    At call t it sees the token chosen at t-1 as ``input_ids[:, -1]`` and keeps only one ``[batch, vocab]``
    log-softmax, so memory does not grow with the response length (``output_logits`` would keep them all).
    """

    def __init__(self) -> None:
        self.prev: torch.Tensor | None = None
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.take(input_ids[:, -1])
        self.prev = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def take(self, tokens: torch.Tensor) -> None:
        if self.prev is not None:
            self.logprobs.append(self.prev.gather(1, tokens[:, None].to(self.prev.device)).squeeze(1).cpu())
            self.prev = None


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def uses_chat_template(tokenizer: Any, use_chat_template: bool) -> bool:
    """True when prompts go through the tokenizer's chat template (it has one and the config allows it)."""
    return bool(use_chat_template and getattr(tokenizer, "chat_template", None))


def render_messages(tokenizer: Any, messages: list[dict], use_chat_template: bool) -> str:
    """Chat messages -> prompt text (chat template + generation prompt, else ``prompts.render_plain``)."""
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("content"), str) or "role" not in msg:
            raise ValueError(f"prompt message {i}: expected {{'role': str, 'content': str}}, got {msg!r:.80}")
    if uses_chat_template(tokenizer, use_chat_template):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    from codea1_core.method.prompts import render_plain

    return render_plain(messages)


def master_dtypes(finetune: str, dtype: torch.dtype) -> tuple[torch.dtype, torch.dtype | None]:
    """(parameter dtype, autocast dtype or None) of a policy with ``model.finetune`` and ``model.dtype``.

    Full fine-tuning in a half dtype keeps float32 master weights (and so float32 AdamW state) and computes
    under ``torch.autocast`` in the half dtype, as verl and TRL do: AdamW applied to bf16 weights rounds
    almost every lr-1e-6 update away (bf16 keeps 8 significant bits). LoRA needs none of this: peft keeps
    the adapters in float32 over a frozen half-precision base.
    """
    if finetune == "full" and dtype in (torch.bfloat16, torch.float16):
        return torch.float32, dtype
    return dtype, None


def lr_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """Linear warm-up over ``warmup_steps`` (step 0 already gets lr/warmup), then half-cosine to 0 (§11)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


class Policy:
    """A trainable causal LM for one role; see the module docstring."""

    def __init__(self, model_path: str, cfg: Config, role: str = "code", total_steps: int = 100) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if role not in ("code", "test"):
            raise ValueError(f"role: expected 'code' or 'test', got {role!r}")
        self.cfg, self.role, self.model_path, self.total_steps = cfg, role, str(model_path), total_steps
        self.device = _resolve_device(cfg.model.device)
        self.dtype = _resolve_dtype(cfg.model.dtype, self.device)
        self.param_dtype, self.autocast_dtype = master_dtypes(cfg.model.finetune, self.dtype)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            model: Any = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=self.param_dtype)
        except OSError as exc:
            raise OSError(f"model.{role}_path: cannot load model {self.model_path!r}: {exc}") from exc
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        model.to(self.device)
        if cfg.model.gradient_checkpointing:
            # transformers 5 names it activation checkpointing (the old name warns); older releases know only the old
            enable = (
                getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            )
            enable()
            model.enable_input_require_grads()
        self.ref_model = None
        if cfg.model.finetune == "lora":
            model = self._wrap_lora(model)
        else:
            # The frozen reference needs no master copy: it is kept in the compute dtype (half the memory).
            self.ref_model = copy.deepcopy(model).to(self.dtype).eval().requires_grad_(False)
        self.model = model
        self.eos_ids = self._eos_ids()
        self.fast_generate = True
        """Sample through :mod:`codea1_core.models.cpu_decode.engine` where it supports the model (False: always HF)."""
        self.share_prompt = cfg.rollout.share_prompt
        """Fast path: one prefill and one key/value copy per prompt (``rollout.share_prompt``; False: bitwise
        ``generate``)."""
        self.dist_module: Any = None
        """DDP / FSDP2 wrapper of the log-prob forward (:func:`codea1_core.models.distributed.wrap_policy`)."""
        self.data_parallel: Any = None
        """:class:`codea1_core.models.distributed.DataParallel` when the update is reduced over ranks."""
        self.whole_model: Any = None
        """FSDP2: a plain copy of the weights to sample from and export (``distributed.whole_copy``); None:
        ``model``."""
        self.gathered: dict | None = None
        """FSDP2: the checkpoint state gathered to rank 0 since the last update (``distributed.gather_for_save``)."""
        self.rebuild_optimizer()
        self.step_count = 0

    @property
    def whole(self) -> Any:
        """The model holding the whole weights: what rollouts sample from and checkpoints write (``model``
        unless FSDP2 shards it; then its copy, refreshed after every update)."""
        return self.whole_model if self.whole_model is not None else self.model

    @staticmethod
    def logprob_forward() -> Any:
        """The per-token log-prob forward a data-parallel wrapper runs (``distributed.wrap_policy``)."""
        return _completion_logprobs

    def rebuild_optimizer(self) -> None:
        """A fresh AdamW + warm-up/cosine schedule over the trainable parameters (again after FSDP2 sharding)."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        g = self.cfg.grpo
        self.optimizer = torch.optim.AdamW(
            params, lr=g.lr, betas=(g.adam_beta1, g.adam_beta2), weight_decay=g.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, g.warmup_steps, self.total_steps)
        )

    # ---------------------------------------------------------------------------------------- set-up
    def _wrap_lora(self, model: Any) -> Any:
        from peft import LoraConfig, get_peft_model

        m = self.cfg.model
        names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        present = [t for t in m.lora_target_modules if t in names]
        missing = [t for t in m.lora_target_modules if t not in names]
        if missing:
            log.warning("model.lora_target_modules: %s not in %s, skipped", missing, self.model_path)
        if not present:
            raise ValueError(
                f"model.lora_target_modules: none of {m.lora_target_modules} in {self.model_path}"
            )
        lora = LoraConfig(
            r=m.lora_rank,
            lora_alpha=m.lora_alpha,
            lora_dropout=m.lora_dropout,
            target_modules=present,
            task_type="CAUSAL_LM",
        )
        return get_peft_model(model, lora)

    def _eos_ids(self) -> list[int]:
        gen_eos = getattr(self.model.generation_config, "eos_token_id", None)
        ids = list(gen_eos) if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else []
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in ids:
            ids.append(self.tokenizer.eos_token_id)
        return ids

    def render(self, messages: list[dict]) -> str:
        """Prompt text: the chat template with the generation prompt, else ``prompts.render_plain``."""
        return render_messages(self.tokenizer, messages, self.cfg.model.use_chat_template)

    # ---------------------------------------------------------------------------------------- rollout
    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[dict]],
        n: int,
        sampling: SamplingParams,
        on_chunk: Callable[[int, list[list[Completion]]], None] | None = None,
    ) -> list[list[Completion]]:
        """Sample ``n`` completions per chat prompt, ``rollout.batch_size`` prompts (x n rows) per call.

        Each chunk is seeded with ``sampling.seed`` + its first prompt's index, so what a prompt samples does not
        depend on how many chunks follow. ``on_chunk(first_prompt_index, rows)`` is called after each chunk (the
        train step hands finished problems to the sandbox while later chunks generate)."""
        if n < 1:
            raise ValueError(f"n: expected >= 1, got {n}")
        texts = [self.render(p) for p in prompts]
        plain = not uses_chat_template(self.tokenizer, self.cfg.model.use_chat_template)
        if sampling.max_prompt_tokens > 0:
            lengths = [len(ids) for ids in self.tokenizer(texts, add_special_tokens=plain)["input_ids"]]
            check_prompt_lengths(lengths, sampling.max_prompt_tokens, f"{self.role} rollout")
        bs = max(1, self.cfg.rollout.batch_size)
        out: list[list[Completion]] = []
        was_training = self.whole.training
        self.whole.eval()
        try:
            for start in range(0, len(texts), bs):
                enc = self.tokenizer(
                    texts[start : start + bs], add_special_tokens=plain, padding=True, return_tensors="pt"
                )
                rows = self._generate_chunk(enc, n, sampling, seed=sampling.seed + start)
                out.extend(rows)
                if on_chunk is not None:
                    on_chunk(start, rows)
        finally:
            self.whole.train(was_training)
        return out

    def _generate_chunk(self, enc: Any, n: int, sp: SamplingParams, seed: int) -> list[list[Completion]]:
        ids = enc["input_ids"].repeat_interleave(n, 0).to(self.device)
        mask = enc["attention_mask"].repeat_interleave(n, 0).to(self.device)
        warpers = self._warpers(sp)
        fast = self.fast_generate and sp.max_new_tokens >= 1 and self._fast_unsupported() is None
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            if fast:
                new, lps = self._sample_fast(enc, n, sp, warpers)
            else:
                new, lps = self._sample_hf(ids, mask, sp, warpers)
        rows = []
        for r in range(new.shape[0]):
            toks = new[r].tolist()
            stop = next((i for i, t in enumerate(toks) if t in self.eos_ids), None)
            toks = toks if stop is None else toks[: stop + 1]
            prompt = ids[r][mask[r].bool()].tolist()
            text = cast(str, self.tokenizer.decode(toks, skip_special_tokens=True))
            reason = "stop" if stop is not None else "length"
            rows.append(Completion(text, prompt, toks, lps[r, : len(toks)].tolist(), reason))
        return [rows[i : i + n] for i in range(0, len(rows), n)]

    @staticmethod
    def _warpers(sp: SamplingParams) -> list[Any]:
        """The sampling warpers, in ``generate``'s order (after the raw log-prob recorder)."""
        from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        warpers: list[Any] = []
        sample = sp.temperature > 0
        if sample and sp.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(sp.temperature))
        if sample and sp.top_k > 0:
            warpers.append(TopKLogitsWarper(sp.top_k))
        if sample and sp.top_p < 1.0:
            warpers.append(TopPLogitsWarper(sp.top_p))
        return warpers

    def _fast_unsupported(self) -> str | None:
        """Why :mod:`codea1_core.models.cpu_decode.engine` cannot stand in for ``generate`` here (None: it
        can); logged once."""
        from codea1_core.models import cpu_decode

        reason = cpu_decode.unsupported_reason(self.whole)
        if reason is not None and not getattr(self, "_fast_reason_logged", False):
            log.info("policy %s: HF generate (fast path not applicable: %s)", self.role, reason)
            self._fast_reason_logged = True
        return reason

    def _sample_fast(self, enc: Any, n: int, sp: SamplingParams, warpers: list[Any]) -> tuple:
        """New tokens and raw log-probs from :func:`codea1_core.models.cpu_decode.generate` (same as ``generate``)."""
        from codea1_core.models import cpu_decode

        out = cpu_decode.generate(
            self.whole,
            enc["input_ids"].to(self.device),
            enc["attention_mask"].to(self.device),
            n=n,
            max_new_tokens=sp.max_new_tokens,
            eos_ids=self.eos_ids,
            pad_id=self.tokenizer.pad_token_id,
            do_sample=sp.temperature > 0,
            warpers=warpers,
            share_prompt=self.share_prompt,
        )
        return out.tokens, out.logprobs

    def _sample_hf(
        self, ids: torch.Tensor, mask: torch.Tensor, sp: SamplingParams, warpers: list[Any]
    ) -> tuple:
        """New tokens and raw log-probs from HF ``generate`` (the reference path; any model)."""
        from transformers import LogitsProcessorList

        recorder = _RawLogprobRecorder()
        sample = sp.temperature > 0
        seqs = self.whole.generate(
            input_ids=ids,
            attention_mask=mask,
            **(
                {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0}
                if sample
                else {"do_sample": False}
            ),
            repetition_penalty=1.0,
            max_new_tokens=sp.max_new_tokens,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.eos_ids,
            logits_processor=LogitsProcessorList([recorder, *warpers]),
        )
        new = seqs[:, ids.shape[1] :].cpu()
        if new.shape[1]:
            recorder.take(new[:, -1])
        lps = torch.stack(recorder.logprobs, 1) if recorder.logprobs else torch.zeros(new.shape)
        return new, lps

    # ---------------------------------------------------------------------------------------- update
    def _forward(
        self, samples: list[tuple[list[int], list[int]]], *, reference: bool = False, entropy: bool = True
    ) -> tuple:
        """Per-token log-probs, completion mask and per-token entropy of each completion (all (B, T) float32).

        Prompts are left-padded, completions right-padded. The LM head runs on the completion tokens only,
        one block of :data:`LOGPROB_BLOCK_TOKENS` at a time (``grpo.blocked_token_logprobs``), so no
        full-vocabulary logits exist for the micro-batch; padding positions get log-prob and entropy 0.
        ``entropy=False`` (the old/reference passes) skips the entropy and returns zeros for it.
        """
        p_max = max(len(p) for p, _ in samples)
        c_max = max(len(c) for _, c in samples)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(samples), p_max + c_max), pad, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, (p, c) in enumerate(samples):
            ids[i, p_max - len(p) : p_max + len(c)] = torch.tensor(p + c)
            attn[i, p_max - len(p) : p_max + len(c)] = 1
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        ids, attn, pos = ids.to(self.device), attn.to(self.device), pos.to(self.device)
        model = self.ref_model if reference and self.ref_model is not None else self.model
        kwargs = {"input_ids": ids, "attention_mask": attn, "position_ids": pos}
        targets, cmask = ids[:, p_max:], attn[:, p_max:].bool()
        run: Callable[..., tuple[torch.Tensor, torch.Tensor]] = _completion_logprobs
        if self.dist_module is not None and model is self.model:  # through DDP/FSDP2's root (distributed.py)
            model, run = None, lambda _m, *a: self.dist_module(*a)
        with self._autocast():
            if reference and self.ref_model is None:
                with self.model.disable_adapter():
                    lp, ent = run(model, kwargs, targets, cmask, p_max, entropy)
            else:
                lp, ent = run(model, kwargs, targets, cmask, p_max, entropy)
        return lp, cmask.float(), ent

    def _autocast(self) -> Any:
        """bf16/fp16 compute over float32 master weights (full fine-tuning), else a no-op context."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def _micro_batches(self, idx: list[int], batch: TrainBatch) -> list[list[int]]:
        """Greedy split of sample indices so that padded tokens per micro-batch stay under the budget."""
        budget, p_max, c_max = self.cfg.grpo.micro_batch_tokens, 0, 0
        out: list[list[int]] = []
        cur: list[int] = []
        for i in idx:
            p, c = max(p_max, len(batch.prompt_ids[i])), max(c_max, len(batch.completion_ids[i]))
            if cur and (len(cur) + 1) * (p + c) > budget:
                out.append(cur)
                cur, p, c = [], len(batch.prompt_ids[i]), len(batch.completion_ids[i])
            cur, p_max, c_max = cur + [i], p, c
        return out + ([cur] if cur else [])

    def _padded(self, micro_batches: list[list[int]]) -> list[list[int]]:
        """Distributed: as many micro-batches as the rank with the most (empty = dummy), else unchanged."""
        return micro_batches if self.data_parallel is None else self.data_parallel.pad(micro_batches)

    def _samples(self, batch: TrainBatch, micro: list[int]) -> list[tuple[list[int], list[int]]]:
        """(prompt, completion) pairs of ``micro``; an empty (dummy) micro-batch is one pad token each."""
        if not micro:
            pad = self.tokenizer.pad_token_id
            return [([pad], [pad])]
        return [(batch.prompt_ids[i], batch.completion_ids[i]) for i in micro]

    def update_gives_old_logprobs(self, mini_batches: int) -> bool:
        """True when the update's own forward gives the old log-probs bit for bit, so :meth:`step` runs no
        pass for them: one mini-batch (its forward sees the weights the old pass would see, in the same
        micro-batches), one process (no DDP/FSDP2 wrapper), no dropout anywhere (training and eval mode then
        run the same ops) and the CPU (grad mode does not change a CPU kernel's result:
        ``tests/core/models/test_policy.py``; a GPU library may pick another kernel with grad, so there the pass
        runs as the reference implementation runs it)."""
        if mini_batches != 1 or self.data_parallel is not None or self.dist_module is not None:
            return False
        if self.device.type != "cpu":
            return False
        return not _has_dropout(self.model)

    @torch.no_grad()
    def _logprobs_no_grad(
        self, batch: TrainBatch, idx: list[int], reference: bool
    ) -> dict[int, torch.Tensor]:
        self.model.eval()
        out = {}
        for mb in self._padded(self._micro_batches(idx, batch)):
            lp, _, _ = self._forward(
                self._samples(batch, mb),
                reference=reference,
                entropy=False,
            )
            for row, i in enumerate(mb):
                out[i] = lp[row, : len(batch.completion_ids[i])].cpu()
        return out

    def _check_batch(self, batch: TrainBatch) -> None:
        n = len(batch.completion_ids)
        flags = batch.in_zero_variance_group
        if (
            len(batch.prompt_ids) != n
            or len(batch.advantages) != n
            or (flags is not None and len(flags) != n)
        ):
            raise ValueError(
                f"TrainBatch ({self.role}): {len(batch.prompt_ids)} prompts, {n} completions, "
                f"{len(batch.advantages)} advantages, {len(flags) if flags is not None else n} group flags; "
                "expected equal counts"
            )
        for i in range(n):
            if not batch.prompt_ids[i]:
                raise ValueError(f"TrainBatch ({self.role}): sample {i} has an empty prompt")
            if batch.old_logprobs is not None and len(batch.old_logprobs[i]) != len(batch.completion_ids[i]):
                raise ValueError(
                    f"TrainBatch ({self.role}): sample {i}: old_logprobs length != completion length"
                )
            if not math.isfinite(float(batch.advantages[i])):
                raise ValueError(
                    f"TrainBatch ({self.role}): sample {i}: advantage {batch.advantages[i]} not finite"
                )

    def step(self, batch: TrainBatch) -> dict[str, float]:
        """One GRPO training step (docs/method.md §10): mini-batches x exact token-mean micro-batches.

        Old log-probs are recomputed with the current weights when ``batch.old_logprobs`` is None (by the
        update's own forward where that gives them bit for bit, :meth:`update_gives_old_logprobs`), and
        reference log-probs come from the adapter-disabled model (LoRA) or the frozen copy (full), both
        before the first update (§3 step 13). One optimizer step per mini-batch, one scheduler step per call.
        With ``grpo.skip_zero_variance_groups`` (D9) the samples of zero-variance groups are left out entirely.
        """
        t0, g = time.perf_counter(), self.cfg.grpo
        self._check_batch(batch)
        all_idx = [i for i in range(len(batch.completion_ids)) if batch.completion_ids[i]]
        zero = [i for i in all_idx if batch.advantages[i] == 0.0]
        flat = (
            set(zero)
            if batch.in_zero_variance_group is None
            else {i for i in all_idx if batch.in_zero_variance_group[i]}
        )  # D9 skips zero-variance GROUPS, not a member of a spread group that sits exactly at the mean
        train_idx = [i for i in all_idx if not (g.skip_zero_variance_groups and i in flat)]
        lr = self.optimizer.param_groups[0]["lr"]
        n_mb = max(1, g.mini_batches)
        old: dict[int, torch.Tensor] | None
        if batch.old_logprobs is not None:
            old = {i: torch.tensor(batch.old_logprobs[i], dtype=torch.float32) for i in train_idx}
        elif self.update_gives_old_logprobs(n_mb):
            old = None  # the update's own forward computes them, bit for bit (no pass of their own)
        else:
            old = self._logprobs_no_grad(batch, train_idx, reference=False)
        ref = self._logprobs_no_grad(batch, train_idx, reference=True)
        sums = dict.fromkeys(("loss", "pg_loss", "kl", "clip_frac", "dual_clip_frac", "entropy"), 0.0)
        norms: list[float] = []
        self.model.train()
        dp = self.data_parallel
        for k in range(n_mb):
            if dp is None:
                mb_idx = train_idx[k * len(train_idx) // n_mb : (k + 1) * len(train_idx) // n_mb]
            else:  # this rank's part of the k-th slice of the GLOBAL sample order (distributed.py)
                mb_idx = dp.mini_batch(train_idx, k, n_mb)
            mb_tokens = sum(len(batch.completion_ids[i]) for i in mb_idx)
            mb_tokens = int(dp.total(mb_tokens)) if dp is not None else mb_tokens
            if mb_tokens:
                norms.append(self._update(batch, mb_idx, old, ref, sums, mb_tokens))
        self.scheduler.step()
        self.step_count += 1
        if self.whole_model is not None:  # FSDP2: the copy rollouts sample from (every rank: a collective)
            from codea1_core.models.distributed import sync_whole

            sync_whole(self)
        counts = [sum(len(batch.completion_ids[i]) for i in train_idx), len(zero), len(all_idx)]
        if dp is not None:  # token-weighted sums and counts over all ranks: the single-process metrics
            reduced = dp.sums([*sums.values(), *counts])
            sums, counts = dict(zip(sums, reduced[: len(sums)], strict=True)), reduced[len(sums) :]
        tokens = counts[0]
        metrics = {k: v / max(1, tokens) for k, v in sums.items()}
        metrics.update(
            grad_norm=sum(norms) / len(norms) if norms else 0.0,
            tokens=float(tokens),
            lr=lr,
            zero_adv_frac=counts[1] / max(1, counts[2]),
            seconds=time.perf_counter() - t0,
        )
        return metrics

    def _update(
        self, batch: TrainBatch, mb_idx: list[int], old: dict | None, ref: dict, sums: dict, mb_tokens: int
    ) -> float:
        """One optimizer step on one mini-batch of ``mb_tokens`` completion tokens (over all ranks); adds
        token-weighted metric sums; returns the grad norm. ``old`` None: the old log-probs are this forward's
        own (:meth:`update_gives_old_logprobs`)."""
        from codea1_core.method.grpo import policy_loss
        from codea1_core.models.distributed import grad_sync

        g = self.cfg.grpo
        self.optimizer.zero_grad(set_to_none=True)
        micros = self._padded(self._micro_batches(mb_idx, batch))
        world = self.data_parallel.world if self.data_parallel is not None else 1
        for n, micro in enumerate(micros):
            with grad_sync(self.dist_module, enabled=n == len(micros) - 1):
                lp, cmask, ent = self._forward(self._samples(batch, micro))
                if not micro:  # dummy micro-batch (another rank has more): zero weight, same collectives
                    (lp.sum() * 0.0).backward()
                    continue
                old_t = (
                    lp.detach().clone() if old is None else _pad_rows([old[i] for i in micro]).to(lp.device)
                )
                ref_t = _pad_rows([ref[i] for i in micro]).to(lp.device)
                adv = torch.tensor([float(batch.advantages[i]) for i in micro], device=lp.device)
                # Dividing by the mini-batch's token count makes the sum over micro-batches its token mean
                # (§10); over W ranks the count is global and DDP/FSDP2 average gradients, hence x W.
                loss, parts = policy_loss(
                    lp,
                    old_t,
                    ref_t,
                    adv,
                    cmask,
                    g.clip_low,
                    g.clip_high,
                    g.dual_clip_c,
                    g.kl_coef,
                    g.kl_clamp,
                    num_tokens_total=mb_tokens,
                )
                (loss * world if world > 1 else loss).backward()
            sums["entropy"] += float((ent * cmask).sum())
            w = parts["tokens"]
            sums["loss"] += float(loss.detach()) * mb_tokens
            sums["pg_loss"] += parts["pg_loss"] * w
            sums["kl"] += parts["kl"] * w
            sums["clip_frac"] += (parts["clip_frac_low"] + parts["clip_frac_high"]) * w
            sums["dual_clip_frac"] += parts["dual_clip_frac"] * w
        params = [p for p in self.model.parameters() if p.requires_grad]
        total = torch.nn.utils.clip_grad_norm_(params, g.grad_clip)
        norm = float(total.full_tensor() if hasattr(total, "full_tensor") else total)  # FSDP2: a DTensor
        if not math.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(f"policy {self.role}: non-finite grad norm at step {self.step_count}")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    # ---------------------------------------------------------------------------------------- checkpoints
    def save(self, path: str | Path) -> Path:
        """Adapter or weights + tokenizer + optimizer/scheduler/RNG/step state, written atomically."""
        return policy_io.save_policy(self, Path(path))

    def load(self, path: str | Path) -> None:
        """Restore a :meth:`save` checkpoint into this policy (built on the same base model and config)."""
        policy_io.restore_policy(self, Path(path))

    def export(self, path: str | Path) -> Path:
        """A standalone HF model directory (LoRA merged into a copy) + tokenizer, written atomically."""
        return policy_io.export_policy(self, Path(path))


def _has_dropout(model: Any) -> bool:
    """Whether training mode can change ``model``'s numbers: a dropout module with p > 0, or a config rate
    (``attention_dropout``, ``resid_pdrop``, ...) above 0 that a forward applies functionally in training mode."""
    dropouts = (
        torch.nn.Dropout,
        torch.nn.Dropout1d,
        torch.nn.Dropout2d,
        torch.nn.Dropout3d,
        torch.nn.AlphaDropout,
        torch.nn.FeatureAlphaDropout,
    )
    if any(isinstance(m, dropouts) and m.p > 0 for m in model.modules()):
        return True
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    to_dict = getattr(getattr(base, "config", None), "to_dict", None)
    rates = to_dict() if callable(to_dict) else {}
    return any(
        ("dropout" in key or "pdrop" in key) and isinstance(value, int | float) and value > 0
        for key, value in rates.items()
    )


def _decoder_and_head(model: Any) -> tuple[Any, Any] | None:
    """(decoder, LM head) of an HF causal LM (through a peft wrapper), or None when logits are post-processed.

    Models that scale or soft-cap their logits (``logit_scale``, ``final_logit_softcapping``) or do not
    expose the two parts fall back to the model's own forward.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if any(getattr(config, k, None) for k in ("final_logit_softcapping", "logit_scale", "logits_scaling")):
        return None
    try:
        decoder, head = base.get_decoder(), base.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    if decoder is None or not isinstance(head, torch.nn.Linear):
        return None
    return decoder, head


def _completion_logprobs(
    model: Any, kwargs: dict, targets: torch.Tensor, cmask: torch.Tensor, p_max: int, entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) log-probs and entropies of ``targets`` where ``cmask``; hidden row p_max-1+t predicts token t."""
    from codea1_core.method.grpo import blocked_token_logprobs

    parts = _decoder_and_head(model)
    ent_sel: torch.Tensor | None
    zeros = torch.zeros(targets.shape, dtype=torch.float32, device=targets.device)
    if parts is None:  # fallback: the model's own (post-processed) logits, materialised for these rows
        logits = model(**kwargs, logits_to_keep=targets.shape[1] + 1).logits[:, :-1][cmask].float()
        logp = torch.log_softmax(logits, -1)
        lp_sel = logp.gather(-1, targets[cmask].unsqueeze(-1)).squeeze(-1)
        ent_sel = -(logp.detach().exp() * logp.detach()).sum(-1)
    else:
        decoder, head = parts
        hidden = decoder(**kwargs, use_cache=False).last_hidden_state[
            :, p_max - 1 : p_max - 1 + targets.shape[1]
        ]
        lp_sel, ent_sel = blocked_token_logprobs(
            hidden[cmask], head.weight, head.bias, targets[cmask], LOGPROB_BLOCK_TOKENS, with_entropy=entropy
        )
    ent = zeros.masked_scatter(cmask, ent_sel) if entropy and ent_sel is not None else zeros
    return zeros.masked_scatter(cmask, lp_sel), ent


def _pad_rows(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
