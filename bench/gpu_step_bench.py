"""GPU step benchmark: the real Code-A1 core path on a random-init Qwen2.5-Coder-1.5B-shaped model, per phase.

What it measures, for ``--steps`` training steps on one device with the HF backend (vLLM's wheel is too large
to carry to a lent GPU machine): code rollouts (B problems x M), white-box test rollouts (B x M x N), test
parsing and planning, two-phase sandbox execution, rewards, the Mistake Book update, and both GRPO updates
with LoRA; then one full fine-tuning step (bf16 compute over float32 master weights). Per phase it prints
seconds, tokens/s (generated tokens for rollouts, trained tokens for updates) and peak memory (GPU:
``torch.cuda.max_memory_allocated``; CPU: the kernel's peak RSS above the process start), and beside the
update peaks the prediction of :mod:`codea1_core.models.memory_plan` (without its fixed CUDA-runtime allowance, as
``max_memory_allocated`` excludes the CUDA context).

The model: the architecture of ``configs/qwen2.5-coder-1.5b.config.json`` (nothing downloaded), random
weights, the project's tiny BPE tokenizer (its ids fit the 151,936-token vocabulary; special-token ids are
the tokenizer's). ``--shrink`` swaps in a tiny width/depth (CPU test, ``tests/bench/test_gpu_step_bench.py``).

Imports only torch, transformers, peft, ``codea1_core`` and ``sandbox`` (the GPU image has no prefect,
mlflow, dvc, GX or PyYAML); Python 3.12 with the image's torch/transformers.

Run: ``python bench/gpu_step_bench.py`` (GPU, full size) or ``python bench/gpu_step_bench.py --shrink
--device cpu`` (seconds on CPU). ``--json FILE`` also writes the measurements. ``--nproc N`` re-executes it
under ``torchrun --nproc-per-node N`` (one rank per GPU; gloo on CPU): each rank rolls out and scores its
shard of the B problems, the LoRA updates are reduced with DDP and the full fine-tuning step is sharded with
FSDP2 (``codea1_core.models.distributed``); rank 0 prints its own phases (per-rank seconds and peaks).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from codea1_core.atomic import write_text_atomic  # noqa: E402
from codea1_core.config import Config  # noqa: E402

QWEN_CONFIG = ROOT / "configs" / "qwen2.5-coder-1.5b.config.json"
SHRUNK = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 4096,
}
GIB = 1024**3


# ---------------------------------------------------------------------------------------------- memory


class Meter:
    """Peak memory of one phase: CUDA allocator peak, or the kernel's peak RSS (``VmHWM``) on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.base_kib = _status_kib("VmRSS") if not self.cuda else 0

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        elif Path("/proc/self/clear_refs").exists():
            Path("/proc/self/clear_refs").write_text("5")

    def peak_gib(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() / GIB
        return max(0, _status_kib("VmHWM") - self.base_kib) / 2**20


def _status_kib(key: str) -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


# ---------------------------------------------------------------------------------------------- set-up


def bench_config(args: argparse.Namespace, finetune: str, device: str) -> Config:
    """A run config built from a dict (``Config.replace`` needs PyYAML, which the GPU image may lack)."""
    return Config.from_dict(
        {
            "mode": "codea1",
            "model": {
                "finetune": finetune,
                "dtype": "bfloat16" if device.startswith("cuda") else "float32",
                "device": device,
                "gradient_checkpointing": True,
            },
            "rollout": {
                "backend": "hf",
                "n_code": args.n_code,
                "n_tests": args.n_tests,
                "max_new_tokens_code": args.new_tokens,
                "max_new_tokens_test": args.new_tokens,
                "batch_size": args.rollout_batch,
            },
            "grpo": {
                "lr": 1.0e-6 if finetune == "full" else 1.0e-5,
                "micro_batch_tokens": args.micro_batch_tokens,
                "warmup_steps": 1,
            },
            "reward": {"k": 8},
            "sandbox": {"workers": args.workers},
            "mistake_book": {"enabled": True},
        },
        source="gpu_step_bench",
    )


def build_model(work: Path, shrink: bool, lab_cfg: Any) -> tuple[Path, dict]:
    """Tiny tokenizer + a random-init model with the Qwen2.5-Coder-1.5B architecture (or the shrunken one)."""
    from codea1_core.data.warmstart_data import tokenizer_corpus
    from codea1_core.models.tiny_model import build_tiny_model, random_init_like

    tiny = build_tiny_model(
        work / "tokenizer",
        tokenizer_corpus(lab_cfg),
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        intermediate_size=32,
    )
    raw = json.loads(QWEN_CONFIG.read_text(encoding="utf-8"))
    if shrink:
        raw.update(SHRUNK)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny))
    eos, pad = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    raw.update(bos_token_id=pad, eos_token_id=eos, pad_token_id=pad)
    dtype = "bfloat16" if not shrink else "float32"
    return random_init_like(raw, work / "model", tokenizer_dir=tiny, dtype=dtype), raw


