"""The warm start's tasks: build the tiny base model, fine-tune one role on it (the warmstart flow's steps).

What it does: :func:`build_base` trains the BPE tokenizer on the lab's text and writes a random-init tiny
Qwen2 model (``codea1_core.models.tiny_model``); :func:`sft` fine-tunes a copy into one role (``sft[code]``,
``sft[test]``; ``codea1_core.models.sft``) for :func:`epochs_of` epochs.
What it does not: choose the roles, build the examples or place the folders (``flows/warmstart.py`` does).

Tests: ``pytest tests/tasks/test_warmstart_tasks.py tests/flows/test_warmstart.py``; the task runs in
``tests/flows/test_stage_task_runs.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from codea1_core.config import Config, LabConfig


def epochs_of(lab: LabConfig, role: str) -> int:
    """SFT epochs of ``role``'s warm start: ``lab.warmstart_code_epochs`` for the Code LLM when set."""
    return (lab.warmstart_code_epochs or lab.warmstart_epochs) if role == "code" else lab.warmstart_epochs


@task(name="build_base", cache_policy=NO_CACHE)
def build_base(cfg: Config, out: Path) -> Path:
    """The tiny base model, its tokenizer trained on the lab's corpus (a task run of the warmstart flow)."""
    from codea1_core.data.warmstart_data import tokenizer_corpus
    from codea1_core.models.tiny_model import build_tiny_model

    lab = cfg.lab
    return build_tiny_model(
        out,
        tokenizer_corpus(lab, k=cfg.reward.k),
        hidden_size=lab.hidden_size,
        num_layers=lab.num_layers,
        num_heads=lab.num_heads,
        intermediate_size=lab.intermediate_size,
        vocab_size=lab.vocab_size,
        max_position_embeddings=lab.max_position_embeddings,
        seed=cfg.seed,
    )


@task(name="sft", task_run_name="sft[{role}]", cache_policy=NO_CACHE)
def sft(cfg: Config, role: str, base: Path, examples: list, out: Path) -> dict[str, Any]:
    """One role's supervised fine-tuning from the base model (a task run of the warmstart flow)."""
    from codea1_core.models.sft import supervised_finetune

    lab = cfg.lab
    return supervised_finetune(
        base,
        examples,
        out,
        epochs=epochs_of(lab, role),
        lr=lab.warmstart_lr,
        seed=cfg.seed,
        batch_size=lab.warmstart_batch_size,
        max_length=lab.max_position_embeddings,
    )
