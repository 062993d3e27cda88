"""Checkpoint I/O of :class:`codea1_core.models.policy.Policy`: resumable save/load and merged export.

What it does: writes a policy's adapter (LoRA) or weights (full) with its tokenizer under ``model/`` and
the optimizer, scheduler, torch RNG and step state in ``state.pt`` (the same bytes for the same state: the
adapter's module list sorted); every directory is built as ``.<dir>.tmp``
and swapped in whole (:func:`codea1_core.atomic.atomic_dir`), so a crash never leaves a half-written checkpoint.
What it does not: decide when or where to checkpoint (the pipeline's checkpoint task does).

Run: ``pytest tests/core/models/test_policy.py -k save``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch

from codea1_core.atomic import atomic_dir


def sort_adapter_modules(model_dir: Path) -> None:
    """Sort ``adapter_config.json``'s ``target_modules``: peft writes them from a set, in an order that changes
    with each process's string hashing, so the same adapter would be saved as different bytes on every run."""
    path = model_dir / "adapter_config.json"
    if not path.is_file():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def save_policy(pol: Any, path: Path) -> Path:
    """Write ``pol`` to ``path`` atomically (see the module docstring)."""
    gathered = _gathered(pol)
    with atomic_dir(path) as tmp:
        pol.whole.save_pretrained(tmp / "model", state_dict=gathered["model"] or None)
        sort_adapter_modules(tmp / "model")
        pol.tokenizer.save_pretrained(tmp / "model")
        # not Python's global RNG: the method draws nothing from it, libraries do at moments that vary per run
        rng: dict[str, Any] = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        state = {
            "role": pol.role,
            "finetune": pol.cfg.model.finetune,
            "step_count": pol.step_count,
            "optimizer": gathered["optimizer"] or pol.optimizer.state_dict(),
            "scheduler": pol.scheduler.state_dict(),
            "rng": rng,
        }
        torch.save(state, tmp / "state.pt")
    return path


def _gathered(pol: Any) -> dict[str, Any]:
    """What an FSDP2 policy's save writes instead of its shards (``distributed.gather_for_save``, on every rank
    first); ``{"model": {}, "optimizer": {}}`` for an unsharded policy (its own state)."""
    if pol.whole_model is None:
        return {"model": {}, "optimizer": {}}
    if not pol.gathered:
        raise RuntimeError(
            f"policy {pol.role}: FSDP2-sharded and its state not gathered since the last update: call "
            "codea1_core.models.distributed.gather_for_save on every rank first (rank 0 then saves)"
        )
    return pol.gathered


def restore_policy(pol: Any, path: Path) -> None:
    """Restore a :func:`save_policy` checkpoint into ``pol`` (same base model and config)."""
    if not (path / "state.pt").is_file():
        raise FileNotFoundError(f"{path}: not a policy checkpoint (state.pt missing)")
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    if state["finetune"] != pol.cfg.model.finetune:
        raise ValueError(
            f"{path}: saved with finetune={state['finetune']}, policy uses {pol.cfg.model.finetune}"
        )
    if pol.ref_model is None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        weights = load_file(str(path / "model" / "adapter_model.safetensors"), device=str(pol.device))
        result: Any = set_peft_model_state_dict(pol.whole, weights)  # FSDP2: into the copy, then sliced
        if result.unexpected_keys:
            raise ValueError(f"{path}: adapter keys do not match this model: {result.unexpected_keys[:3]}")
        whole = dict(pol.whole.named_parameters())
    else:
        from transformers import AutoModelForCausalLM

        saved = AutoModelForCausalLM.from_pretrained(str(path / "model"), dtype=pol.param_dtype)
        whole = saved.state_dict()
        if pol.whole_model is None:
            pol.model.load_state_dict(whole)
    optimizer = state["optimizer"]
    if pol.whole_model is not None:  # FSDP2: each rank keeps its slice of the single-process state
        from codea1_core.models import distributed

        distributed.load_whole_state(pol, whole)
        optimizer = distributed.shard_optimizer_state(pol, optimizer)
    pol.optimizer.load_state_dict(optimizer)
    pol.scheduler.load_state_dict(state["scheduler"])
    pol.step_count = int(state["step_count"])
    torch.set_rng_state(state["rng"]["torch"])
    if "cuda" in state["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])


def export_policy(pol: Any, path: Path) -> Path:
    """Write a standalone HF model directory (LoRA merged into a copy) + tokenizer to ``path`` atomically."""
    model = copy.deepcopy(pol.whole).merge_and_unload() if pol.ref_model is None else pol.whole
    with atomic_dir(path) as tmp:
        model.save_pretrained(tmp, state_dict=_gathered(pol)["model"] or None)  # FSDP2: the float32 masters
        pol.tokenizer.save_pretrained(tmp)
    return path
