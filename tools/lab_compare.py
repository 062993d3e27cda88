"""``make lab-compare``: the paper's comparison in small, as DVC experiments (docs/method.md §14, §15, D10).

What it does: one DVC experiment per (mode, seed) — the arms of ``codea1_core.evaluation.comparison.MODES``: ``golden_sparse``
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

Two runners (``--runner``, default ``auto``):
  * ``queue``: ``dvc exp run --queue`` + ``dvc exp run --run-all --jobs N``. Each experiment runs in an isolated
    temp copy (``.dvc/tmp/exps``), the workspace is never touched, and results are read from the experiment
    commit (``git show <refs/exps/..>:<file>``). Files not committed yet are copied in with ``-C``. It needs the
    metrics files NOT git-ignored (DVC cannot commit ignored files into the experiment), which is not the case
    while ``.gitignore`` has ``/outputs/``; ``auto`` then falls back to
  * ``workspace``: experiments one after another in the workspace. Before, ``params.yaml``, ``dvc.lock`` and
    every stage output of ``dvc.yaml`` are moved to ``.dvc/tmp/lab_compare_backup``; ``params.yaml`` is reset
    before each experiment; each run's two files are copied to ``runs/<name>/``; afterwards (also on failure
    or Ctrl-C) the experiments' outputs are deleted and the user's files moved back. While it runs, the
    workspace holds the experiment being run — do not use the repo for anything else meanwhile. A running
    comparison holds ``.dvc/tmp/lab_compare.lock`` (``flock``): a second one in the same repo stops with a
    clear error, and ``--collect-only`` never touches the workspace, so peeking at a running comparison's
    results is safe. After a hard kill (SIGKILL, power loss) the kernel drops the lock and the next start
    restores the workspace first; ``--resume TAG`` then runs only the experiments without results in
    ``runs/``. Content-addressed caches the stages keep beside their outputs (``outputs/eval/mutants``,
    ``outputs/eval/baseline_cache``) stay: keyed by content, they only save later runs work.
Either way each experiment also stays a git ref under ``refs/exps`` (``dvc exp show``; ``dvc exp remove -A``).
MLflow: queued runs log to their temp copy's ``mlflow/`` store (dropped with it); workspace runs log to the
user's store (``tracking.*``), as any ``dvc exp run`` would.
Prepare and warmstart are shared through DVC (unchanged stage / run cache) only where their params agree:
both read ``seed`` and ``lab.golden_tests`` and warmstart also reads ``mode``, so they run once per seed (and
coverage, and mode) — except where an experiment's params for them equal the committed ``dvc.lock``'s (seed 1
of the arms on the default coverage): DVC then wants the committed outputs by hash, which a clone does not have
(they are not byte-reproducible: timings in reports), and reruns the stage in each such experiment (measured:
prepare ~4 s; warmstart ~2 min for each of the four codea1 arms at seed 1).

The numbers (aggregates, table, plots, HTML) are computed by ``codea1_core/evaluation/comparison.py``; this flow plans,
runs, collects and writes.
What it does not: change the pipeline, or pick a winner (read the table with its std and number of seeds).

Run: ``python -m tools.lab_compare [--seeds 5] [--modes golden_sparse,codea1,...] [--quick]
[--runner auto|queue|workspace] [--jobs 1] [--out DIR] [--collect-only TAG] [--resume TAG] [key=value ...]``
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
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from codea1_core.atomic import atomic_dir, write_bytes_atomic, write_text_atomic
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
RUN_FILE = "run.json"
"""Beside each workspace experiment's two files: ``wall_s``, ``load_before`` and ``commit``."""
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


BACKUP = Path(".dvc") / "tmp" / "lab_compare_backup"
"""Where the workspace runner keeps the user's params, lock and stage outputs while experiments run."""


LOCK = Path(".dvc") / "tmp" / "lab_compare.lock"
"""Held (``flock``) by a running comparison, from its start-up restore to its final one; it holds the pid."""


