"""What both CPU decoders start from and return: ``generate``'s prefill and the sampled tokens.

What it does: :func:`prefill` runs the model's own forward over the prompts as ``generate`` does (its
positions, its cache, last-position logits only); :class:`Sampled` holds a decode's new tokens and their
log-probs. Used by :mod:`codea1_core.models.cpu_decode.exact` and :mod:`codea1_core.models.cpu_decode.shared`.

What it does not: decode (the decoders do), or choose a decoder (:mod:`codea1_core.models.cpu_decode.engine`).
Tested through ``tests/core/models/cpu_decode/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Sampled:
    """New tokens ``[rows, steps]`` (pad after a row's stop, as ``generate`` returns them) and their log-probs.

    ``logprobs[r, t]`` is log-softmax of the raw logits at step t, taken at ``tokens[r, t]``.
    """

    tokens: torch.Tensor
    logprobs: torch.Tensor


def prefill(base: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple:
    """``generate``'s prefill: the model's forward with its positions and last-position logits only.

    The exact decoder prefills every row, the ``n`` copies of a prompt included: prefilling a prompt once and
    repeating its keys/values is NOT bit-identical (a GEMM's rounding can depend on a row's place in the batch).
    Returns (float32 logits ``[rows, vocab]``, HF cache, last positions ``[rows, 1]``).
    """
    # generate's positions count real tokens only (left padding at 0)
    positions = attention_mask.long().cumsum(-1) - 1
    positions = positions.masked_fill(attention_mask == 0, 0)
    out = base(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=1,
        return_dict=True,
    )
    return out.logits[:, -1].to(copy=True, dtype=torch.float32), out.cache, positions[:, -1:]
