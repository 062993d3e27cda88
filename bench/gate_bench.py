"""Benchmark of the training step's ``gate_tests`` task: parse every test response, gate the tests with GX.

What it does: builds synthetic Test-LLM responses shaped like a step's suites (``--suites`` responses of
``--asserts`` asserts; ~5% malformed: syntax errors, other operators, non-literal answers, dunder access,
walrus, forbidden names, duplicates, over-long calls), runs ``tasks.rollout.gate_tests`` once to warm up (GX
context creation, suite build), then times ``--repeats`` runs and prints the median wall and CPU seconds of
the task and of its parse share (``extract_tests`` over every response), and the rejected counts.
``--compare-ref REF`` measures this checkout and revision ``REF`` (``git archive``) on the same responses, in
interleaved rounds (A/B/B/A), and checks that both give identical suites and metrics. ``--step`` takes the
suite count of one training step of ``params.yaml`` (B·M·N) and shows each side's time against the mean step
time of ``outputs/train/timings.csv`` when there is one.

What it does not: run any code or use a model.
How to run: ``python -m bench.gate_bench [--suites N] [--asserts K] [--step] [--compare-ref REF]``.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

BAD_ASSERTS = [
    "assert f(1 == 2",  # syntax error (parser)
    "assert f(1) != 2",  # not an equality (parser)
    "assert f(2) == f(2)",  # tautology: not plain data (parser)
    "assert f(().__class__) == 1",  # dunder (gate)
    "assert f(x := 3) == 3",  # walrus (gate)
    "assert f(open('/etc/passwd')) == 1",  # forbidden name (gate)
    "assert f('" + "a" * 2100 + "') == 1",  # over-long call (gate)
    "assert f(3) == ['\uff3c']",  # an answer NFKC breaks (gate)
]

MEASURE = r"""
import hashlib, json, os, statistics, sys, time
tree, inputs, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, tree)
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
import flows  # noqa: F401  (the entry-point environment defaults, before Prefect and GX load)
from types import SimpleNamespace
from codea1_core.config import Config
from codea1_core.method import parsing
from codea1_core.method.parsing import extract_tests
from codea1_core.method.validity import call_reason
from codea1_core.types import Problem
from tasks.rollout import gate_tests

# each timed run starts as a new step would: the parser's memos empty (a revision without them: none)
clear_memo = getattr(parsing, "clear_memo", None) or getattr(call_reason, "cache_clear", lambda: None)

data = json.loads(open(inputs, encoding="utf-8").read())
problems = [Problem(id=pid, source="bench", split="train", prompt="", description="", entry_point=ep,
                    reference_solution="") for pid, ep in data["problems"]]
completions = [[[SimpleNamespace(text=t) for t in per_code] for per_code in per_problem]
               for per_problem in data["texts"]]
cfg = Config()
suites, metrics = gate_tests.fn(problems, completions, cfg, 1)  # warm-up: GX context and suite
task, task_cpu, parse, parse_cpu = [], [], [], []
for _ in range(repeats):
    clear_memo()
    t0, c0 = time.perf_counter(), time.process_time()
    for p, per_problem in zip(problems, completions):
        for per_code in per_problem:
            for c in per_code:
                extract_tests(c.text, p.entry_point, cfg.tests.parse_mode, literal_answers=cfg.tests.literal_answers)
    parse.append(time.perf_counter() - t0)
    parse_cpu.append(time.process_time() - c0)
    clear_memo()
    t0, c0 = time.perf_counter(), time.process_time()
    suites, metrics = gate_tests.fn(problems, completions, cfg, 1)
    task.append(time.perf_counter() - t0)
    task_cpu.append(time.process_time() - c0)
verdicts = [[[[[t.call, t.answer] for t in s.tests], s.invalid, list(s.reasons)] for s in per_code]
            for per_problem in suites for per_code in per_problem]
