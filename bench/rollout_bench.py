"""Rollout throughput at the training step's real shapes: HF ``generate`` vs the fast decode, side by side.

What it does: builds the lab's model (the ``lab`` section's shape and tokenizer corpus, random init; or the
warm-started ``outputs/warmstart/{code,test}`` when present, where completions stop at EOS like in training)
and samples, through the real :class:`codea1_core.models.policy.Policy`, the two rollouts of one training step:

* code rollout: ``data.train_batch_size`` lab problems x ``rollout.n_code`` samples, ``max_new_tokens_code``;
* test rollout: B x M white-box test prompts x ``rollout.n_tests`` samples, ``max_new_tokens_test``.

Each shape runs on the old path (``Policy.fast_generate = False``: HF ``generate``) and the new one
(:mod:`codea1_core.models.fast_generate`) in A/B/B/A order with the same seeds, checks that both sampled exactly the
same completions, and prints tokens/s, the ratio, and the load average before and after (the machine may be
shared: read the ratio, measured in the same run, rather than the absolute numbers).

``--large`` adds a random-init model with Qwen2.5-Coder-1.5B's width, heads and vocabulary but only
``--large-layers`` layers (2 by default: the full 28 do not fit a 3-minute run on 2 cores), bfloat16, at a
small shape; it checks the fast path on a GQA model with a 152k vocabulary.

Run: ``python bench/rollout_bench.py [--params params.yaml] [--repeats 2] [--large]``
(``OMP_NUM_THREADS`` sets torch's intra-op threads; the default is torch's).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from codea1_core.config import Config, load_config  # noqa: E402
from codea1_core.models.policy import Policy, SamplingParams  # noqa: E402


def _lab_model(cfg: Config, work: Path, role: str) -> str:
    """The warm-started role model when there is one, else a random-init model of the lab's shape."""
    warm = Path(cfg.model.code_path if role == "code" else cfg.model.test_path)
    if (warm / "config.json").is_file():
        return str(warm)
    target = work / "lab"
    if not (target / "config.json").is_file():
        from codea1_core.data.lab import tokenizer_corpus
        from codea1_core.models.tiny_model import build_tiny_model

        lab = cfg.lab
        build_tiny_model(target, tokenizer_corpus(lab), hidden_size=lab.hidden_size, num_layers=lab.num_layers,
                         num_heads=lab.num_heads, intermediate_size=lab.intermediate_size,
                         vocab_size=lab.vocab_size, seed=0)  # fmt: skip
    return str(target)


def _step_prompts(cfg: Config) -> tuple[list, list]:
    """One training step's prompts: B code prompts and B x M white-box test prompts (lab problems)."""
    from codea1_core.data.lab import buggy_variants, lab_problems
    from codea1_core.method.prompts import code_messages, test_messages

    problems = lab_problems(cfg.lab, "train")[: cfg.data.train_batch_size]
    code_prompts = [code_messages(p) for p in problems]
    test_prompts = []
    for p in problems:
        codes = [p.reference_solution, *buggy_variants(p)]
        test_prompts += [
            test_messages(p, codes[m % len(codes)], cfg.reward.k) for m in range(cfg.rollout.n_code)
        ]
    return code_prompts, test_prompts


def _run(policy: Policy, prompts: list, n: int, sp: SamplingParams, fast: bool) -> tuple[float, int, list]:
    policy.fast_generate = fast
    t0 = time.perf_counter()
    out = policy.generate(prompts, n, sp)
    seconds = time.perf_counter() - t0
    return seconds, sum(len(c.token_ids) for group in out for c in group), out


