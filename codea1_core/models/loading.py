"""Model loading: the one way a policy for a role is built from a model folder and the config.

What it does: :func:`build_policy` loads a trainable :class:`~codea1_core.models.policy.Policy` and, with
``rollout.backend: vllm``, routes its ``generate`` through vLLM (:func:`codea1_core.models.vllm_engine.attach`).
It is the product's one backend switch: training, evaluation, ``solve`` and ``attack`` all build here.
What it does not: choose which model folder a stage uses (the flows do: ``flows/evaluate.py`` resolves the
evaluated models), or restore a checkpoint into an existing policy (that is ``Policy.load``,
:func:`codea1_core.models.policy_io.restore_policy`; ``Policy.save`` / ``Policy.export`` write them).

Run: ``pytest tests/core/models/test_vllm_engine.py tests/flows/test_eval_backend.py``.
"""

from __future__ import annotations

from typing import Any

from codea1_core.config import Config


def build_policy(
    model_path: str, cfg: Config, role: str, total_steps: int, adapter_dir: str | None = None
) -> Any:
    """A trainable policy for ``role`` from ``model_path``; generation on ``rollout.backend`` (hf | vllm).

    ``total_steps`` sizes the learning-rate schedule; ``adapter_dir`` is where vLLM writes the adapter
    versions it serves (default ``<orchestration.checkpoint_dir>/vllm_adapters``). A model that cannot be
    loaded raises ``OSError`` naming ``model.<role>_path``.
    """
    from codea1_core.models.policy import Policy

    policy: Any = Policy(model_path, cfg, role=role, total_steps=total_steps)  # or the VllmPolicy around it
    if cfg.rollout.backend == "vllm":
        from codea1_core.models import vllm_engine

        policy = vllm_engine.attach(policy, cfg, adapter_dir=adapter_dir)
    return policy
