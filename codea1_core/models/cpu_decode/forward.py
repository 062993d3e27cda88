"""One Qwen2 decode step (one new token per row) on the model's own tensors, without HF's forward plumbing.

Why: at the lab's shapes a decode step is dozens of tiny ops; HF's ``Qwen2ForCausalLM.forward`` wraps them in
output-capture and kwargs decorators, ``nn.Module.__call__`` hook dispatch per submodule, a mask dict and
output dataclasses, once per token. :class:`DecodeStep` runs the same torch ops, in the same order, on the
same shapes and dtypes as ``transformers``' ``modeling_qwen2`` code (read from transformers 5.24):

* RMSNorm: upcast to float32, ``pow(2).mean`` variance, ``rsqrt(var + eps)``, cast back, times the weight;
* projections: ``F.linear`` on the module's weight and bias when it is a plain ``nn.Linear`` without hooks,
  else the module itself (a PEFT LoRA layer keeps its own forward, so its arithmetic is exact by construction);
* rotary and attention: HF's own functions (the model's ``rotary_emb`` module once per step,
  ``apply_rotary_pos_emb`` and the ``ALL_ATTENTION_FUNCTIONS`` interface of the configured
  ``attn_implementation``), fed the same mask HF builds for one query token;
* SiLU MLP, residual adds, final norm and ``lm_head`` as HF writes them.

``tests/core/models/cpu_decode/test_engine.py`` checks bitwise-equal logits against HF's forward on several random-init
configs (the lab's, a GQA one, eager attention, LoRA). What it does not cover: any other model family,
sliding windows, rope scaling other than the default, hub kernels; :func:`unsupported_reason` names those.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F

BATCH_INVARIANT_ROWS = 16
"""Batch sizes that are multiples of this give each row the same bits whatever other rows share its batch.

Two things make a row's numbers depend on its batch on the CPU (measured with torch 2.13, one thread):

* ``F.linear`` over 15 rows or fewer takes other kernels than a larger batch (up to 5 rows at 128 input
  features, 10 at 256, 15 from 512 to 2,048), which round differently; from 16 rows on every size agreed;