# ---------------------------------------------------------------------------------------------- one step


def rollout_and_score(state: dict, it: int) -> tuple[Any, Any]:
    """Code rollouts .. Mistake Book (docs/method.md §3 steps 2-10); returns (code GroupBatch, test GroupBatch)."""
    from codea1_core.method import batches
    from codea1_core.method.outcomes import plan_problem
    from codea1_core.method.parsing import extract_code, extract_tests
    from codea1_core.method.prompts import code_messages, test_messages
    from codea1_core.method.rewards import score_problem
    from codea1_core.models.sampling import sampling_params

    cfg, problems, phase = state["cfg"], state["problems"], state["phase"]
    r = cfg.rollout
    sp = sampling_params(cfg, "rollout", "code", batches.iteration_seed(cfg.seed, it, "code"))
    with phase("rollout_code") as rec:
        code_out = state["code"].generate([code_messages(p) for p in problems], r.n_code, sp)
        rec["tokens"] = sum(len(c.token_ids) for g in code_out for c in g)
    codes = [[extract_code(c.text) for c in g] for g in code_out]
    sp_t = sampling_params(cfg, "rollout", "test", batches.iteration_seed(cfg.seed, it, "test"))
    with phase("rollout_tests") as rec:
        prompts = [
            test_messages(p, c, cfg.reward.k) for p, row in zip(problems, codes, strict=True) for c in row
        ]
        flat = state["test"].generate(prompts, r.n_tests, sp_t)
        rec["tokens"] = sum(len(c.token_ids) for g in flat for c in g)
    test_out = [flat[b * r.n_code : (b + 1) * r.n_code] for b in range(len(problems))]
    with phase("parse_plan"):
        suites = [
            [
                [extract_tests(c.text, p.entry_point, cfg.tests.parse_mode) for c in per_code]
                for per_code in row
            ]
            for p, row in zip(problems, test_out, strict=True)
        ]
        replay = [list(state["book"].retrieve(p.id, cfg.mistake_book.top_k)) for p in problems]
        plans = [plan_problem(*a) for a in zip(problems, codes, suites, replay, strict=True)]
    with phase("sandbox") as rec:
        matrices = execute(state["executor"], plans, cfg)
        rec["programs"] = len(plans) * (1 + r.n_code)
    with phase("rewards"):
        scores = [score_problem(m, cfg.reward) for m in matrices]
    with phase("mistake_book") as rec:
        for m in matrices:
            if not getattr(m, "problem_infra", False):
                state["book"].update(m.problem_id, m.failed_tests(), m.passed_replay(), it)
        rec["size"] = state["book"].size()
    groups, _ = batches.test_groups(test_out, scores, cfg.grpo.update_n)
    return (
        batches.build_group_batch(batches.code_groups(code_out, scores), cfg.grpo),
        batches.build_group_batch(groups, cfg.grpo),
    )


def execute(executor: Any, plans: list[Any], cfg: Config) -> list[Any]:
    """Two-phase execution as ``tasks/execute.py`` does it (reference jobs, then every candidate job)."""
    s = cfg.sandbox
    refs = executor.run_many([p.reference_job() for p in plans])
    cand_jobs = [p.candidate_jobs(ref) for p, ref in zip(plans, refs, strict=True)]
    flat = executor.run_many([j for jobs in cand_jobs for j in jobs])
    out, i = [], 0
    for plan, ref, jobs in zip(plans, refs, cand_jobs, strict=True):
        out.append(plan.assemble(ref, flat[i : i + len(jobs)], s.float_rel_tol, s.float_abs_tol))
        i += len(jobs)
    return out


def train_step(state: dict, name: str, policy: Any, batch: Any) -> dict[str, float]:
    """One GRPO update of ``policy`` on a GroupBatch (what ``tasks/update.py`` does), as a timed phase."""
    from codea1_core.models.policy import TrainBatch

    with state["phase"](name) as rec:
        flags = batch.in_zero_variance_group or None
        metrics = policy.step(
            TrainBatch(batch.prompt_ids, batch.completion_ids, batch.advantages, None, flags)
        )
        rec["tokens"] = int(metrics["tokens"])
        rec["micro_tokens"] = max_micro_tokens(policy, batch)
    return metrics


