"""Peak GPU memory of a training config, estimated before anything is loaded: does it fit, and what to change.

What it does: from a model's architecture (its HF ``config.json`` as a dict) and a :class:`Config`, adds up
what one GPU holds at the peak of a training step (docs/method.md §3 step 15, the two GRPO updates):

* ``weights``: the trained policies (two in ``codea1`` mode, one in ``golden``/``selfplay``), in their
  parameter dtype: float32 master weights for full fine-tuning in a half dtype (``policy.master_dtypes``);
* ``reference``: the frozen KL reference per policy (full fine-tuning; LoRA disables its adapter instead);
* ``gradients``: one policy's trainable parameters in float32 (the policies step one after the other and
  gradients are freed after each optimizer step); ``optimizer``: AdamW's two float32 moments, all policies;
* ``activations``: one micro-batch of ``grpo.micro_batch_tokens`` tokens through the decoder, saved for
  backward (every layer, or only layer inputs plus one recomputed layer with gradient checkpointing), plus a
  backward transient of one layer;
* ``weight_casts``: the half copies ``torch.autocast`` caches of float32 master weights (full fine-tuning);
* ``lm_head``: one :data:`codea1_core.models.policy.LOGPROB_BLOCK_TOKENS` block of float32 logits (the update never
  holds full-vocabulary logits for a micro-batch, ``grpo.blocked_token_logprobs``);
* ``vllm``: ``rollout.gpu_memory_utilization`` x the GPU (vLLM reserves that share up front);
* ``runtime``: CUDA context, cuBLAS workspaces and allocator slack (a fixed allowance).

:func:`verdict` says whether a plan fits a GPU and, when not, names the ONE key to change (with a value
that fits where there is one). What it does not: measure anything, or model attention's sequence-squared
memory (the update uses SDPA / flash attention, linear in the sequence length); it is an estimate for the
early, clear stop, checked against measured peaks in ``tests/core/models/test_memory_plan.py`` and the GPU bench.

Pure: arithmetic on dicts and the config; no torch. Run: ``codea1 plan --params FILE [--gpu-gb N]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from codea1_core.config import Config

GIB = 1024**3
LOGPROB_BLOCK_TOKENS = 1024
"""Keep equal to ``codea1_core.models.policy.LOGPROB_BLOCK_TOKENS`` (a test checks; importing policy needs torch)."""
RUNTIME_OVERHEAD_GIB = 1.5
"""CUDA context, cuBLAS/cuDNN workspaces and caching-allocator fragmentation, per GPU (measured order)."""
GPU_SIZES_GB = (80.0, 141.0)
"""The verdicts ``codea1 plan`` prints: an 80 GB A100/H100 and a 141 GB H200."""

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only transformer that decide its memory (read from an HF ``config.json``)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool = True

    @classmethod
    def from_hf_config(cls, raw: dict, source: str = "config.json") -> ModelShape:
        """Shape from an HF config dict; a missing key is a ``ValueError`` naming ``source`` and the key."""
        try:
            hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
            return cls(
                hidden=hidden,
                layers=int(raw["num_hidden_layers"]),
                heads=heads,
                kv_heads=int(raw.get("num_key_value_heads") or heads),
                intermediate=int(raw["intermediate_size"]),
                vocab=int(raw["vocab_size"]),
                tied=bool(raw.get("tie_word_embeddings", False)),
                qkv_bias=str(raw.get("model_type", "qwen2")).startswith("qwen2"),
            )
        except KeyError as exc:
            raise ValueError(
                f"{source}: missing key {exc.args[0]!r} (not a decoder-only HF config?)"
            ) from None

    @property
    def kv_dim(self) -> int:
        """Width of one token's keys (or values) across the KV heads."""
        return self.hidden // self.heads * self.kv_heads

    def projections(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear module of one decoder layer, by its HF name."""
        h, kv, i = self.hidden, self.kv_dim, self.intermediate
        return {
            "q_proj": (h, h),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (h, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def param_count(self) -> int:
        """All parameters (embedding, layers, final norm, untied LM head)."""
        per_layer = sum(a * b for a, b in self.projections().values()) + 2 * self.hidden
        if self.qkv_bias:
            per_layer += self.hidden + 2 * self.kv_dim
        head = 0 if self.tied else self.vocab * self.hidden
        return self.vocab * self.hidden + self.layers * per_layer + self.hidden + head

    def lora_param_count(self, rank: int, targets: list[str]) -> int:
        """LoRA A and B matrices of rank ``rank`` on every ``targets`` module of every layer."""
        return self.layers * sum(
            rank * (a + b) for name, (a, b) in self.projections().items() if name in targets
        )


@dataclass(frozen=True)
class MemoryPlan:
    """Estimated peak bytes per component on one GPU (see the module docstring), and what they came from."""

    parts: dict[str, float]
    gpu_bytes: float
    notes: tuple[str, ...] = ()

    @property
    def total(self) -> float:
        """Estimated peak bytes: the sum of the parts."""
        return sum(self.parts.values())

    def table(self) -> list[str]:
        """One line per component and the total, in GiB."""
        rows = [f"  {name:<12} {value / GIB:8.2f} GiB" for name, value in self.parts.items()]
        return [*rows, f"  {'total':<12} {self.total / GIB:8.2f} GiB", *(f"  note: {n}" for n in self.notes)]


def _dtype_name(cfg: Config, on_gpu: bool) -> str:
    return ("bfloat16" if on_gpu else "float32") if cfg.model.dtype == "auto" else cfg.model.dtype


def n_policies(cfg: Config) -> int:
    """Trained policies in one process: two in ``codea1``, one in ``golden`` (no Test LLM) and ``selfplay``."""
    return 2 if cfg.mode == "codea1" else 1


def activation_bytes_per_token_layer(shape: ModelShape, compute_bytes: int) -> float:
    """Bytes one token's pass through one decoder layer saves for backward (Qwen2/Llama layer, SDPA).

    Counted with ``torch.autograd.graph.saved_tensors_hooks`` on a Qwen2 layer
    (``tests/core/models/test_memory_plan.py``
    checks it on other shapes): about 7 hidden-sized tensors (norm outputs, q, rotary q, attention output,
    o_proj input, residuals), 3 key/value-sized ones (k, rotary k, v) and 4 intermediate-sized ones (gate,
    up, silu(gate), their product). In a half dtype each RMSNorm also keeps a float32 copy of its input.
    """
    h, kv, i = shape.hidden, shape.kv_dim, shape.intermediate
    fp32_norm_copies = 2 * 4 * h if compute_bytes < 4 else 0
    return compute_bytes * (7 * h + 3 * kv + 4 * i) + fp32_norm_copies


def saved_activation_bytes(shape: ModelShape, tokens: int, compute_bytes: int, checkpointing: bool) -> float:
    """Bytes a training forward of ``tokens`` tokens keeps for backward (before the LM head's blocks).

    With gradient checkpointing only each layer's input (plus embedding and final-norm outputs) is kept.
    """
    edges = 2 * tokens * shape.hidden * compute_bytes
    if checkpointing:
        return shape.layers * tokens * shape.hidden * compute_bytes + edges
    return shape.layers * tokens * activation_bytes_per_token_layer(shape, compute_bytes) + edges


def activations(shape: ModelShape, tokens: int, compute_bytes: int, checkpointing: bool) -> float:
    """Activation bytes of one micro-batch at the peak of its backward: what is saved, plus one layer's
    backward transient (and, with checkpointing, that layer's recomputed activations)."""
    per_layer = tokens * activation_bytes_per_token_layer(shape, compute_bytes)
    transient = 2 * per_layer if checkpointing else per_layer
    return saved_activation_bytes(shape, tokens, compute_bytes, checkpointing) + transient


def lm_head_bytes(shape: ModelShape, tokens: int, compute_bytes: int) -> float:
    """One LM-head block (half logits, float32 logits, entropy temporary, float32 logit grads) + saved rows."""
    block = min(tokens, LOGPROB_BLOCK_TOKENS)
    return block * shape.vocab * (compute_bytes + 3 * 4) + tokens * shape.hidden * compute_bytes


def estimate(
    cfg: Config,
    shape: ModelShape,
    gpu_gb: float,
    *,
    on_gpu: bool = True,
    ranks: int = 1,
    strategy: str = "ddp",
) -> MemoryPlan:
    """The peak of a training step on one GPU of ``gpu_gb`` GB (decimal, as GPUs are sold) for ``cfg``.

    Args:
        cfg: The run config (``model.*``, ``grpo.micro_batch_tokens``, ``rollout.*``, ``mode``).
        shape: The policies' architecture (both roles share one shape; they start from one base model).
        gpu_gb: GPU memory in GB (80 for an 80 GB card); the vLLM share is a fraction of it.
        on_gpu: False for a CPU estimate (no vLLM share, no CUDA runtime allowance; ``auto`` = float32).
        ranks: GPUs of a data-parallel run (``distributed.nproc_per_node`` x nodes); the plan is per rank.
        strategy: ``ddp`` (every rank holds everything: the plan does not shrink) or ``fsdp2`` (the trained
            weights, gradients and AdamW state are sharded over ``ranks``, plus two gathered decoder layers
            and the whole copy rollouts sample from; the frozen reference and the autocast weight copies stay
            whole).

    Returns:
        The :class:`MemoryPlan`.
    """
    m, dtype = cfg.model, _dtype_name(cfg, on_gpu)
    compute = _BYTES[dtype]
    full = m.finetune == "full"
    param = 4 if full else compute  # full fine-tuning in a half dtype keeps float32 master weights
    n, pols = shape.param_count(), n_policies(cfg)
    trainable = n if full else shape.lora_param_count(m.lora_rank, list(m.lora_target_modules))
    tokens = cfg.grpo.micro_batch_tokens
    parts = {
        "weights": pols * n * param + (0 if full else pols * trainable * 4),
        "reference": pols * n * compute if full else 0.0,
        "gradients": trainable * 4.0,
        "optimizer": pols * trainable * 8.0,
        "activations": activations(shape, tokens, compute, m.gradient_checkpointing),
        "lm_head": lm_head_bytes(shape, tokens, compute),
        # autocast caches a half copy of each float32 master weight for the forward/backward it runs
        "weight_casts": n * compute if full and compute < 4 else 0.0,
    }
    if ranks > 1 and strategy == "fsdp2":  # fully_shard: 1/ranks of each, plus the layers being gathered
        for key in ("weights", "gradients", "optimizer"):
            parts[key] /= ranks
        parts["fsdp_gather"] = 2 * (n / max(1, shape.layers)) * compute
        # the whole copy each rank samples from (distributed.whole_copy), in the compute dtype
        parts["sampling_copy"] = pols * (n * compute + (0 if full else trainable * 4))
    notes = [
        f"{pols} polic{'ies' if pols > 1 else 'y'}, {n / 1e9:.2f}B parameters each, "
        f"{'full' if full else 'LoRA'} ({trainable / 1e6:.1f}M trainable), {dtype} compute"
    ]
    if ranks > 1:
        notes.append(f"per rank of {ranks} ({strategy}); each rank rolls out and updates B/{ranks} problems")
    if on_gpu:
        vllm = cfg.rollout.backend == "vllm"
        parts["vllm"] = cfg.rollout.gpu_memory_utilization * gpu_gb * 1e9 if vllm else 0.0
        parts["runtime"] = RUNTIME_OVERHEAD_GIB * GIB
    return MemoryPlan(parts, gpu_gb * 1e9, tuple(notes))


def _fits(cfg: Config, shape: ModelShape, gpu_gb: float, **per_rank: Any) -> bool:
    plan = estimate(cfg, shape, gpu_gb, **per_rank)
    return plan.total <= plan.gpu_bytes


def fix(cfg: Config, shape: ModelShape, gpu_gb: float, **per_rank: Any) -> str:
    """The one ``key=value`` that makes ``cfg`` fit (first that works: vLLM share, checkpointing, micro-batch,
    LoRA), or the key to change when none does (the model itself)."""
    if cfg.rollout.backend == "vllm":
        for util in (0.45, 0.4, 0.35, 0.3, 0.25, 0.2):
            if util < cfg.rollout.gpu_memory_utilization and _fits(
                cfg.replace(**{"rollout.gpu_memory_utilization": util}), shape, gpu_gb, **per_rank
            ):
                return f"rollout.gpu_memory_utilization={util}"
    if not cfg.model.gradient_checkpointing and _fits(
        cfg.replace(**{"model.gradient_checkpointing": True}), shape, gpu_gb, **per_rank
    ):
        return "model.gradient_checkpointing=true"
    tokens = cfg.grpo.micro_batch_tokens // 2
    while tokens >= 1024:
        if _fits(cfg.replace(**{"grpo.micro_batch_tokens": tokens}), shape, gpu_gb, **per_rank):
            return f"grpo.micro_batch_tokens={tokens}"
        tokens //= 2
    ranks = int(per_rank.get("ranks", 1))
    if (
        ranks > 1
        and per_rank.get("strategy") != "fsdp2"
        and _fits(cfg, shape, gpu_gb, ranks=ranks, strategy="fsdp2")
    ):
        return "distributed.strategy=fsdp2"
    if cfg.model.finetune == "full" and _fits(
        cfg.replace(**{"model.finetune": "lora"}), shape, gpu_gb, **per_rank
    ):
        return "model.finetune=lora"
    return "model.code_path (a smaller model; none of the memory keys makes this one fit)"


def verdict(cfg: Config, shape: ModelShape, gpu_gb: float, **per_rank: Any) -> tuple[bool, str]:
    """(fits, one line) for one GPU of ``gpu_gb`` GB; the line names the key to change when it does not fit.
    ``per_rank``: ``ranks`` and ``strategy`` of :func:`estimate` (a data-parallel run's plan per rank)."""
    plan = estimate(cfg, shape, gpu_gb, **per_rank)
    need, have = plan.total / GIB, plan.gpu_bytes / GIB
    if plan.total <= plan.gpu_bytes:
        return True, f"{gpu_gb:g} GB GPU: fits ({need:.1f} of {have:.1f} GiB, {have - need:.1f} GiB free)"
    top = max((k for k in plan.parts), key=lambda k: plan.parts[k])
    return False, (
        f"{gpu_gb:g} GB GPU: does not fit (needs {need:.1f} of {have:.1f} GiB; largest part: {top} "
        f"{plan.parts[top] / GIB:.1f} GiB); set {fix(cfg, shape, gpu_gb, **per_rank)}"
    )
