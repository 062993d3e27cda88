"""``make lab-compare``: the paper's comparison in small, as DVC experiments (docs/method.md §14, §15, D10).

What it does: one DVC experiment per (mode, seed) — the arms of ``codea1_core.evaluation.comparison.MODES``:
``golden_sparse``
(golden tests as scarce as real data's), ``golden_boundary`` (exhaustive boundary tests: the oracle ceiling),
``selfplay``, ``codea1``, ``codea1`` without the Mistake Book (``codea1_nomb``) and at α = 0 / 1 (``codea1_a0``,
``codea1_a1``), and ``codea1_boundary`` (codea1 with the boundary tests; ``codea1`` is the default
``make run``); every arm but the ceiling and ``codea1_boundary`` trains with ``lab.golden_tests=sparse``;
seeds 1..N set ``seed`` and ``data.seed``
— each ``dvc exp run evaluate -S mode=... -S seed=... -n lc-<tag>-<mode>-s<seed>`` (prepare → warmstart → train
→ evaluate; ``register`` is not run and ``tracking.register=false``, so a comparison never touches the model
registry). It then reads every experiment's ``outputs/eval/metrics.json`` and ``outputs/train/history.csv`` and
writes ``<out>/`` (default ``outputs/lab_compare/``): ``table.md`` / ``table.json`` (mean ± 95 % CI over seeds
per mode, each arm's paired deltas vs ``golden_sparse`` per seed, the per-seed table), ``rewards.png``,
``mistake_book.png`` (vs the paper's §15.4 figure), ``report.html``,
``runs/<name>/`` and ``dvc.log``; prints the table and the wall time. Exit 1 when an experiment failed.

How it runs them: ``dvc exp run --queue`` per experiment, then ``dvc exp run --run-all --jobs N``. Each experiment
runs in an isolated temp copy (``.dvc/tmp/exps``), the workspace is never touched, and results are read from the
experiment commit (``git show <refs/exps/..>:<file>``); each experiment stays a git ref under ``refs/exps``
(``dvc exp show``; ``dvc exp remove -A``). Files not committed yet are copied in with ``-C``. The metrics files
must not be git-ignored (DVC cannot commit ignored files into the experiment; this repository's ``.gitignore``
keeps them versioned): otherwise the comparison stops with a clear error before queueing anything. A running
comparison holds ``.dvc/tmp/lab_compare.lock`` (``flock``): a second one in the same repo, which would share
DVC's queue and edit the same ``params.yaml`` while queueing, stops with a clear error; ``--collect-only`` takes
no lock and reads only results: ``<out>/runs/<name>/`` when that holds the experiments (a published
comparison, ``docs/lab_compare/``), else the experiment commits. MLflow: queued runs log to their temp copy's
``mlflow/`` store (dropped with it).
Prepare and warmstart are shared through DVC (unchanged stage / run cache) only where their params agree:
both read ``seed`` and ``lab.golden_tests`` and warmstart also reads ``mode``, so they run once per seed (and
coverage, and mode) — except where an experiment's params for them equal the committed ``dvc.lock``'s (seed 1
of the arms on the default coverage): DVC then wants the committed outputs by hash, which a clone does not have
(they are not byte-reproducible: timings in reports), and reruns the stage in each such experiment (a cost
in wall time: a warm start per such codea1 arm).

The numbers (aggregates, table, plots, HTML) are computed by ``codea1_core/evaluation/comparison.py``; this flow plans,
runs, collects and writes.
What it does not: change the pipeline, or pick a winner (read the table with its std and number of seeds).

Run: ``python -m tools.lab_compare [--seeds 5] [--modes golden_sparse,codea1,...] [--quick]
[--jobs 1] [--out DIR] [--collect-only TAG] [key=value ...]``
(``make lab-compare``). Values go to ``dvc exp run -S`` as YAML: write strings that look like YAML keywords
quoted, e.g. ``"tracking.backend='null'"``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from codea1_core.atomic import write_bytes_atomic, write_text_atomic
from codea1_core.evaluation.comparison import (
    MODES,
    Experiment,
    RunResult,
    aggregate,
    mistake_book_chart,
    paired,
    parse_history,
    report_html,
    rewards_chart,
    table_markdown,
)
from flows.common import UserError, child_env, run_user_errors
from flows.prefect_server import shared_api

QUICK_OVERRIDES = [
    "orchestration.max_steps=2",
    "eval.n_samples=2",
    "eval.k_list=[1, 2]",  # pass@k needs k <= n samples (checked at load)
    "rollout.n_code=2",
    "rollout.n_tests=2",
    "lab.warmstart_epochs=1",
    "lab.warmstart_code_epochs=0",
]
"""``--quick`` (tests, smoke): one seed and a tiny run, passed to every experiment."""
COMMON_OVERRIDES = ["tracking.register=false"]
"""Every experiment: no model versions in the registry (``register`` is not run either; nothing is promoted)."""
EVAL_FILE = "outputs/eval/metrics.json"
HISTORY_FILE = "outputs/train/history.csv"
HISTORY_JSON = "history.json"
"""The training history as :func:`write_outputs` stores it in ``runs/<name>/`` (parsed, beside ``metrics.json``)."""
RUN_FILE = "run.json"
"""Read where present beside an experiment's files in ``runs/<name>/``: its ``wall_s``, ``load_before`` and
``commit`` (the committed comparison in ``docs/lab_compare/runs/`` carries one per experiment)."""
# ------------------------------------------------------------------------------------------------
# Plan
# ------------------------------------------------------------------------------------------------


def plan(modes: Sequence[str], seeds: int, extra: Sequence[str], tag: str) -> list[Experiment]:
    """Experiments for every (seed, mode), seed-major; names ``lc-<tag>-<mode>-s<seed>`` (valid git ref names)."""
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise UserError(f"--modes: unknown mode(s) {unknown}; choose from {sorted(MODES)}")
    if seeds < 1:
        raise UserError(f"--seeds: expected >= 1, got {seeds}")
    out = []  # seed-major: an interrupted run still holds every mode for its first seeds
    for seed in range(1, seeds + 1):
        for mode in modes:
            overrides = (*MODES[mode], f"seed={seed}", f"data.seed={seed}", *extra)
            out.append(Experiment(f"lc-{tag}-{mode}-s{seed}", mode, seed, overrides))
    return out


def validate(params: Path, experiments: Sequence[Experiment]) -> None:
    """Every experiment's overrides must load (one clear ConfigError otherwise), before anything is queued."""
    from codea1_core.config import load_config

    for exp in experiments:
        load_config(params, list(exp.overrides))


