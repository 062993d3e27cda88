"""The CPU decoder: HF ``generate`` for small Qwen2 decoders on the CPU, behind one function, :func:`generate`.

* :mod:`~codea1_core.models.cpu_decode.engine`: the entry point (what :func:`generate` runs): which models,
which decoder;
* :mod:`~codea1_core.models.cpu_decode.exact`: the exact decoder (``generate``'s tokens bit for bit);
* :mod:`~codea1_core.models.cpu_decode.shared`: the shared-prompt decoder (one key/value copy per prompt);
* :mod:`~codea1_core.models.cpu_decode.prefill`: ``generate``'s prefill and the result type both decoders share;
* :mod:`~codea1_core.models.cpu_decode.forward`: the hand-written decode step (HF's Qwen2 ops in HF's order);
* :mod:`~codea1_core.models.cpu_decode.workers`: warm forked worker processes that decode part of the prompts.

:class:`~codea1_core.models.policy.Policy` asks :func:`unsupported_reason` first and calls HF ``generate`` when it
gives a reason. Run: ``pytest tests/core/models/cpu_decode``.
"""

from __future__ import annotations

from typing import Any

from codea1_core.models.cpu_decode import engine
from codea1_core.models.cpu_decode.engine import unsupported_reason
from codea1_core.models.cpu_decode.prefill import Sampled
from codea1_core.models.cpu_decode.shared import SPLIT_ENV

__all__ = ["SPLIT_ENV", "Sampled", "generate", "unsupported_reason"]


def generate(*args: Any, **kwargs: Any) -> Sampled:
    """Sample ``n`` continuations of each prompt: :func:`codea1_core.models.cpu_decode.engine.sample` (looked up at
    call time, so a test that replaces ``engine.sample`` sees every call)."""
    return engine.sample(*args, **kwargs)
