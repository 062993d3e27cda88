"""Rollout throughput at the training step's real shapes: HF ``generate`` vs the fast decodes, side by side.

What it does: builds the lab's model (the ``lab`` section's shape and tokenizer corpus, random init; or the
warm-started ``outputs/warmstart/{code,test}`` when present, where completions stop at EOS like in training)
and samples, through the real :class:`codea1_core.models.policy.Policy`, the two rollouts of one training step:

* code rollout: ``data.train_batch_size`` lab problems x ``rollout.n_code`` samples, ``max_new_tokens_code``;
* test rollout: B x M white-box test prompts x ``rollout.n_tests`` samples, ``max_new_tokens_test``.

Each shape runs on four paths with the same seeds, in A/B/C/D/D/C/B/A order: ``generate`` (HF, what
``Policy.fast_generate = False`` calls), ``exact`` (:mod:`codea1_core.models.cpu_decode.engine` with
``rollout.share_prompt: false``: it must sample exactly ``generate``'s completions), ``shared-1p`` (the
default ``rollout.share_prompt: true`` kept in one process: one prefill and one key/value copy per prompt,
the same distribution from its own random numbers) and ``shared`` (the default as training runs it: half
of the prompts decoded in a forked second process where a core is free; it must sample exactly
``shared-1p``'s completions). A checks line per shape says whether both equalities held and the mean new
tokens per row of ``generate`` and ``shared``. It prints tokens per wall second and per CPU-second (the
process and its children), the ratios to ``generate``, and the load average before and after (the machine may
be shared: read the ratios, measured in the same run,
and the CPU columns, which move far less with other jobs' load). ``--threads 1,2`` repeats everything at
each intra-op thread count (default: the params' ``model.cpu_threads``, the training step's setting).

``--floor`` adds, per shape, the CPU time of the work every bit-exact path repeats (the prefill of every row
and the SDPA kernel of each decode step) and the largest ratio against ``generate`` it leaves: why ``shared``
exists.

``--large`` adds a random-init model with Qwen2.5-Coder-1.5B's width, heads and vocabulary but only
``--large-layers`` layers (2 by default: the full 28 do not fit a 3-minute run on 2 cores), bfloat16, at a
small shape; it checks the fast path on a GQA model with a 152k vocabulary.

``--vllm`` (in ``.venv-vllm``, ``make vllm-venv``) runs, instead of the table above, the code rollout on vLLM's CPU
build beside ``generate`` and ``shared`` (where the CPU decoder runs on that venv's transformers), on the lab model
and on a wider float32 model (:data:`WIDER`), and the time of one engine sync: the whole weights pushed in place
(full fine-tuning) and a new adapter version (LoRA). vLLM's engine runs in its own processes, so its rows have
wall time only.

Run: ``python bench/rollout_bench.py [--params params.yaml] [--repeats 2] [--threads 1,2] [--floor] [--large]
[--vllm]``.
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
        from codea1_core.data.warmstart_data import tokenizer_corpus
        from codea1_core.models.tiny_model import build_tiny_model

        lab = cfg.lab
        build_tiny_model(
            target,
            tokenizer_corpus(lab),
            hidden_size=lab.hidden_size,
            num_layers=lab.num_layers,
            num_heads=lab.num_heads,
            intermediate_size=lab.intermediate_size,
            vocab_size=lab.vocab_size,
            seed=0,
        )
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


PATHS = ("generate", "exact", "shared-1p", "shared")
"""HF ``generate``; the fast decode bit for bit (``rollout.share_prompt: false``); the fast decode with one
prefill and one key/value copy per prompt (``rollout.share_prompt: true``, the default) in one process
(``CODEA1_DECODE_PROCESSES=1``) and as the default runs it (half of the prompts in a forked second process
where a core is free)."""


def _cpu_s() -> float:
    """CPU seconds of this process, its reaped children and its live decode workers (read from /proc)."""
    from codea1_core.models.cpu_decode import workers

    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    ticks = os.sysconf("SC_CLK_TCK")
    for pid in workers.worker_pids():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


def _run(
    policy: Policy, prompts: list, n: int, sp: SamplingParams, path: str
) -> tuple[float, float, int, list]:
    """One rollout on one path: (wall s, CPU s, new tokens, completions)."""
    from codea1_core.models.cpu_decode import SPLIT_ENV

    policy.fast_generate, policy.share_prompt = path != "generate", path.startswith("shared")
    before = os.environ.get(SPLIT_ENV)
    os.environ[SPLIT_ENV] = "1" if path == "shared-1p" else (before or "")
    try:
        t0, c0 = time.perf_counter(), _cpu_s()
        out = policy.generate(prompts, n, sp)
        seconds, cpu = time.perf_counter() - t0, _cpu_s() - c0
    finally:
        if before is None:
            del os.environ[SPLIT_ENV]
        else:
            os.environ[SPLIT_ENV] = before
    return seconds, cpu, sum(len(c.token_ids) for group in out for c in group), out


def compare(name: str, policy: Policy, prompts: list, n: int, sp: SamplingParams, repeats: int) -> dict:
    """A/B/C/D/D/C/B/A runs of one shape; prints tokens/s (wall and per CPU-second) of each path, ratios to
    ``generate``.

    CPU seconds are the process's and its children's (all threads, the second decode process included): on a
    shared machine they move far less with other jobs' load than wall time does. ``exact`` must sample
    exactly ``generate``'s completions, and ``shared`` exactly ``shared-1p``'s (the checks line); the shared
    decode samples the same distribution as ``generate`` with its own random numbers
    (``tests/core/models/cpu_decode/test_shared_decode.py``), so only its mean completion length is printed
    beside ``generate``'s
    (equal up to sampling noise; with random-init models every row runs to the limit).
    """
    policy.generate(prompts[:1], 1, SamplingParams(max_new_tokens=2))  # warm-up
    wall = dict.fromkeys(PATHS, 0.0)
    cpu = dict.fromkeys(PATHS, 0.0)
    tokens = dict.fromkeys(PATHS, 0)
    outputs: dict[str, list] = {}
    order = [*PATHS, *reversed(PATHS)] * repeats
    for path in order[: len(PATHS) * repeats]:
        s, c, t, out = _run(policy, prompts, n, sp, path)
        wall[path] += s
        cpu[path] += c
        tokens[path] += t
        outputs.setdefault(path, out)
    rate = {p: tokens[p] / wall[p] for p in PATHS}
    rate_cpu = {p: tokens[p] / cpu[p] for p in PATHS}
    shape = f"{len(prompts) * n} x {sp.max_new_tokens}"
    for i, p in enumerate(PATHS):
        print(
            f"{name if i == 0 else '':<18}{shape if i == 0 else '':>10}  {p:<10}{rate[p]:>10.0f}"
            f"{rate[p] / rate['generate']:>9.2f}x{rate_cpu[p]:>11.0f}{rate_cpu[p] / rate_cpu['generate']:>9.2f}x"
            f"{wall[p] / repeats:>9.2f}{cpu[p] / repeats:>9.2f}",
            flush=True,
        )
    mean_len = {p: tokens[p] / repeats / (len(prompts) * n) for p in ("generate", "shared")}
    exact = "yes" if outputs["exact"] == outputs["generate"] else "NO"
    split = "yes" if outputs["shared"] == outputs["shared-1p"] else "NO"
    print(
        f"{'':<30}checks: exact == generate {exact}; shared == shared-1p {split}; mean new tokens per row "
        f"generate {mean_len['generate']:.1f}, shared {mean_len['shared']:.1f}",
        flush=True,
    )
    steps = max(len(c.token_ids) for group in outputs["exact"] for c in group)
    return {"hf_cpu_s": cpu["generate"] / repeats, "steps": steps}


def exact_floor(policy: Policy, prompts: list, n: int, steps: int, hf_cpu_s: float) -> None:
    """CPU seconds of the work any exact path must repeat: the prefill and the SDPA kernel of every decode step.

    Both are the model's own kernels on the same inputs (bit-identical tokens need the same attention call per
    row and head, and prefilling each prompt once is not bit-identical:
    tests/core/models/cpu_decode/test_engine.py); their
    sum bounds the ratio an exact rollout can reach against ``generate`` at this shape.
    """
    from codea1_core.models.cpu_decode import engine, exact
    from codea1_core.models.cpu_decode.prefill import prefill as hf_prefill

    base = engine._base_model(policy.model)
    attn = base.model.layers[0].self_attn
    texts = [policy.render(p) for p in prompts]
    enc = policy.tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"].repeat_interleave(n, 0), enc["attention_mask"].repeat_interleave(n, 0)
    rows, prompt_len = ids.shape
    with torch.no_grad():
        c0 = time.process_time()
        _, cache, _ = hf_prefill(base, ids, mask)
        prefill = time.process_time() - c0
        view = exact._ViewCache(cache, prompt_len + steps)
        decode_mask = exact._decode_mask(mask, prompt_len + steps)
        query = torch.randn(rows, base.config.num_attention_heads, 1, attn.head_dim)
        c0 = time.process_time()
        for t in range(steps - 1):
            end = prompt_len + t + 1
            for keys, values in zip(view.keys, view.values, strict=True):
                step_mask = None if decode_mask is None else decode_mask[:, :, :, :end]
                torch.nn.functional.scaled_dot_product_attention(
                    query, keys[:, :, :end], values[:, :, :end], attn_mask=step_mask, scale=attn.scaling
                )
        attention = time.process_time() - c0
    floor = prefill + attention
    print(
        f"{'':<16}exact floor at {rows} x {steps} (prompt {prompt_len}): prefill {prefill:.2f} + decode "
        f"attention {attention:.2f} = {floor:.2f} CPU s; generate {hf_cpu_s:.2f} CPU s -> at most "
        f"{hf_cpu_s / floor:.1f}x for any exact path",
        flush=True,
    )


def _load() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--params", default="params.yaml", help="params file (default shapes: its train step)"
    )
    parser.add_argument("--repeats", type=int, default=2, help="A/B pairs per shape (run in A,B,B,A order)")
    parser.add_argument("--large", action="store_true", help="also the 1.5B-width model (few layers)")
    parser.add_argument("--floor", action="store_true", help="also the exact floor: prefill + SDPA CPU time")
    parser.add_argument("--large-layers", type=int, default=2, help="layers of the 1.5B-width model")
    parser.add_argument(
        "--vllm", action="store_true", help="vLLM's CPU engine vs generate, and its sync times"
    )
    parser.add_argument(
        "--threads",
        default="",
        help="intra-op thread counts to run everything at, e.g. 1,2 "
        "(default: the params' model.cpu_threads, what the training step pins; 0 there: torch's default)",
    )
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats: must be >= 1")
    cfg = load_config(args.params) if Path(args.params).is_file() else Config()
    cfg = cfg.replace(**{"model.device": "cpu", "model.dtype": "float32", "model.finetune": "full"})
    try:
        threads = [int(t) for t in args.threads.split(",")] if args.threads else [cfg.model.cpu_threads]
    except ValueError:
        parser.error(f"--threads: expected comma-separated integers, got {args.threads!r}")
    threads = [t if t > 0 else torch.get_num_threads() for t in threads]
    t_start = time.perf_counter()
    print(
        f"rollout bench: torch {torch.__version__}, {os.cpu_count()} CPUs, load average {_load()}", flush=True
    )
    code_prompts, test_prompts = _step_prompts(cfg)
    if args.vllm:
        torch.set_num_threads(threads[0])
        with tempfile.TemporaryDirectory(prefix="codea1-rollout-bench-") as tmp:
            _vllm(cfg, Path(tmp), code_prompts, args.repeats)
        print(f"load average after {_load()}; bench wall {time.perf_counter() - t_start:.0f} s", flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="codea1-rollout-bench-") as tmp:
        work = Path(tmp)
        model_dir = ""
        for count in threads:
            torch.set_num_threads(count)
            print(f"\n{count} intra-op thread(s) (the shared decode runs its steps on one for the lab model)")
            print(
                f"{'rollout':<18}{'rows x new':>10}  {'path':<10}{'tok/s':>10}{'vs gen':>10}{'tok/CPU s':>11}"
                f"{'vs gen':>10}{'wall s':>9}{'CPU s':>9}",
                flush=True,
            )
            for role, prompts, n, new in (
                ("code", code_prompts, cfg.rollout.n_code, cfg.rollout.max_new_tokens_code),
                ("test", test_prompts, cfg.rollout.n_tests, cfg.rollout.max_new_tokens_test),
            ):
                model_dir = _lab_model(cfg, work, role)
                policy = Policy(model_dir, cfg, role=role)
                r = cfg.rollout
                sp = SamplingParams(
                    temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=new, seed=1
                )
                result = compare(f"lab {role}", policy, prompts, n, sp, args.repeats)
                if args.floor:
                    exact_floor(policy, prompts, n, result["steps"], result["hf_cpu_s"])
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


WIDER = {"hidden_size": 512, "num_layers": 4, "num_heads": 8, "intermediate_size": 1408}
"""A wider float32 model than the lab's (head size 64) for the vLLM rows, on the lab's tokenizer corpus."""


def _vllm(cfg: Config, work: Path, prompts: list, repeats: int) -> None:
    """The lab code rollout on HF ``generate``, ``shared`` and vLLM (full weights), then one sync of each kind."""
    from codea1_core.data.lab import tokenizer_corpus
    from codea1_core.models.tiny_model import build_tiny_model
    from codea1_core.models.vllm_engine import VllmRollout

    r = cfg.rollout
    sp = SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                        max_new_tokens=r.max_new_tokens_code, seed=1)  # fmt: skip
    wider = work / "wider"
    if not (wider / "config.json").is_file():
        build_tiny_model(wider, tokenizer_corpus(cfg.lab), vocab_size=cfg.lab.vocab_size, seed=0, **WIDER)
    print("\nvLLM (CPU build) vs the CPU decoders, code rollout; sync = one engine update")
    print(
        f"{'model':<18}{'rows x new':>10}  {'path':<22}{'tok/s':>10}{'vs gen':>10}{'wall s':>9}", flush=True
    )
    for name, model_dir in (("lab", _lab_model(cfg, work, "code")), ("wider 512x4", str(wider))):
        rows, rates = f"{len(prompts) * r.n_code} x {sp.max_new_tokens}", {}
        for finetune in ("full", "lora"):
            run_cfg = cfg.replace(**{"model.finetune": finetune, "rollout.max_model_len": 2048})
            policy = Policy(model_dir, run_cfg, role="code")
            if finetune == "full":
                for path in ("generate", "shared"):
                    try:
                        _run(policy, prompts[:1], 1, SamplingParams(max_new_tokens=2), path)  # warm-up
                    except AttributeError as exc:  # the CPU decoder follows the default venv's transformers
                        print(f"{name}: {path} does not run here ({exc})", flush=True)
                        continue
                    runs = [_run(policy, prompts, r.n_code, sp, path) for _ in range(repeats)]
                    rates[path] = (
                        sum(x[2] for x in runs) / sum(x[0] for x in runs),
                        sum(x[0] for x in runs) / repeats,
                    )
            t0 = time.perf_counter()
            rollout = VllmRollout(run_cfg, {"code": model_dir}, work / f"adapters-{name}-{finetune}")
            start_s = time.perf_counter() - t0
            syncs = []
            for _ in range(3):
                t0 = time.perf_counter()
                rollout.sync(policy)
                syncs.append(time.perf_counter() - t0)
            rollout.generate("code", prompts[:1], 1, SamplingParams(max_new_tokens=2))  # warm-up
            walls, tokens = 0.0, 0
            for _ in range(repeats):
                t0 = time.perf_counter()
                out = rollout.generate("code", prompts, r.n_code, sp)
                walls += time.perf_counter() - t0
                tokens += sum(len(c.token_ids) for group in out for c in group)
            rates[f"vllm {finetune} (start {start_s:.0f} s)"] = (tokens / walls, walls / repeats)
            rates[f"sync {finetune}"] = (0.0, min(syncs))
            rollout.engines["code"].llm_engine.engine_core.shutdown()
            del rollout, policy
        for i, (path, (rate, wall)) in enumerate(rates.items()):
            ratio = f"{rate / rates['generate'][0]:>9.2f}x" if rate else f"{'':>10}"
            print(f"{name if i == 0 else '':<18}{rows if i == 0 else '':>10}  {path:<22}"
                  f"{rate if rate else float('nan'):>10.0f}{ratio}{wall:>9.3f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