* vectorised element-wise functions (SiLU, rotary's cos/sin) compute the elements past the last full vector
  block of a tensor with scalar code, which rounds differently: the last row's last elements when the
  tensor's size is not a multiple of the block.

The shared decode runs every step on a multiple of 16 rows (:class:`DecodeStep` ``min_rows``: ghost rows), so
splitting the prompts over processes, or prompts leaving the batch, never changes another row's tokens
(``tests/core/models/cpu_decode/test_shared_decode.py`` checks both on four model shapes). That holds with MKL
in its ``COMPATIBLE``
branch (``model.cpu_numerics: reproducible``): in its default mode MKL's GEMM kernels depend on the CPU, and
on an AMD EPYC (MKL 2024.2) a batched GEMM of the shared attention rounded otherwise for another batch count,
so outside that branch the decode is not split (``codea1_core.models.cpu_numerics``)."""


def _linear(module: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """``F.linear`` on a plain ``nn.Linear``'s tensors (what its forward does), else the module's own forward."""
    plain = type(module) is torch.nn.Linear and not (module._forward_hooks or module._forward_pre_hooks)
    if not plain:
        return module
    weight, bias = module.weight, module.bias
    return lambda x: F.linear(x, weight, bias)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``Qwen2RMSNorm.forward``, op for op."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


def unsupported_reason(base: Any) -> str | None:
    """Why :class:`DecodeStep` would not reproduce ``base``'s forward (None when it does)."""
    from transformers.models.qwen2 import modeling_qwen2 as mq

    if type(base) is not mq.Qwen2ForCausalLM:
        return f"model class {type(base).__name__} (Qwen2ForCausalLM only)"
    config = base.config
    rope = config.rope_parameters or {}
    if rope.get("rope_type", "default") != "default":
        return f"rope type {rope.get('rope_type')!r} (default only)"
    if config.hidden_act != "silu":
        return f"hidden_act {config.hidden_act!r} (silu only)"
    norms = [base.model.norm] + [
        n for layer in base.model.layers for n in (layer.input_layernorm, layer.post_attention_layernorm)
    ]
    if any(
        type(n).forward is not mq.Qwen2RMSNorm.forward or n._forward_hooks or n._forward_pre_hooks
        for n in norms
    ):
        return "RMSNorm forward replaced or hooked (hub kernels?)"
    if mq.Qwen2Attention.forward.__qualname__ != "Qwen2Attention.forward":
        return "Qwen2Attention.forward replaced"
    return None


class DecodeStep:
    """``base``'s forward for one token per row with a preallocated key/value cache; float32 logits out.

    Args:
        base: A ``Qwen2ForCausalLM`` (LoRA layers may be injected) for which :func:`unsupported_reason` is None.
        cache: Object with ``update(key, value, layer_idx) -> (keys, values)`` and ``length`` (tokens stored),
            or with ``attend(layer_idx, query, key, value, scaling)``: then it stores and attends itself.
        mask: The boolean ``[rows, 1, 1, total_len]`` key mask (None: nothing padded), sliced per step.
            It is turned into the float mask each attention kernel uses once, here.
        min_rows: Run every step on a multiple of this many rows, adding ghost rows (token 0 at position 0,
            never attended to or attending, dropped from the logits), so that each row's numbers do not depend
            on how many rows share the batch (0: never; the exact mode, which must round as HF's forward does).
            See :data:`BATCH_INVARIANT_ROWS`.
    """

    def __init__(self, base: Any, cache: Any, mask: torch.Tensor | None, min_rows: int = 0) -> None:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        from transformers.models.qwen2 import modeling_qwen2 as mq

        model, config = base.model, base.config
        self.cache = cache
        self.shared_attend = getattr(cache, "attend", None)
        """The cache's own attention (``shared._SharedPromptCache``), else None: HF's attention function."""
        self.embed = model.embed_tokens
        self.rotary = model.rotary_emb
        self.apply_rotary = mq.apply_rotary_pos_emb
        self.attention = ALL_ATTENTION_FUNCTIONS.get_interface(
            config._attn_implementation, mq.eager_attention_forward
        )
        self.eager = config._attn_implementation == "eager"
        self.mask, self.dtype = mask, next(base.parameters()).dtype
        if mask is not None:
            # eager: HF's mask, the boolean one as 0 / dtype-min floats; SDPA: the 0 / -inf floats SDPA itself
            # converts a boolean mask to on every call, made once (the kernel sees the same values)
            zero = torch.zeros((), dtype=self.dtype, device=mask.device)
            self.mask = torch.where(mask, zero, torch.finfo(self.dtype).min if self.eager else float("-inf"))
        self.layers = [self._layer(layer) for layer in model.layers]
        self.final_norm = (model.norm.weight, model.norm.variance_epsilon)
        self.lm_head = _linear(base.lm_head)
        self.min_rows = min_rows

    @staticmethod
    def _layer(layer: Any) -> dict[str, Any]:
        attn, mlp = layer.self_attn, layer.mlp
        return {
            "attn": attn,
            "norm1": (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon),
            "norm2": (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon),
            "q": _linear(attn.q_proj),
            "k": _linear(attn.k_proj),
            "v": _linear(attn.v_proj),
            "o": _linear(attn.o_proj),
            "gate": _linear(mlp.gate_proj),
            "up": _linear(mlp.up_proj),
            "down": _linear(mlp.down_proj),
        }

    def _step_mask(self, kv_len: int, rows: int, device: torch.device) -> torch.Tensor | None:
        """The mask HF passes for one query token over ``kv_len`` keys (eager always gets one)."""
        if self.mask is not None:
            return self.mask[:, :, :, :kv_len]
        if self.eager and self.shared_attend is None:
            return torch.zeros((rows, 1, 1, kv_len), dtype=self.dtype, device=device)
        return None

    def __call__(self, tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """Logits ``[rows, vocab]`` (float32 copy) after feeding ``tokens`` ``[rows]`` at ``position`` ``[rows, 1]``."""
        rows = tokens.shape[0]
        mask = self._step_mask(self.cache.length + 1, rows, tokens.device)
        if self.min_rows and rows % self.min_rows:  # ghost rows (token 0 at position 0) up to a multiple
            ghosts = self.min_rows - rows % self.min_rows
            tokens = torch.cat([tokens, tokens.new_zeros(ghosts)])
            position = torch.cat([position, position.new_zeros((ghosts, position.shape[1]))])
        hidden = self.embed(tokens[:, None])
        position_embeddings = self.rotary(hidden, position)
        for idx, layer in enumerate(self.layers):
            residual = hidden
            hidden = _rms_norm(hidden, *layer["norm1"])
            hidden = residual + self._attend(idx, layer, hidden, position_embeddings, mask, rows)
            residual = hidden
            hidden = _rms_norm(hidden, *layer["norm2"])
            hidden = residual + layer["down"](F.silu(layer["gate"](hidden)) * layer["up"](hidden))
        hidden = _rms_norm(hidden, *self.final_norm)
        return self.lm_head(hidden)[:rows, -1].to(copy=True, dtype=torch.float32)

    def _attend(
        self,
        idx: int,
        layer: dict[str, Any],
        hidden: torch.Tensor,
        position_embeddings: tuple,
        mask: torch.Tensor | None,
        rows: int,
    ) -> torch.Tensor:
        """``Qwen2Attention.forward`` for one token: projections, rotary, cache write, HF's attention, o_proj.

        ``hidden`` holds the ``rows`` real rows, then any ghost rows (``min_rows``): the projections and rotary
        run on all of them, the cache and attention on the real rows, ``o_proj`` on the output padded with zeros.
        """
        attn = layer["attn"]
        hidden_shape = (*hidden.shape[:-1], -1, attn.head_dim)
        query = layer["q"](hidden).view(hidden_shape).transpose(1, 2)
        key = layer["k"](hidden).view(hidden_shape).transpose(1, 2)
        value = layer["v"](hidden).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        query, key = self.apply_rotary(query, key, cos, sin)
        if hidden.shape[0] > rows:
            query, key, value = query[:rows], key[:rows], value[:rows]
        if self.shared_attend is not None:
            out = self.shared_attend(idx, query, key, value, attn.scaling)
        else:
            key, value = self.cache.update(key, value, idx)
            out, _ = self.attention(
                attn,
                query,
                key,
                value,
                mask,
                dropout=0.0,
                scaling=attn.scaling,
                sliding_window=attn.sliding_window,
            )
        out = out.reshape(rows, hidden.shape[1], -1).contiguous()
        if hidden.shape[0] > rows:
            out = torch.cat([out, out.new_zeros((hidden.shape[0] - rows, *out.shape[1:]))])
        return layer["o"](out)