@contextlib.contextmanager
def workspace_lock(repo: Path) -> Iterator[None]:
    """Hold :data:`LOCK` for a comparison; a clear error when another comparison in ``repo`` holds it.

    Without it a second start (a ``--resume`` typed twice, a peek at the results) took the running comparison's
    backup for one left by a killed run and restored it under the experiment being run (seen for real: the
    experiment lost ``data/prepared`` and failed, and the user's workspace was never put back). The kernel
    releases the lock when its process dies, however it dies, so a hard-killed run's backup is restorable.
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
                "it first. `--collect-only TAG` reads the results so far without touching the workspace."
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)


def _workspace_paths(repo: Path) -> list[str]:
    return ["params.yaml", "dvc.lock", *_stage_outs(repo)]


INDEX_FILE = "git-index-entries.txt"
"""In :data:`BACKUP`: ``git ls-files --stage`` of the workspace paths before the experiments (``dvc exp run``
stages the files it writes; the user's staging area is put back as it was)."""


def _save_index(repo: Path, paths: Sequence[str], target: Path) -> None:
    """Record the git index entries of ``paths`` (nothing to record outside a git repository)."""
    proc = subprocess.run(["git", "ls-files", "--stage", "--", *paths], cwd=repo, capture_output=True,
                          text=True, check=False)  # fmt: skip
    if proc.returncode == 0:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(proc.stdout)


def _restore_index(repo: Path, saved: Path) -> None:
    """Put the recorded index entries back: what the experiments staged is unstaged, nothing else changes."""
    if not saved.is_file():
        return
    paths = _workspace_paths(repo)
    entries = {}
    for line in saved.read_text().splitlines():
        info, _, path = line.partition("\t")
        mode, sha, _stage = info.split()
        entries[path] = (mode, sha)
    now = subprocess.run(["git", "ls-files", "--stage", "--", *paths], cwd=repo, capture_output=True, text=True,
                         check=False)  # fmt: skip
    current = {line.partition("\t")[2]: tuple(line.split()[:2]) for line in now.stdout.splitlines()}
    for path in sorted(set(current) | set(entries)):
        if current.get(path) == entries.get(path):
            continue
        if path in entries:
            mode, sha = entries[path]
            args = ["git", "update-index", "--add", "--cacheinfo", f"{mode},{sha},{path}"]
        else:
            args = ["git", "rm", "--cached", "-q", "--", path]
        subprocess.run(args, cwd=repo, capture_output=True, check=False)


def restore_workspace(repo: Path, new_dirs: Sequence[Path] = ()) -> bool:
    """Delete the experiments' outputs and move the user's files back from :data:`BACKUP`.

    Called after every workspace run, and at start-up when a run was killed hard (SIGKILL, power loss) and
    left its backup behind. Returns False when there was no backup. ``new_dirs``: folders the experiments
    created, removed (deepest first) when empty.
    """
    backup = repo / BACKUP
    if not backup.is_dir():
        return False
    _restore_index(repo, backup / INDEX_FILE)
    for rel in _workspace_paths(repo):
        target = repo / rel
        if not (backup / rel).exists() and rel == "params.yaml":
            continue  # never delete the params file without a copy to put back
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        if (backup / rel).exists():
            target.parent.mkdir(parents=True, exist_ok=True)  # an experiment's stage may have removed it
            os.replace(backup / rel, target)
    shutil.rmtree(backup, ignore_errors=True)
    for folder in new_dirs:
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    return True


def source_commit(repo: Path) -> str:
    """``HEAD``'s commit, with ``+changes`` when tracked files differ from it (what the experiments ran)."""
    try:
        sha = _cmd(["git", "rev-parse", "--short=7", "HEAD"], repo).strip()
    except UserError:
        return "unknown"
    same = subprocess.run(
        ["git", "diff", "--quiet", "HEAD", "--"], cwd=repo, capture_output=True, check=False
    )
    return sha if same.returncode == 0 else f"{sha}+changes"


def run_in_workspace(repo: Path, experiments: Sequence[Experiment], runs: Path, log: Any) -> None:
    """``dvc exp run evaluate -S ... -n NAME`` one after another in the workspace, outputs copied to ``runs/``.

    Before: ``params.yaml``, ``dvc.lock`` and every stage output are moved aside (:data:`BACKUP`);
    ``params.yaml`` is reset before each experiment (``-S`` edits it in place); after (also on failure or
    Ctrl-C) :func:`restore_workspace` puts the workspace back as before. Each finished experiment's files are
    in ``runs/<name>/`` at once, so a killed comparison resumes where it stopped (``--resume TAG``), with
    :data:`RUN_FILE` (its wall time, the load average before it, the commit it ran), so that the wall time of
    a comparison run over several sessions is still known.
    """
    commit = source_commit(repo)  # before params.yaml is moved aside
    if (repo / BACKUP).exists():
        raise UserError(f"{repo / BACKUP} exists: an earlier lab-compare was interrupted; restore it first")
    paths = _workspace_paths(repo)
    params = (repo / "params.yaml").read_bytes()
    parents = {q for rel in paths for q in (repo / rel).parents if repo in q.parents}
    new_dirs = sorted((q for q in parents if not q.exists()), key=lambda q: -len(q.parts))
    _save_index(repo, paths, repo / BACKUP / INDEX_FILE)
    for rel in paths:
        if (repo / rel).exists():
            (repo / BACKUP / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(repo / rel, repo / BACKUP / rel)
    try:
        for exp in experiments:
            (repo / "params.yaml").write_bytes(params)
            sets = [a for o in exp.overrides for a in ("-S", o)]
            args = ["dvc", "exp", "run", "evaluate", *sets, "-n", exp.name]
            log.write(f"$ {' '.join(args)}\n")
            log.flush()  # the experiment's output streams into the same file (tail -f it)
            started, load = time.monotonic(), os.getloadavg()[0]
            proc = subprocess.run(
                args, cwd=repo, env=child_env(), stdout=log, stderr=subprocess.STDOUT, check=False
            )
            if proc.returncode != 0:
                log.write(f"# {exp.name} failed: exit {proc.returncode}\n")
                continue
            run = {"wall_s": round(time.monotonic() - started, 1), "load_before": load, "commit": commit}
            with atomic_dir(runs / exp.name) as tmp:  # complete or absent: what --resume relies on
                for rel in (EVAL_FILE, HISTORY_FILE):
                    shutil.copy2(repo / rel, tmp / Path(rel).name)
                (tmp / RUN_FILE).write_text(json.dumps(run))
    finally:
        restore_workspace(repo, new_dirs)


def recorded_wall_s(table_json: Path, default: float) -> float:
    """``wall_s`` of an earlier ``table.json`` (re-collecting keeps the comparison's real wall time)."""
    try:
        value = json.loads(table_json.read_text())["wall_s"]
    except (OSError, ValueError, KeyError, TypeError):
        return default
    return float(value) if isinstance(value, int | float) and value > default else default


def finished_in(runs: Path, experiments: Sequence[Experiment]) -> list[Experiment]:
    """Experiments whose results are already in ``runs/<name>/`` (skipped by ``--resume``)."""
    names = (Path(EVAL_FILE).name, Path(HISTORY_FILE).name)
    return [e for e in experiments if all((runs / e.name / n).is_file() for n in names)]


def collect_dir(runs: Path, experiments: Sequence[Experiment]) -> list[RunResult]:
    """Results from ``runs/<name>/{metrics.json,history.csv}`` (workspace mode)."""
    results = []
    for exp in experiments:
        res, folder = RunResult(exp), runs / exp.name
        try:
            res.metrics = json.loads((folder / Path(EVAL_FILE).name).read_text())
            res.history = parse_history((folder / Path(HISTORY_FILE).name).read_text())
            if (folder / RUN_FILE).is_file():
                res.run = json.loads((folder / RUN_FILE).read_text())
        except FileNotFoundError:
            res.error = "no outputs (not run yet, or it failed: see dvc.log)"
        except json.JSONDecodeError as exc:
            res.error = f"unreadable {folder / Path(EVAL_FILE).name}: {exc}"
        results.append(res)
    return results


# ------------------------------------------------------------------------------------------------
# Collect
# ------------------------------------------------------------------------------------------------


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
            write_text_atomic(out / "runs" / res.experiment.name / "history.json", json.dumps(res.history))
    experiments = {
        r.experiment.name: {"mode": r.experiment.mode, "seed": r.experiment.seed,
                            "overrides": list(r.experiment.overrides), "error": r.error or None, **r.run}
        for r in results
    }  # fmt: skip
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
    parser.add_argument(
        "--resume",
        metavar="TAG",
        help="continue the comparison TAG (workspace runner): finished runs are kept",
    )
    parser.add_argument(
        "--runner",
        choices=["auto", "queue", "workspace"],
        default="auto",
        help="queue (isolated temp dirs; needs the metrics files not git-ignored) or workspace (sequential, "
        "workspace restored afterwards); auto picks queue when it can return results",
    )
    parser.add_argument("overrides", nargs="*", help="key=value passed to every experiment")
    args = parser.parse_args(argv)
    outcome: dict[str, int] = {}

    def run() -> None:
        repo = Path(args.repo).resolve()
        with contextlib.ExitStack() as stack:
            if not args.collect_only:  # collecting reads runs/ only: safe beside a running comparison
                stack.enter_context(workspace_lock(repo))
                if restore_workspace(repo):  # a run killed hard left the user's files aside: put them back
                    print(f"lab-compare: restored the workspace left by an interrupted run ({BACKUP})")
            compare(repo)

    def compare(repo: Path) -> None:
        tag = args.collect_only or args.resume or time.strftime("%Y%m%d-%H%M%S")
        seeds = 1 if args.quick else args.seeds
        extra = [*(QUICK_OVERRIDES if args.quick else []), *COMMON_OVERRIDES, *args.overrides]
        experiments = plan([m for m in args.modes.split(",") if m], seeds, extra, tag)
        if not args.collect_only:  # mid-run, params.yaml is the running experiment's
            validate(repo / "params.yaml", experiments)
        out, start = repo / args.out, time.monotonic()
        runner = args.runner
        if runner == "auto":
            runner = "queue" if queue_can_return_results(repo) and not args.resume else "workspace"
        if args.collect_only:
            runner = "workspace" if (out / "runs" / experiments[0].name).is_dir() else "queue"
        else:
            out.mkdir(parents=True, exist_ok=True)
            print(
                f"lab-compare: {len(experiments)} experiments (tag {tag}, {runner} runner), log {out / 'dvc.log'}"
            )
            if runner == "workspace" and args.runner == "auto":
                print(f"  ({EVAL_FILE} is git-ignored, so queued experiments could not return it)")
            done = finished_in(out / "runs", experiments) if args.resume else []
            if args.resume:
                print(f"  resuming: {len(done)} finished, {len(experiments) - len(done)} to run")
            if runner == "workspace":
                print(
                    f"  interrupted? continue with: python -m tools.lab_compare --resume {tag} [same options]"
                )
            # one Prefect API for every experiment's stages (flows.prefect_server), not one per stage
            with shared_api(), open(out / "dvc.log", "a" if args.resume else "w") as log:
                todo = [e for e in experiments if e not in done]
                if runner == "queue":
                    queue_and_run(repo, todo, args.jobs, out, log)
                else:
                    run_in_workspace(repo, todo, out / "runs", log)
        wall_s = time.monotonic() - start
        if args.collect_only:  # keep the wall time of the run that produced the results, when it was recorded
            wall_s = recorded_wall_s(out / "table.json", default=wall_s)
        results = collect(repo, experiments) if runner == "queue" else collect_dir(out / "runs", experiments)
        print(write_outputs(out, results, wall_s))
        print(f"wall time: {wall_s:.0f} s ({wall_s / 60:.1f} min); outputs in {out}")
        timed = [r.run["wall_s"] for r in results if isinstance(r.run.get("wall_s"), int | float)]
        if timed:
            print(f"experiments' own wall time, summed over every session that ran them: {sum(timed) / 60:.1f} min "
                  f"({len(timed)} of {len(results)} timed)")  # fmt: skip
        outcome["failed"] = sum(1 for r in results if r.error)

    code = run_user_errors(run)
    return code or (1 if outcome.get("failed") else 0)


if __name__ == "__main__":
    sys.exit(main())