out = json.dumps([verdicts, sorted(metrics.items())], sort_keys=True)
print(json.dumps({
    "task_s": statistics.median(task), "task_cpu_s": statistics.median(task_cpu),
    "parse_s": statistics.median(parse), "parse_cpu_s": statistics.median(parse_cpu),
    "metrics": metrics, "digest": hashlib.sha256(out.encode()).hexdigest(),
}))
"""


def _call(rng: random.Random, ep: str) -> str:
    args = [rng.randint(-100, 100) for _ in range(rng.randint(1, 6))]
    return f"{ep}({args!r}, {rng.randint(0, 9)}, key={rng.choice(['None', repr('abc'), 'True'])})"


def make_responses(n_suites: int, n_asserts: int, seed: int = 0) -> dict:
    """``n_suites`` responses of ``n_asserts`` asserts: 16 suites per problem (M·N of the lab), 4 per code;
    each suite draws its calls from the problem's 6 x ``n_asserts`` inputs."""
    rng = random.Random(seed)
    problems, texts = [], []
    for s in range(n_suites):
        b, within = divmod(s, 16)
        if within == 0:
            problems.append([f"bench/{b}", f"func_{b}"])
            texts.append([[] for _ in range(4)])
        ep = f"func_{b}"
        if within == 0:  # the problem's inputs: its suites share some calls, none repeats within a suite
            pool = [_call(rng, ep) for _ in range(6 * n_asserts)]
        calls = rng.sample(pool, n_asserts)
        lines: list[str] = []
        for _ in range(n_asserts):
            r = rng.random()
            if r < 0.03:
                lines.append(BAD_ASSERTS[rng.randrange(len(BAD_ASSERTS))].replace("f(", f"{ep}("))
                continue
            if r < 0.05 and lines:
                lines.append(lines[-1])  # a duplicate call
                continue
            call = calls.pop()
            kind = rng.random()
            if kind < 0.5:
                answer = repr(sorted(rng.sample(range(100), 4)))
            elif kind < 0.8:
                answer = repr((rng.randint(0, 9), rng.choice(["a", "bc", ""]), rng.random() < 0.5))
            else:
                answer = repr({rng.choice("xyz"): [rng.randint(0, 9), None]})
            lines.append(f"assert {call} == {answer}")
        texts[-1][within // 4].append("Tests:\n```python\n" + "\n".join(lines) + "\n```\n")
    return {"problems": problems, "texts": texts}


def measure(tree: Path, inputs: Path, repeats: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, str(tree), str(inputs), str(repeats)],
        capture_output=True,
        text=True,
        cwd=tree,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"bench run in {tree} failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def step_shape() -> tuple[int, float | None]:
    """B·M·N of ``params.yaml`` and the mean ``time/iteration_s`` of ``outputs/train/timings.csv`` (None)."""
    sys.path.insert(0, str(REPO))
    from codea1_core.config import load_config

    cfg = load_config(REPO / "params.yaml")
    history = REPO / "outputs" / "train" / "timings.csv"
    step_s = None
    if history.is_file():
        rows = [r for r in csv.DictReader(history.open(encoding="utf-8")) if r.get("time/iteration_s")]
        step_s = statistics.mean(float(r["time/iteration_s"]) for r in rows) if rows else None
    return cfg.data.train_batch_size * cfg.rollout.n_code * cfg.rollout.n_tests, step_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", type=int, default=2500, help="test responses (default 2500 x 8 asserts)")
    parser.add_argument("--asserts", type=int, default=8, help="asserts per response")
    parser.add_argument("--step", action="store_true", help="one training step's suites of params.yaml")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per round")
    parser.add_argument("--compare-ref", default="", help="git revision to compare this checkout against")
    parser.add_argument("--rounds", type=int, default=2, help="--compare-ref: interleaved rounds")
    args = parser.parse_args(argv)

    step_s = None
    if args.step:
        args.suites, step_s = step_shape()
    with tempfile.TemporaryDirectory(prefix="codea1-gate-bench-") as tmp:
        inputs = Path(tmp) / "responses.json"
        inputs.write_text(json.dumps(make_responses(args.suites, args.asserts)), encoding="utf-8")
        trees = {"this": REPO}
        if args.compare_ref:
            ref_tree = Path(tmp) / "ref"
            ref_tree.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(REPO), "archive", args.compare_ref], capture_output=True, check=True
            )
            subprocess.run(["tar", "-x", "-C", str(ref_tree)], input=archive.stdout, check=True)
            trees = {"ref": ref_tree, "this": REPO}
        runs: dict[str, list[dict]] = {side: [] for side in trees}
        sides = list(trees)
        for r in range(args.rounds if args.compare_ref else 1):
            for side in sides if r % 2 == 0 else sides[::-1]:
                runs[side].append(measure(trees[side], inputs, args.repeats))
                last = runs[side][-1]
                print(
                    f"  round {r + 1} {side:4s}: gate_tests {last['task_s']:.3f} s (CPU {last['task_cpu_s']:.3f}),"
                    f" parse {last['parse_s']:.3f} s (CPU {last['parse_cpu_s']:.3f})"
                )
    rows = int(runs["this"][0]["metrics"].get("test/gate_rows", 0))
    print(
        f"\n{args.suites} responses x {args.asserts} asserts, {rows} gate rows; median of {args.repeats} runs"
    )
    for side, results in runs.items():
        task = statistics.median(x["task_s"] for x in results)
        cpu = statistics.median(x["task_cpu_s"] for x in results)
        parse_cpu = statistics.median(x["parse_cpu_s"] for x in results)
        share = (
            f"; CPU {cpu / step_s:.1%} of a step ({step_s:.2f} s, outputs/train/timings.csv)"
            if step_s
            else ""
        )
        print(
            f"  {side:4s}: gate_tests {task:.3f} s wall, {cpu:.3f} s CPU (parse {parse_cpu:.3f}, the rest "
            f"{cpu - parse_cpu:.3f}){share}"
        )
    if args.compare_ref:
        ref_cpu = statistics.median(x["task_cpu_s"] for x in runs["ref"])
        this_cpu = statistics.median(x["task_cpu_s"] for x in runs["this"])
        same = {x["digest"] for x in runs["ref"] + runs["this"]}
        print(
            f"  CPU ratio this/ref: {this_cpu / ref_cpu:.3f}; identical suites and metrics: {len(same) == 1}"
        )
    metrics = runs["this"][0]["metrics"]
    print("  " + ", ".join(f"{k.removeprefix('test/')}={v:g}" for k, v in sorted(metrics.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