def compare(name: str, policy: Policy, prompts: list, n: int, sp: SamplingParams, repeats: int) -> None:
    """A/B/B/A runs of one shape; prints tokens/s of both paths, the ratio and whether outputs were identical."""
    policy.generate(prompts[:1], 1, SamplingParams(max_new_tokens=2))  # warm-up
    seconds = {False: 0.0, True: 0.0}
    tokens = {False: 0, True: 0}
    outputs: dict[bool, list] = {}
    order = [False, True, True, False] * repeats
    for fast in order[: 2 * repeats]:
        s, t, out = _run(policy, prompts, n, sp, fast)
        seconds[fast] += s
        tokens[fast] += t
        outputs.setdefault(fast, out)
    old, new = tokens[False] / seconds[False], tokens[True] / seconds[True]
    same = "yes" if outputs[False] == outputs[True] else "NO"
    rows = len(prompts) * n
    shape = f"{rows} x {sp.max_new_tokens}"
    print(f"{name:<16}{shape:>10}{old:>14.0f}{new:>14.0f}{new / old:>8.2f}x{seconds[False] / repeats:>9.2f}"
          f"{seconds[True] / repeats:>9.2f}{same:>11}", flush=True)  # fmt: skip


def _load() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--params", default="params.yaml", help="params file (default shapes: its train step)"
    )
    parser.add_argument("--repeats", type=int, default=2, help="A/B pairs per shape (run in A,B,B,A order)")
    parser.add_argument("--large", action="store_true", help="also the 1.5B-width model (few layers)")
    parser.add_argument("--large-layers", type=int, default=2, help="layers of the 1.5B-width model")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats: must be >= 1")
    cfg = load_config(args.params) if Path(args.params).is_file() else Config()
    cfg = cfg.replace(**{"model.device": "cpu", "model.dtype": "float32", "model.finetune": "full"})
    r = cfg.rollout
    t_start = time.perf_counter()
    print(f"rollout bench: torch {torch.__version__}, {torch.get_num_threads()} intra-op threads, "
          f"{os.cpu_count()} CPUs, load average {_load()}", flush=True)  # fmt: skip
    print(f"{'rollout':<16}{'rows x new':>10}{'old tok/s':>14}{'new tok/s':>14}{'ratio':>9}{'old s':>9}"
          f"{'new s':>9}{'identical':>11}", flush=True)  # fmt: skip
    code_prompts, test_prompts = _step_prompts(cfg)
    with tempfile.TemporaryDirectory(prefix="codea1-rollout-bench-") as tmp:
        work = Path(tmp)
        model_dir = ""
        for role, prompts, n, new in (
            ("code", code_prompts, r.n_code, r.max_new_tokens_code),
            ("test", test_prompts, r.n_tests, r.max_new_tokens_test),
        ):
            model_dir = _lab_model(cfg, work, role)
            policy = Policy(model_dir, cfg, role=role)
            sp = SamplingParams(
                temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=new, seed=1
            )
            compare(f"lab {role}", policy, prompts, n, sp, args.repeats)
            del policy
        if args.large:
            _large(work, model_dir, args.large_layers, args.repeats)
    print(f"load average after {_load()}; bench wall {time.perf_counter() - t_start:.0f} s", flush=True)


def _large(work: Path, tokenizer_dir: str, layers: int, repeats: int) -> None:
    """The 1.5B model's width/heads/vocab with ``layers`` layers, bfloat16, 4 prompts x 2 x 16 tokens."""
    from codea1_core.models.tiny_model import QWEN25_CODER_1P5B_CONFIG, random_init_like

    shape = {**QWEN25_CODER_1P5B_CONFIG, "num_hidden_layers": layers}
    model_dir = random_init_like(shape, work / "large", tokenizer_dir=tokenizer_dir, dtype="bfloat16")
    cfg = Config().replace(**{"model.device": "cpu", "model.dtype": "bfloat16", "model.finetune": "full"})
    policy = Policy(str(model_dir), cfg, role="code")
    prompts = [
        [{"role": "user", "content": f"Write a function f{i}(x) that returns x plus {i}."}] for i in range(4)
    ]
    compare(f"1.5b-width {layers}L", policy, prompts, 2, SamplingParams(max_new_tokens=16, seed=1), repeats)


if __name__ == "__main__":
    main()
