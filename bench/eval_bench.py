"""Benchmark: HumanEval+ evaluation of the 164 canonical solutions, our evaluator vs ``evalplus``.

What it measures, in one run and with the same number of parallel workers on both sides:
  * ours: the base + plus inputs of every problem as one ``run_many`` through the process sandbox
    (``codea1_core.evaluation.verdicts`` verdicts, EvalPlus semantics), after the expected values were filled
    from the reference (the prepare stage's job, not timed);
  * evalplus 0.3.x: ``evalplus.evaluate.evaluate("humaneval", samples=...)`` on the same solutions, with
    its data read from the offline copy (``HUMANEVAL_OVERRIDE_PATH``) and its ground-truth cache warmed
    beforehand (not timed), its cache kept in a temporary folder.
Prints both wall times, the ratio and every task whose base or plus verdict differs, with the reason
when it is a known evalplus defect (HumanEval/32 with evalplus 0.3.1); a task some of whose inputs our
prepare step dropped because the reference fails on them is listed separately. Exit 1 on an
unexplained disagreement.

How to run: ``python bench/eval_bench.py [--workers 2] [--data DIR]`` (data: ``$CODEA1_DATA_DIR`` or
``../shared/data``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


KNOWN_EVALPLUS_BUGS = {
    "HumanEval/32": "evalplus 0.3.1's find_zero oracle does `assert ...; continue` inside its per-input loop, "
    "skipping the pass bookkeeping (details[i] = True), so every solution, the canonical one included, fails",
}
"""Disagreements explained by a defect of the evalplus version we compare against (checked by hand)."""


def ours(data_dir: Path, workers: int):
    """(wall seconds, {task_id: (base, plus)}, {task_id: dropped inputs}) of our evaluator."""
    from codea1_core.config import Config
    from codea1_core.data.datasets import load_source
    from codea1_core.data.prepared import reference_exprs, resolve
    from codea1_core.evaluation.verdicts import build_code_jobs, verdicts_for
    from sandbox import make_executor

    # a generous per-call limit: on a loaded machine a 2 s limit can drop a heavy input while filling
    # the expected values, which would make the two evaluators see different input sets
    cfg = Config().replace(**{"sandbox.workers": workers, "sandbox.call_timeout_s": 10.0})
    problems = load_source("humanevalplus", "test", cfg, data_dir)
    with make_executor(cfg.sandbox) as ex:
        outs = ex.run_many([(p.reference_solution, reference_exprs(p)) for p in problems])
        filled = [
            resolve(p, o, cfg.sandbox.float_rel_tol, cfg.sandbox.float_abs_tol)
            for p, o in zip(problems, outs, strict=True)
        ]
        problems = [f for f, _ in filled]
        dropped = {p.id: len(ex_) for p, (_, ex_) in zip(problems, filled, strict=True) if ex_}
        t0 = time.perf_counter()
        jobs = build_code_jobs(problems, [[p.reference_solution] for p in problems])
        results = ex.run_many(jobs.jobs)
        verdicts = verdicts_for(problems, jobs, results, cfg.sandbox.float_rel_tol, cfg.sandbox.float_abs_tol)
        wall = time.perf_counter() - t0
    return wall, {p.id: (v[0].base, v[0].plus) for p, v in zip(problems, verdicts, strict=True)}, dropped


def theirs(data_dir: Path, workers: int, tmp: Path):
    """(wall seconds, {task_id: (base, plus)}) of evalplus' own evaluator."""
    gz = next((data_dir / "humanevalplus").glob("HumanEvalPlus-*.jsonl*"))
    os.environ["HUMANEVAL_OVERRIDE_PATH"] = str(gz)
    os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")  # evalplus' ground-truth cache stays out of $HOME
    from evalplus.data import get_human_eval_plus, get_human_eval_plus_hash
    from evalplus.evaluate import evaluate, get_groundtruth

    problems = get_human_eval_plus()
    samples = tmp / "samples.jsonl"
    samples.write_text(
        "".join(
            json.dumps({"task_id": t, "solution": p["prompt"] + p["canonical_solution"]}) + "\n"
            for t, p in problems.items()
        )
    )
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        get_groundtruth(problems, get_human_eval_plus_hash(), [])  # warm the cache (not timed)
        t0 = time.perf_counter()
        evaluate("humaneval", samples=str(samples), parallel=workers)
        wall = time.perf_counter() - t0
    res = json.loads((tmp / "samples_eval_results.json").read_text())["eval"]
    return wall, {t: (r[0]["base_status"] == "pass", r[0]["plus_status"] == "pass") for t, r in res.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--data", default=os.environ.get("CODEA1_DATA_DIR", str(REPO.parent / "shared" / "data"))
    )
    args = parser.parse_args()
    data_dir = Path(args.data)
    if not (data_dir / "humanevalplus").is_dir():
        print(f"error: {data_dir}/humanevalplus not found (set --data or CODEA1_DATA_DIR)", file=sys.stderr)
        return 2
    our_wall, our_v, dropped = ours(data_dir, args.workers)
    with tempfile.TemporaryDirectory() as tmp:
        their_wall, their_v = theirs(data_dir, args.workers, Path(tmp))
    diff = sorted(t for t in their_v if our_v.get(t) != their_v[t])
    print(f"HumanEval+ canonical solutions: {len(our_v)} tasks, {args.workers} workers each")
    print(
        f"  ours     {our_wall:7.2f} s   base pass {sum(b for b, _ in our_v.values())}, plus pass {sum(p for _, p in our_v.values())}"
    )
    print(
        f"  evalplus {their_wall:7.2f} s   base pass {sum(b for b, _ in their_v.values())}, plus pass {sum(p for _, p in their_v.values())}"
    )
    print(f"  ratio evalplus/ours = {their_wall / our_wall:.2f}x")
    print(f"  verdict disagreements (ours vs evalplus, (base, plus)): {len(diff)}")
    for t in diff:
        print(
            f"    {t}: ours {our_v.get(t)} evalplus {their_v[t]}  {KNOWN_EVALPLUS_BUGS.get(t, 'UNEXPLAINED')}"
        )
    if dropped:
        print(f"  inputs dropped by our prepare step (reference fails on them): {dropped}")
    return 0 if all(t in KNOWN_EVALPLUS_BUGS for t in diff) else 1


if __name__ == "__main__":
    raise SystemExit(main())
