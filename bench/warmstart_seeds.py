"""Benchmark: the lab warm start alone, per seed — its held-out pass@1 and how far seeds spread.

What it measures: for each seed, the Code-LLM warm start exactly as the ``warmstart`` stage builds it
(``flows.warmstart.warm_start`` with ``seed`` and ``data.seed`` set, code role only), then the evaluate
stage's protocol on the held-out lab problems (``eval.n_samples`` samples at ``eval.temperature``, the
process sandbox, ``tasks.evaluate.score_codes``): ``code/lab_heldout_seen/base/pass@1`` (the headline),
the SFT's final training loss, and what the seen-family samples are: the reference exactly (``ref``), one of
the family's known buggy variants (``bug``) or anything else (``other``: mostly the right shape with
constants that are not the prompt's, i.e. memorized training constants).
It prints one line per seed, then the median, min / median (the target: no seed below half
the median) and max - min, all measured in this run.

What it does not: train with RL or touch ``outputs/``; everything lives in a temporary folder.

How to run: ``python bench/warmstart_seeds.py [--seeds 1,2,3,4,5] [key=value ...]``; the overrides are
applied to every seed (e.g. ``lab.warmstart_epochs=10``). Sequential on purpose: one warm start at a time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

HEADLINE = "code/lab_heldout_seen/base/pass@1"


def measure(seed: int, overrides: list[str], tmp: Path) -> dict[str, float]:
    """Warm-start the Code LLM for ``seed`` and evaluate it on the held-out lab problems."""
    from codea1_core.config import load_config
    from codea1_core.data.lab import lab_problems
    from codea1_core.evaluation.benchmarks import lab_subsets
    from codea1_core.models.policy import Policy
    from flows.common import pin_cpu_threads
    from flows.warmstart import warm_start
    from sandbox import make_executor
    from tasks.evaluate import generate_codes, score_codes

    root = tmp / f"s{seed}"
    sets = [f"seed={seed}", f"data.seed={seed}", "mode=golden", f"model.code_path={root}/code"]
    sets += [f"data.prepared_dir={tmp}/no-prepared", *overrides]  # lab problems regenerated, never stale
    cfg = load_config(REPO / "params.yaml", sets)
    pin_cpu_threads(cfg)
    t0 = time.perf_counter()
    stats = warm_start(cfg, root=root)
    t_sft = time.perf_counter() - t0
    problems = lab_problems(cfg.lab, "test")
    executor = make_executor(cfg.sandbox)
    try:
        policy = Policy(str(root / "code"), cfg, "code")
        subsets = lab_subsets(problems)
        codes = generate_codes(problems, policy, cfg, cfg.eval.n_samples)
        metrics = score_codes(problems, codes, cfg, executor, "lab_heldout", subsets=subsets)
    finally:
        executor.close()
    idx = subsets.get("seen", range(len(problems)))
    seen = [problems[i] for i in idx], [codes[i] for i in idx]
    return {
        **sample_kinds(*seen),
        "pass@1": metrics[HEADLINE],
        "pass@1_all": metrics["code/lab_heldout/base/pass@1"],
        "train_loss": float(stats.get("code/train_loss", float("nan"))),
        "sft_s": t_sft,
        "eval_s": time.perf_counter() - t0 - t_sft,
    }


def _norm(code: str) -> str:
    return "\n".join(line.rstrip() for line in code.strip().splitlines())


def sample_kinds(problems: list, codes: list[list[str]]) -> dict[str, float]:
    """Percent of samples that are the reference, a known buggy variant, or other code (wrong constants)."""
    counts = {"ref": 0, "bug": 0, "other": 0}
    for problem, row in zip(problems, codes, strict=True):
        ref, bugs = _norm(problem.reference_solution), {_norm(b) for b in problem.metadata["buggy"]}
        for code in map(_norm, row):
            counts["ref" if code == ref else "bug" if code in bugs else "other"] += 1
    total = max(sum(counts.values()), 1)
    return {f"{kind}%": 100.0 * n / total for kind, n in counts.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3,4,5", help="comma list of seeds (default 1..5)")
    parser.add_argument("overrides", nargs="*", help="key=value applied to every seed")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    print(f"warm start per seed, overrides: {' '.join(args.overrides) or '(none: params.yaml)'}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="codea1-ws-seeds-") as tmp:
        for seed in seeds:
            r = measure(seed, args.overrides, Path(tmp))
            results[seed] = r
            print(
                f"seed {seed}: {HEADLINE} {r['pass@1']:5.1f}  all held-out {r['pass@1_all']:5.1f}  "
                f"sft loss {r['train_loss']:.3f}  samples ref/bug/other {r['ref%']:.0f}/{r['bug%']:.0f}/"
                f"{r['other%']:.0f} %  sft {r['sft_s']:.0f} s  eval {r['eval_s']:.0f} s",
                flush=True,
            )
    values = [r["pass@1"] for r in results.values()]
    median = statistics.median(values)
    verdict = "n/a (median 0)"
    if median:
        ratio = min(values) / median
        verdict = f"{ratio:.2f} ({'ok' if ratio >= 0.5 else 'BELOW'} the target's 0.5)"
    spread = max(values) - min(values)
    print(
        f"median {median:.1f}  min {min(values):.1f}  max {max(values):.1f}  spread {spread:.1f}  min/median {verdict}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
