"""Supervised fine-tuning (warm starts, user data) with TRL 1.x ``SFTTrainer``, loss on the answer only.

What it does: takes conversational examples ``{"messages": [system?, user, {"role": "assistant", ...}]}``,
turns each into TRL's prompt-completion form (prompt = every message before the final assistant message,
completion = that message), so TRL masks the prompt and trains on the completion only (its end-of-turn
token included, so the model learns to stop). Models with a chat template get conversational
prompt-completion data; models without one get ``prompts.render_plain`` text with the EOS token appended.
Full fine-tuning, CPU-friendly (float32 on CPU, no reporting); the result is a complete HF model directory
written atomically to ``out_dir``. Feedback on long runs: one log line per epoch (mean loss, steps, elapsed,
ETA) on the ``codea1.sft`` logger, and a progress bar over the steps when stderr is a terminal.

What it does not: LoRA, packing, evaluation. The lab warm start (``lab.py``) and users call it directly.

Run: ``pytest tests/core/models/test_sft.py``.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any, cast

log = logging.getLogger("codea1.sft")


def progress_callback(label: str) -> Any:
    """A TrainerCallback: a step bar (terminal only) and one ``epoch e/E  loss x  step s/S  t  ETA`` line."""
    import sys

    from tqdm.auto import tqdm
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.perf_counter()
            self.bar = tqdm(
                total=state.max_steps, desc=f"sft {label}", disable=not sys.stderr.isatty(), leave=False
            )

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.bar.update(1)

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any) -> None:
            if not logs or "loss" not in logs:
                return
            spent = time.perf_counter() - self.t0
            left = spent / max(state.global_step, 1) * (state.max_steps - state.global_step)
            epochs = int(round(args.num_train_epochs))
            log.info(
                "sft %s: epoch %d/%d  loss %.4f  step %d/%d  %.0f s  ETA %.0f s",
                label,
                round(state.epoch or 0),
                epochs,
                logs["loss"],
                state.global_step,
                state.max_steps,
                spent,
                left,
            )

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.bar.close()

    return Progress()


def _checkpointing_kwargs(config_cls: type) -> dict[str, Any]:
    """TRL's default (checkpointing on) under the name the installed transformers wants.

    transformers 5 renamed ``gradient_checkpointing`` to ``activation_checkpointing`` and warns on every run
    that reaches it through the old name (TRL's ``SFTConfig`` default does); older releases know only the old one.
    """
    import dataclasses

    names = {f.name for f in dataclasses.fields(config_cls)}
    return (
        {"activation_checkpointing": True}
        if "activation_checkpointing" in names
        else {"gradient_checkpointing": True}
    )


def _to_prompt_completion(examples: list[dict], tokenizer: Any) -> list[dict]:
    """Validate examples and convert them to TRL prompt-completion rows (conversational or plain)."""
    from codea1_core.method.prompts import render_plain

    rows: list[dict[str, Any]] = []
    use_template = bool(getattr(tokenizer, "chat_template", None))
    for i, ex in enumerate(examples):
        msgs = ex.get("messages") if isinstance(ex, dict) else None
        if not isinstance(msgs, list) or len(msgs) < 2:
            raise ValueError(f"examples[{i}]: expected {{'messages': [..., {{'role': 'assistant', ...}}]}}")
        for j, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
                raise ValueError(f"examples[{i}].messages[{j}]: role must be system, user or assistant")
            if not isinstance(m.get("content"), str):
                raise ValueError(f"examples[{i}].messages[{j}].content: expected str")
        if msgs[-1]["role"] != "assistant" or not msgs[-1]["content"]:
            raise ValueError(f"examples[{i}]: the last message must be a non-empty assistant answer")
        prompt, answer = [dict(role=m["role"], content=m["content"]) for m in msgs[:-1]], msgs[-1]["content"]
        if use_template:
            rows.append({"prompt": prompt, "completion": [{"role": "assistant", "content": answer}]})
        else:
            rows.append({"prompt": render_plain(prompt), "completion": answer + (tokenizer.eos_token or "")})
    return rows


def supervised_finetune(
    model_dir: str | Path,
    examples: list[dict],
    out_dir: str | Path,
    *,
    epochs: float,
    lr: float,
    seed: int,
    batch_size: int = 8,
    max_length: int = 512,
) -> dict[str, float]:
    """Fine-tune all weights of ``model_dir`` on ``examples`` and save the model + tokenizer to ``out_dir``.

    Args:
        model_dir: An HF causal LM directory (or hub id).
        examples: Conversational examples; the final message is the assistant answer trained on.
        out_dir: Target directory, replaced atomically (written to ``.<out_dir>.tmp`` first).
        epochs: Training epochs.
        lr: Peak learning rate (linear decay, no warm-up).
        seed: Seed of initialisation-independent randomness (data order, dropout).
        batch_size: Examples per optimizer step.
        max_length: Truncation length of prompt + completion, in tokens.

    Returns:
        ``{"train_loss": mean training loss, "runtime_s": wall seconds, "examples": count, "steps": optimizer steps}``.

    Raises:
        ValueError: A malformed example (its index and field are named).
    """
    import datasets
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import SFTConfig, SFTTrainer

    from codea1_core.atomic import atomic_dir
    from codea1_core.models.policy_io import sort_adapter_modules

    if not examples:
        raise ValueError("examples: empty, nothing to fine-tune on")
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    dataset = Dataset.from_list(_to_prompt_completion(examples, tokenizer))
    cuda = torch.cuda.is_available()
    # float32 master weights; on CUDA the Trainer autocasts to bf16 (bf16 weights would make AdamW lossy).
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory(prefix="codea1-sft-") as work:
        args = SFTConfig(
            output_dir=work,
            num_train_epochs=epochs,
            learning_rate=lr,
            per_device_train_batch_size=batch_size,
            max_length=max_length,
            completion_only_loss=True,
            seed=seed,
            data_seed=seed,
            bf16=cuda,
            use_cpu=not cuda,
            report_to="none",
            disable_tqdm=True,  # our own bar and epoch lines (progress_callback), not the Trainer's log dicts
            logging_strategy="epoch",
            save_strategy="no",
            lr_scheduler_type="linear",
            warmup_steps=0,
            dataloader_num_workers=0,
            dataset_num_proc=None,
            **_checkpointing_kwargs(SFTConfig),
        )
        bars_were_off = datasets.is_progress_bar_enabled() is False
        datasets.disable_progress_bars()
        try:
            trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
            trainer.remove_callback(PrinterCallback)  # it prints every log dict to stdout
            trainer.add_callback(progress_callback(Path(out_dir).name))
            result = trainer.train()
        finally:
            if not bars_were_off:
                datasets.enable_progress_bars()
        with atomic_dir(out_dir) as tmp:
            cast(Any, trainer.model).save_pretrained(tmp)  # the trained model (peft-wrapped for LoRA)
            sort_adapter_modules(tmp)
            tokenizer.padding_side = "left"
            tokenizer.save_pretrained(tmp)
    metrics = {
        "train_loss": float(result.training_loss),
        "runtime_s": time.perf_counter() - t0,
        "examples": float(len(examples)),
        "steps": float(result.global_step),
    }
    log.info("sft %s -> %s: %s", model_dir, out_dir, metrics)
    return metrics
