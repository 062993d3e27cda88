"""Rollout throughput: batched ``Policy.generate`` vs one prompt at a time, tokens per second, side by side.

Models (all random-init, built locally, nothing downloaded):

* ``tiny``: the CPU lab's tiny Qwen2 (hidden 128, 2 layers, BPE vocab ~2k);
* ``qwen2.5-coder-1.5b-shape``: a random-init model with Qwen2.5-Coder-1.5B's config (1536 x 28 layers,
  vocab 151,936), bfloat16 by default, sharing the tiny tokenizer (its ids fit the vocabulary). About 3.5 GB
  of RAM; slow on CPUs without bf16 matrix units (``--large-dtype float32`` is faster but needs ~7 GB).

Both go through the real :class:`codea1_core.policy.Policy` (chat template, LoRA wrapper, left padding,
raw log-prob recording). Short sequences, so the numbers are CPU-feasible; on a GPU the gap is larger.

Run: ``OMP_NUM_THREADS=2 python bench/rollout_bench.py`` (``--skip-large`` for the tiny model only;
``--prompts 8 --n 2 --new-tokens 16`` to change the load).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from codea1_core.config import Config
from codea1_core.policy import Policy, SamplingParams
from codea1_core.tiny_model import build_tiny_model, random_init_like

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "assert add(1, 2) == 3\n",
    "Write a Python function that returns the sum of two numbers.",
    "You are a helpful assistant. Write tests for the function below.",
] * 50


def _prompts(count: int) -> list[list[dict]]:
    return [
        [
            {"role": "system", "content": "You are a careful Python programmer."},
            {"role": "user", "content": f"Write a function f{i}(x) that returns x plus {i}. " * (1 + i % 3)},
        ]
        for i in range(count)
    ]


def measure(model_dir: Path, dtype: str, prompts: int, n: int, new_tokens: int) -> tuple[float, float]:
    """Tokens/s of (one prompt per generate call, all prompts in one batched call)."""
    results = []
    for batch_size in (1, prompts):
        cfg = Config().replace(
            **{"model.device": "cpu", "model.dtype": dtype, "rollout.batch_size": batch_size, "seed": 0}
        )
        policy = Policy(str(model_dir), cfg, role="code")
        sampling = SamplingParams(max_new_tokens=new_tokens, seed=0)
        policy.generate(_prompts(1), 1, SamplingParams(max_new_tokens=2))  # warm-up
        t0 = time.perf_counter()
        outs = policy.generate(_prompts(prompts), n, sampling)
        seconds = time.perf_counter() - t0
        tokens = sum(len(c.token_ids) for group in outs for c in group)
        results.append(tokens / seconds)
        del policy
    return results[0], results[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8, help="prompts per run")
    parser.add_argument("--n", type=int, default=2, help="samples per prompt")
    parser.add_argument("--new-tokens", type=int, default=16, help="max new tokens per sample")
    parser.add_argument("--skip-large", action="store_true", help="tiny model only")
    parser.add_argument(
        "--large-dtype", default="bfloat16", help="dtype of the 1.5B-shape model (float32: ~7 GB RAM)"
    )
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))

    print(
        f"rollout bench: {args.prompts} prompts x n={args.n}, {args.new_tokens} new tokens, CPU", flush=True
    )
    print(f"{'model':<28}{'one-at-a-time tok/s':>22}{'batched tok/s':>16}{'speed-up':>10}", flush=True)

    def row(name: str, single: float, batched: float) -> None:
        print(f"{name:<28}{single:>22.1f}{batched:>16.1f}{batched / single:>9.1f}x", flush=True)

    with tempfile.TemporaryDirectory(prefix="codea1-rollout-bench-") as work:
        tiny = build_tiny_model(Path(work) / "tiny", CORPUS)
        row("tiny", *measure(tiny, "float32", args.prompts, args.n, args.new_tokens))
        if args.skip_large:
            return
        large = random_init_like(
            "Qwen/Qwen2.5-Coder-1.5B-Instruct",
            Path(work) / "large",
            tokenizer_dir=tiny,
            dtype=args.large_dtype,
        )
        row(
            "qwen2.5-coder-1.5b-shape",
            *measure(large, args.large_dtype, args.prompts, args.n, args.new_tokens),
        )


if __name__ == "__main__":
    main()