def max_micro_tokens(policy: Any, batch: Any) -> int:
    """Padded tokens of the largest micro-batch the policy formed (what the memory plan's activations scale with)."""
    from codea1_core.models.policy import TrainBatch

    tb = TrainBatch(batch.prompt_ids, batch.completion_ids, batch.advantages)
    idx = [i for i, c in enumerate(tb.completion_ids) if c]
    sizes = [
        len(mb) * max(len(tb.prompt_ids[i]) + len(tb.completion_ids[i]) for i in mb)
        for mb in policy._micro_batches(idx, tb)
    ]
    return max(sizes, default=0)


# ---------------------------------------------------------------------------------------------- report


def predicted_gib(cfg: Config, raw: dict, tokens: int, single_policy: bool, on_gpu: bool) -> float:
    """The memory plan's peak for this run's largest micro-batch, without the fixed CUDA-runtime allowance."""
    from codea1_core.models.memory_plan import ModelShape, estimate

    d = cfg.to_dict()
    d["grpo"]["micro_batch_tokens"] = max(1, tokens)
    d["mode"] = "golden" if single_policy else cfg.mode
    plan = estimate(Config.from_dict(d), ModelShape.from_hf_config(raw), 141.0, on_gpu=on_gpu)
    return (plan.total - plan.parts.get("runtime", 0.0) - plan.parts.get("vllm", 0.0)) / GIB


def print_table(rows: list[dict], header: str) -> None:
    print(header)
    print(f"{'phase':<18}{'seconds':>9}{'tokens/s':>11}{'peak GiB':>10}{'plan GiB':>10}  notes")
    for r in rows:
        tps = f"{r['tokens'] / r['seconds']:.0f}" if r.get("tokens") and r["seconds"] > 0 else "-"
        plan = f"{r['plan_gib']:.2f}" if "plan_gib" in r else "-"
        notes = ", ".join(
            f"{k}={v}" for k, v in r.items() if k in ("step", "tokens", "programs", "size", "micro_tokens")
        )
        print(f"{r['phase']:<18}{r['seconds']:>9.2f}{tps:>11}{r['peak_gib']:>10.2f}{plan:>10}  {notes}")


# ---------------------------------------------------------------------------------------------- main