# ------------------------------------------------------------------------------------------------
# Run (DVC queue)
# ------------------------------------------------------------------------------------------------


def _cmd(args: list[str], repo: Path, log: io.TextIOBase | None = None) -> str:
    proc = subprocess.run(args, cwd=repo, env=child_env(), capture_output=True, text=True, check=False)
    if log is not None:
        log.write(f"$ {' '.join(args)}\n{proc.stdout}{proc.stderr}\n")
        log.flush()
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise UserError(f"`{' '.join(args[:4])} ...` failed (exit {proc.returncode}): {' | '.join(tail)}")
    return proc.stdout


def untracked_paths(repo: Path, exclude: Sequence[str] = ()) -> list[str]:
    """Not-ignored files/dirs git does not track yet (new dirs collapsed): copied into each queued experiment.

    Left out: symlinks (DVC's copy follows them: a ``.venv`` link would copy a whole environment) and anything
    overlapping ``exclude`` (stage outputs, e.g. a user's checkpoints, must never leak into an experiment).
    """
    out = _cmd(["git", "ls-files", "--others", "--exclude-standard", "--directory"], repo)
    paths = [line.rstrip("/") for line in out.splitlines() if line.strip()]
    excl = [Path(e) for e in exclude]

    def overlaps(path: Path) -> bool:
        return any(path == e or e in path.parents or path in e.parents for e in excl)

    return [p for p in paths if not (repo / p).is_symlink() and not overlaps(Path(p))]


