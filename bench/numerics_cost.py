"""What the reproducible numerics mode costs: the lab model's training step and decode, pinned vs native kernels.

What it does: runs the same work in fresh processes (the kernel levels are fixed at a process's first kernel),
alternating ``model.cpu_numerics: reproducible`` (MKL ``COMPATIBLE``, ATen ``avx2``: ``flows/environment.py``)
and ``native`` (what this CPU picks), ``--repeats`` times each in A/B/B/A order: three AdamW training steps of
the lab's model shape (random init, 16 rows x 160 tokens, ``model.cpu_threads`` threads) and one shared decode
(32 prompts x 4 samples x 64 tokens, in one process for both modes: the CPU columns count this process only).
It prints process CPU seconds per part (less sensitive than wall time to other jobs on a shared machine), the
median ratio pinned / native, and digests of the weights and log-probs, which differ between the modes (other
kernels, other rounding) and must agree between repeats of one mode.

What it does not: measure ``make run`` (see README for the A/B of the whole pipeline), or the cost on an
AVX-512 CPU (where ``native`` would also take ATen's avx512 kernels).

Run: ``python bench/numerics_cost.py [--repeats 2]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import flows  # noqa: F401  (first: the process defaults, before torch loads)
from codea1_core.config import load_config
from flows.environment import NUMERICS_ENV, NUMERICS_SET_VAR, REPRODUCIBLE_NUMERICS

ROOT = Path(__file__).resolve().parents[1]


def work() -> dict:
    """One process's measurement (the mode is the environment's); a JSON-able dict."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from codea1_core.models import cpu_numerics
    from codea1_core.models.cpu_decode import engine

    cfg = load_config(str(ROOT / "params.yaml"), [])
    lab = cfg.lab
    torch.set_num_threads(cfg.model.cpu_threads or torch.get_num_threads())
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            hidden_size=lab.hidden_size,
            num_hidden_layers=lab.num_layers,
            num_attention_heads=lab.num_heads,
            num_key_value_heads=lab.num_heads,
            intermediate_size=lab.intermediate_size,
            vocab_size=lab.vocab_size,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=0,
        )
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, lab.vocab_size, (16, 160), generator=gen)
    start = time.process_time()
    for _ in range(3):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    train_s = time.process_time() - start
    model.eval()
    prompts = torch.randint(3, lab.vocab_size, (32, 40), generator=gen)
    torch.manual_seed(3)
    start = time.process_time()
    with torch.no_grad():
        out = engine.sample(
            model,
            prompts,
            torch.ones_like(prompts),
            n=4,
            max_new_tokens=64,
            eos_ids=[1],
            pad_id=0,
            do_sample=True,
            share_prompt=True,
        )
    decode_s = time.process_time() - start
    weights = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    return {
        "train_s": train_s,
        "decode_s": decode_s,
        "weights": weights[:12],
        "logprobs": hashlib.sha256(out.logprobs.numpy().tobytes()).hexdigest()[:12],
        "mkl_cbwr": cpu_numerics.mkl_cbwr_branch(),
        "aten": torch.backends.cpu.get_cpu_capability(),
    }


def run_one(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (*REPRODUCIBLE_NUMERICS, NUMERICS_SET_VAR)}
    env |= {NUMERICS_ENV: mode, "CODEA1_DECODE_PROCESSES": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, __file__, "--child"], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(work()))
        return
    order = [m for _ in range(args.repeats) for m in ("reproducible", "native", "native", "reproducible")]
    order = order[: 2 * args.repeats]
    results: dict[str, list[dict]] = {"reproducible": [], "native": []}
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    for mode in order:
        r = run_one(mode)
        results[mode].append(r)
        print(
            f"{mode:13s} MKL {r['mkl_cbwr']:10s} ATen {r['aten']:7s} train {r['train_s']:6.2f} s  "
            f"decode {r['decode_s']:5.2f} s  weights {r['weights']}  log-probs {r['logprobs']}"
        )
    for part in ("train_s", "decode_s"):
        pinned = statistics.median(r[part] for r in results["reproducible"])
        native = statistics.median(r[part] for r in results["native"])
        print(
            f"{part[:-2]:7s} pinned / native (median CPU s): {pinned:.2f} / {native:.2f} = {pinned / native:.2f}x"
        )
    for mode, rs in results.items():
        print(f"{mode}: repeats agree bit for bit: {len({(r['weights'], r['logprobs']) for r in rs}) == 1}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