def run(args: argparse.Namespace) -> dict:
    """The whole benchmark; returns the measurements (also printed)."""
    import contextlib

    from codea1_core.data.lab import lab_problems
    from codea1_core.method.mistake_book import MistakeBook
    from codea1_core.models import distributed as dp
    from codea1_core.models.policy import Policy
    from sandbox import make_executor

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dp.init_from_env("auto", timeout_s=1800) and device == "cuda":
        device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
    world = dp.world_size()
    torch.manual_seed(0)
    cfg = bench_config(args, "lora", device)
    meter, rows = Meter(torch.device(device)), []
    step_no = [0]

    @contextlib.contextmanager
    def phase(name: str):
        rec: dict[str, Any] = {"phase": name, "step": step_no[0]}
        meter.reset()
        t0 = time.perf_counter()
        yield rec
        if meter.cuda:
            torch.cuda.synchronize()
        rec["seconds"], rec["peak_gib"] = time.perf_counter() - t0, meter.peak_gib()
        rows.append(rec)

    with tempfile.TemporaryDirectory() as tmp:
        # Rank 0 builds the model, every rank loads it (transformers writes files on the main process only).
        built = build_model(Path(tmp), args.shrink, cfg.lab) if dp.rank() == 0 else None
        model_dir, raw = dp.all_gather_objects(built)[0]
        problems = dp.shard(lab_problems(cfg.lab, "train")[: args.problems], dp.rank(), world)
        state = {
            "cfg": cfg,
            "problems": problems,
            "phase": phase,
            "book": MistakeBook.from_config(cfg.mistake_book),
        }
        with phase("load_lora"):
            state["code"] = Policy(str(model_dir), cfg, role="code", total_steps=args.steps + 1)
            state["test"] = Policy(str(model_dir), cfg, role="test", total_steps=args.steps + 1)
            if world > 1:
                dp.wrap_policy(state["code"], "ddp")
                dp.wrap_policy(state["test"], "ddp")
        with make_executor(cfg.sandbox) as state["executor"]:
            code_batch = None
            for it in range(1, args.steps + 1):
                step_no[0] = it
                code_batch, test_batch = rollout_and_score(state, it)
                train_step(state, "update_code_lora", state["code"], code_batch)
                if len(test_batch):
                    train_step(state, "update_test_lora", state["test"], test_batch)
        for r in rows:
            if r["phase"].startswith("update_"):
                r["plan_gib"] = predicted_gib(cfg, raw, r["micro_tokens"], False, meter.cuda)
        del state["code"], state["test"]
        gc.collect()
        if meter.cuda:
            torch.cuda.empty_cache()
        full_cfg = bench_config(args, "full", device)
        with phase("load_full"):
            full = Policy(str(model_dir), full_cfg, role="code", total_steps=2)
            if world > 1:
                dp.wrap_policy(full, "fsdp2")
        step_no[0] = args.steps
        train_step({"phase": phase}, "update_code_full", full, code_batch)
        rows[-1]["plan_gib"] = predicted_gib(full_cfg, raw, rows[-1]["micro_tokens"], True, meter.cuda)
        del full
    dev = torch.cuda.get_device_name() if meter.cuda else f"CPU ({os.cpu_count()} cores)"
    if world > 1:
        dev += f", rank {dp.rank()} of {world} (LoRA: DDP, full FT: FSDP2; B/{world} problems per rank)"
        if dp.rank() != 0:
            return {"device": dev, "phases": rows}
    shape = f"{raw['num_hidden_layers']} layers x {raw['hidden_size']}, vocab {raw['vocab_size']}"
    header = (
        f"gpu_step_bench: {dev} | {'SHRUNK ' if args.shrink else ''}Qwen2.5-Coder-1.5B architecture "
        f"({shape}) | B={args.problems} M={args.n_code} N={args.n_tests} new_tokens={args.new_tokens} | "
        f"{args.steps} step(s) LoRA r=16 + 1 full-FT step | {cfg.model.dtype}"
    )
    print_table(rows, header)
    updates = [r for r in rows if "plan_gib" in r]
    for r in updates:
        print(
            f"memory plan vs measured, {r['phase']}: plan {r['plan_gib']:.2f} GiB, "
            f"measured peak {r['peak_gib']:.2f} GiB, ratio {r['peak_gib'] / max(r['plan_gib'], 1e-9):.2f}"
        )
    if not meter.cuda:
        print(
            "  (CPU: peak = resident memory above the process start, Python/torch runtime included; the plan "
            "is meant for a GPU's allocator peak)"
        )
    lora = [r for r in rows if r["phase"] == "update_code_lora" and r["step"] == args.steps][0]
    full = rows[-1]
    print(
        f"full-FT step vs LoRA step on the same code batch: {full['seconds'] / max(lora['seconds'], 1e-9):.2f}x "
        f"seconds, {full['peak_gib'] / max(lora['peak_gib'], 1e-9):.2f}x peak memory (baseline: the LoRA step)"
    )
    return {"header": header, "device": dev, "config": raw, "phases": rows}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shrink", action="store_true", help="tiny width/depth/vocab (the CPU test)")
    p.add_argument("--device", default=None, help="cuda | cpu (default: cuda when available)")
    p.add_argument("--steps", type=int, default=2, help="training steps with LoRA (then one full-FT step)")
    p.add_argument("--problems", type=int, default=8, help="B: problems per step")
    p.add_argument("--n-code", type=int, default=4, help="M: codes per problem")
    p.add_argument("--n-tests", type=int, default=4, help="N: test suites per code")
    p.add_argument("--new-tokens", type=int, default=256, help="max new tokens per code / test completion")
    p.add_argument("--rollout-batch", type=int, default=64, help="prompts per generate call")
    p.add_argument("--micro-batch-tokens", type=int, default=32768, help="grpo.micro_batch_tokens")
    p.add_argument("--workers", type=int, default=4, help="sandbox workers")
    p.add_argument("--json", default=None, help="also write the measurements to this file")
    p.add_argument("--nproc", type=int, default=1, help="ranks (torchrun, one per GPU); B must divide by it")
    args = p.parse_args(argv)
    for name in (
        "steps",
        "problems",
        "n_code",
        "n_tests",
        "new_tokens",
        "rollout_batch",
        "micro_batch_tokens",
        "workers",
        "nproc",
    ):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: expected >= 1, got {getattr(args, name)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.nproc > 1 and "LOCAL_RANK" not in os.environ:  # re-execute under torchrun, one rank per GPU
        import subprocess

        rest = list(argv if argv is not None else sys.argv[1:])
        for i, arg in enumerate(rest):  # the ranks get the same arguments but --nproc (torchrun takes it)
            if arg == "--nproc":
                del rest[i : i + 2]
                break
            if arg.startswith("--nproc="):
                del rest[i]
                break
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={args.nproc}",
            __file__,
            *rest,
        ]
        return subprocess.call(cmd)
    result = run(args)
    if args.json and "header" in result:
        write_text_atomic(args.json, json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