def queue_and_run(repo: Path, experiments: Sequence[Experiment], jobs: int, out: Path, log: Any) -> None:
    """``dvc exp run --queue evaluate -S ... -n NAME [-C PATH ...]`` per experiment, then ``--run-all``."""
    exclude = [*_stage_outs(repo), str(out.relative_to(repo)) if out.is_relative_to(repo) else ""]
    copy = [a for p in untracked_paths(repo, [e for e in exclude if e]) for a in ("-C", p)]
    params = repo / "params.yaml"
    before = params.read_bytes()
    try:
        for exp in experiments:
            sets = [a for o in exp.overrides for a in ("-S", o)]
            _cmd(["dvc", "exp", "run", "--queue", "evaluate", *sets, "-n", exp.name, *copy], repo, log)
    finally:
        if params.read_bytes() != before:  # DVC restores it; never leave the user's params changed
            params.write_bytes(before)
    proc = subprocess.run(
        ["dvc", "exp", "run", "--run-all", "--jobs", str(jobs)],
        cwd=repo,
        env=child_env(),
        stdout=log,
        stderr=log,
    )
    log.write(f"# dvc exp run --run-all: exit {proc.returncode}\n")


def queue_can_return_results(repo: Path) -> bool:
    """Queued runs return only what their experiment commit holds: the metrics files must not be git-ignored."""
    codes = [
        subprocess.run(["git", "check-ignore", "-q", rel], cwd=repo, check=False).returncode
        for rel in (EVAL_FILE, HISTORY_FILE)
    ]
    return codes == [1, 1]  # 1: not ignored (0: ignored; 128: not a git repo)


def _stage_outs(repo: Path) -> list[str]:
    """Every out/metrics/plots path of ``dvc.yaml`` plus the ``.gitignore`` DVC writes beside them."""
    import yaml

    stages = (yaml.safe_load((repo / "dvc.yaml").read_text()) or {}).get("stages", {})
    paths = set()
    for stage in stages.values():
        for kind in ("outs", "metrics", "plots"):
            for entry in stage.get(kind, []):
                path = next(iter(entry)) if isinstance(entry, dict) else entry
                paths.update({path, str(Path(path).parent / ".gitignore")})
    return sorted(p for p in paths if not p.startswith(".."))


LOCK = Path(".dvc") / "tmp" / "lab_compare.lock"
"""Held (``flock``) by a running comparison from its start to its end; it holds the pid."""


@contextlib.contextmanager
def comparison_lock(repo: Path) -> Iterator[None]:
    """Hold :data:`LOCK` for a comparison; a clear error when another comparison in ``repo`` holds it.

    Two comparisons in one repository would share DVC's queue (each ``--run-all`` runs whatever is queued,
    the other's experiments included) and both edit ``params.yaml`` while queueing (each puts back what it
    read first). The kernel releases the lock when its process dies, however it dies.
    """
    path = repo / LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "unknown"
            raise UserError(
                f"another lab-compare is running in {repo} (pid {owner}; {path} is locked): wait for it or stop "
                "it first. `--collect-only TAG` reads the results so far."
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)


# ------------------------------------------------------------------------------------------------
# Collect
# ------------------------------------------------------------------------------------------------


def recorded_wall_s(table_json: Path, default: float) -> float:
    """``wall_s`` of an earlier ``table.json`` (re-collecting keeps the comparison's real wall time)."""
    try:
        value = json.loads(table_json.read_text())["wall_s"]
    except (OSError, ValueError, KeyError, TypeError):
        return default
    return float(value) if isinstance(value, int | float) and value > default else default


