"""Weights into a running vLLM engine: the worker extension that full fine-tuning pushes its update through.

What it does: :class:`WeightSync` is mixed into every vLLM worker (``vllm.LLM(worker_extension_cls=...)``, the
hook TRL and verl use); :func:`push_weights` sends a policy's whole weights to it with ``LLM.collective_rpc``
and resets the prefix cache (cached keys/values were computed with the old weights). The engine keeps running:
no restart, no re-load from disk. vLLM's in-place reload (``model_runner.reload_weights``) runs the model's own
``load_weights``, which maps the HF names (``q_proj``/``k_proj``/``v_proj`` into the fused ``qkv_proj``, a tied
``lm_head`` skipped) exactly as when it loads a checkpoint.

What it does not: gather FSDP2 shards (the caller passes ``Policy.whole``, the whole copy every rank keeps),
nor move tensors GPU to GPU: the tensors travel through vLLM's RPC serialisation as CPU copies, which is what
a CPU engine needs and a GPU engine pays once per update.

Run: ``.venv-vllm/bin/python -m pytest -m vllm tests/core/models/test_vllm_engine_full.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

WORKER_EXTENSION = f"{__name__}.WeightSync"
"""The qualified name vLLM imports in each worker process."""


class WeightSync:
    """Methods vLLM adds to its worker class; ``self.model_runner.model`` is the served model."""

    def codea1_load_weights(self, packed: list[tuple[str, str, list[int], bytes]]) -> int:
        """Copy the tensors :func:`pack` wrote into the served model; returns how many were given."""
        runner = self.model_runner  # type: ignore[attr-defined]
        runner.reload_weights(weights_iterator=unpack(packed), is_checkpoint_format=True)
        return len(packed)


def pack(model: Any) -> list[tuple[str, str, list[int], bytes]]:
    """``(checkpoint name, dtype, shape, raw bytes)`` of every tensor of an HF model's state dict.

    Raw bytes, not tensors: vLLM's RPC serialisation passes them through unchanged (a tensor inside a list of
    arguments arrives as a list), and bfloat16 needs no NumPy dtype.
    """
    out = []
    for name, t in model.state_dict().items():
        t = t.detach().to("cpu").contiguous()
        out.append(
            (
                name,
                str(t.dtype).removeprefix("torch."),
                list(t.shape),
                t.view(-1).view(torch.uint8).numpy().tobytes(),
            )
        )
    return out


def unpack(packed: list[tuple[str, str, list[int], bytes]]) -> Iterator[tuple[str, Any]]:
    """``(name, tensor)`` pairs back from :func:`pack`'s records."""
    for name, dtype, shape, raw in packed:
        yield name, torch.frombuffer(bytearray(raw), dtype=getattr(torch, dtype)).reshape(shape)


def push_weights(llm: Any, model: Any) -> int:
    """Load ``model``'s weights into the running engine ``llm`` and drop its prefix cache.

    Args:
        llm: A ``vllm.LLM`` built with ``worker_extension_cls=WORKER_EXTENSION``.
        model: The HF model holding the whole weights (``Policy.whole``).

    Returns:
        The number of tensors sent.
    """
    sent = llm.collective_rpc("codea1_load_weights", args=(pack(model),))
    llm.reset_prefix_cache()
    return int(sent[0])
