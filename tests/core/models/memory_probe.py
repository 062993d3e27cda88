"""Measure the CPU memory of one real GRPO step (``Policy.step``) on a small random-init model; prints JSON.

Run in a fresh process by ``tests/core/models/test_memory_plan.py`` (its numbers are compared with
``codea1_core.models.memory_plan``): ``python tests/core/models/memory_probe.py --vocab 32768 --tokens 4096
--finetune full``.
Peak resident memory comes from the kernel (``VmHWM``, reset through ``/proc/self/clear_refs``), so it
counts every allocation torch makes, which ``tracemalloc`` would not see.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {key}")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def main() -> None:
    parser = argparse.ArgumentParser()
    for name, default in (
        ("vocab", 32768),
        ("hidden", 128),
        ("layers", 2),
        ("intermediate", 512),
        ("heads", 4),
        ("tokens", 4096),
        ("samples", 8),
    ):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--finetune", default="full")
    parser.add_argument("--checkpointing", action="store_true")
    a = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from codea1_core.config import Config
    from codea1_core.models.policy import Policy, TrainBatch
    from codea1_core.models.tiny_model import build_tiny_model, random_init_like

    raw = {
        "vocab_size": a.vocab,
        "hidden_size": a.hidden,
        "num_hidden_layers": a.layers,
        "intermediate_size": a.intermediate,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.heads,
        "max_position_embeddings": 4 * a.tokens,
        "tie_word_embeddings": True,
    }
    with tempfile.TemporaryDirectory() as tmp:
        tiny = build_tiny_model(Path(tmp) / "tok", ["def f(x):\n    return x\n"] * 20, vocab_size=300)
        model_dir = random_init_like(raw, Path(tmp) / "model", tokenizer_dir=tiny, dtype="float32")
        cfg = Config().replace(
            **{
                "model.device": "cpu",
                "model.dtype": "float32",
                "model.finetune": a.finetune,
                "model.gradient_checkpointing": a.checkpointing,
                "grpo.mini_batches": 1,
                "grpo.micro_batch_tokens": a.tokens,
            }
        )
        gc.collect()
        rss_start = _status_kib("VmRSS")
        policy = Policy(str(model_dir), cfg, role="code", total_steps=10)
        gc.collect()
        rss_loaded = _status_kib("VmRSS")
        rng = random.Random(0)
        per = a.tokens // a.samples
        prompts = [[rng.randrange(3, a.vocab) for _ in range(16)] for _ in range(a.samples)]
        completions = [[rng.randrange(3, a.vocab) for _ in range(per - 16)] for _ in range(a.samples)]
        batch = TrainBatch(prompts, completions, [(-1.0) ** i for i in range(a.samples)])
        _reset_peak()
        policy.step(batch)
        peak = _status_kib("VmHWM")
    print(
        json.dumps(
            {
                "load_bytes": (rss_loaded - rss_start) * 1024,
                "step_bytes": (peak - rss_loaded) * 1024,
                "config": raw,
            }
        )
    )


if __name__ == "__main__":
    main()