def collect_dir(runs: Path, experiments: Sequence[Experiment]) -> list[RunResult]:
    """Results from ``runs/<name>/``: ``metrics.json``, the history as the stage wrote it (``history.csv``) or as
    :func:`write_outputs` stores it (:data:`HISTORY_JSON`), and :data:`RUN_FILE` where present."""
    results = []
    for exp in experiments:
        res, folder = RunResult(exp), runs / exp.name
        try:
            res.metrics = json.loads((folder / Path(EVAL_FILE).name).read_text())
            csv = folder / Path(HISTORY_FILE).name
            if csv.is_file() or not (folder / HISTORY_JSON).is_file():
                res.history = parse_history(csv.read_text())
            else:
                res.history = json.loads((folder / HISTORY_JSON).read_text())
            if (folder / RUN_FILE).is_file():
                res.run = json.loads((folder / RUN_FILE).read_text())
        except FileNotFoundError:
            res.error = "no outputs (not run yet, or it failed: see dvc.log)"
        except json.JSONDecodeError as exc:
            res.error = f"unreadable {folder / Path(EVAL_FILE).name}: {exc}"
        results.append(res)
    return results


def exp_refs(repo: Path) -> dict[str, str]:
    """Experiment name -> commit, from ``refs/exps/<..>/<baseline>/<name>``."""
    out = _cmd(["git", "for-each-ref", "--format=%(refname) %(objectname)", "refs/exps"], repo)
    refs = {}
    for line in out.splitlines():
        ref, _, sha = line.partition(" ")
        if ref.count("/") >= 4 and not ref.startswith(("refs/exps/celery", "refs/exps/exec")):
            refs[ref.rsplit("/", 1)[1]] = sha
    return refs


def collect(repo: Path, experiments: Sequence[Experiment]) -> list[RunResult]:
    """Read each experiment's eval metrics and training history from its experiment commit."""
    refs = exp_refs(repo)
    results = []
    for exp in experiments:
        res = RunResult(exp)
        sha = refs.get(exp.name)
        if sha is None:
            res.error = "no experiment commit (failed or not run; see dvc_queue.log / `dvc queue logs`)"
        else:
            try:
                res.metrics = json.loads(_cmd(["git", "show", f"{sha}:{EVAL_FILE}"], repo))
                res.history = parse_history(_cmd(["git", "show", f"{sha}:{HISTORY_FILE}"], repo))
            except (UserError, json.JSONDecodeError) as exc:
                res.error = f"unreadable outputs in {sha[:8]}: {exc}"
        results.append(res)
    return results


def write_outputs(out: Path, results: Sequence[RunResult], wall_s: float) -> str:
    """Write table.md/json, plots, report.html and runs/<name>/; return the markdown table."""
    table = aggregate(results)
    table_md = table_markdown(table, results)
    for res in results:
        if not res.error:
            write_text_atomic(
                out / "runs" / res.experiment.name / "metrics.json", json.dumps(res.metrics, indent=1)
            )
            write_text_atomic(out / "runs" / res.experiment.name / HISTORY_JSON, json.dumps(res.history))
    experiments = {
        r.experiment.name: {
            "mode": r.experiment.mode,
            "seed": r.experiment.seed,
            "overrides": list(r.experiment.overrides),
            "error": r.error or None,
            **r.run,
        }
        for r in results
    }
    timed = [r.run["wall_s"] for r in results if isinstance(r.run.get("wall_s"), int | float)]
    experiments_wall_s = round(sum(timed), 1) if timed and len(timed) == len(results) else None
    commits = sorted({str(r.run["commit"]) for r in results if r.run.get("commit")})
    write_text_atomic(
        out / "table.json",
        json.dumps(
            {
                "table": table,
                "paired": {m: paired(results, m) for m in MODES},
                "experiments": experiments,
                "wall_s": wall_s,
                "experiments_wall_s": experiments_wall_s,
                "commits": commits,
            },
            indent=1,
        ),
    )
    write_text_atomic(out / "table.md", table_md)
    charts = {"rewards": rewards_chart(results), "mistake_book": mistake_book_chart(results)}
    for name, png in charts.items():
        write_bytes_atomic(out / f"{name}.png", png)
    total = f", {experiments_wall_s / 60:.1f} min summed over the experiments" if experiments_wall_s else ""
    notes = (
        f"{len(results)} experiments at {', '.join(commits) or 'an unrecorded commit'}, wall time "
        f"{wall_s / 60:.1f} min{total}; mean ± 95 % CI over seeds."
    )
    write_text_atomic(out / "report.html", report_html(table_md, charts, results, notes))
    return table_md


# ------------------------------------------------------------------------------------------------
# Entry point
# ------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.lab_compare``; exit 0 when every experiment produced results, 1 otherwise."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 1..N per mode (default 5)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma list from {list(MODES)}")
    parser.add_argument(
        "--quick", action="store_true", help="1 seed and tiny runs: " + " ".join(QUICK_OVERRIDES)
    )
    parser.add_argument("--jobs", type=int, default=1, help="experiments in parallel (default 1)")
    parser.add_argument("--out", default="outputs/lab_compare", help="output folder")
    parser.add_argument("--repo", default=".", help="repository root (default: cwd)")
    parser.add_argument("--collect-only", metavar="TAG", help="skip running; collect experiments lc-TAG-*")
    parser.add_argument("overrides", nargs="*", help="key=value passed to every experiment")
    args = parser.parse_args(argv)
    outcome: dict[str, int] = {}

    def run() -> None:
        repo = Path(args.repo).resolve()
        with contextlib.ExitStack() as stack:
            if not args.collect_only:  # collecting only reads results: safe beside a running comparison
                stack.enter_context(comparison_lock(repo))
            compare(repo)

    def compare(repo: Path) -> None:
        tag = args.collect_only or time.strftime("%Y%m%d-%H%M%S")
        seeds = 1 if args.quick else args.seeds
        extra = [*(QUICK_OVERRIDES if args.quick else []), *COMMON_OVERRIDES, *args.overrides]
        experiments = plan([m for m in args.modes.split(",") if m], seeds, extra, tag)
        if not args.collect_only:
            validate(repo / "params.yaml", experiments)
        out, start = repo / args.out, time.monotonic()
        from_runs = bool(args.collect_only) and (out / "runs" / experiments[0].name).is_dir()
        if not args.collect_only:
            if not queue_can_return_results(repo):
                raise UserError(
                    f"{EVAL_FILE} or {HISTORY_FILE} is git-ignored (or {repo} is not a git repository): each "
                    "experiment runs in DVC's queue and returns only what its experiment commit holds"
                )
            out.mkdir(parents=True, exist_ok=True)
            print(f"lab-compare: {len(experiments)} experiments (tag {tag}), log {out / 'dvc.log'}")
            # one Prefect API for every experiment's stages (flows.prefect_server), not one per stage
            with shared_api(), open(out / "dvc.log", "w") as log:
                queue_and_run(repo, experiments, args.jobs, out, log)
        wall_s = time.monotonic() - start
        if args.collect_only:  # keep the wall time of the run that produced the results, when it was recorded
            wall_s = recorded_wall_s(out / "table.json", default=wall_s)
        results = collect_dir(out / "runs", experiments) if from_runs else collect(repo, experiments)
        print(write_outputs(out, results, wall_s))
        print(f"wall time: {wall_s:.0f} s ({wall_s / 60:.1f} min); outputs in {out}")
        timed = [r.run["wall_s"] for r in results if isinstance(r.run.get("wall_s"), int | float)]
        if timed:
            print(
                f"experiments' own wall time, summed over every session that ran them: {sum(timed) / 60:.1f} min "
                f"({len(timed)} of {len(results)} timed)"
            )
        outcome["failed"] = sum(1 for r in results if r.error)

    code = run_user_errors(run)
    return code or (1 if outcome.get("failed") else 0)


if __name__ == "__main__":
    sys.exit(main())
