"""``tools/lab_compare.py``: plan, aggregation, table, collection from experiment refs; one slow real run.

The fast tests use synthetic metrics and a real (tiny) git repository for the ``refs/exps`` collection; the
``slow`` test runs ``--quick`` with two modes through DVC's experiment queue in a temp clone of the repo.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from codea1_core.config import ConfigError
from codea1_core.evaluation import comparison as cmp
from flows.common import UserError
from tools import lab_compare as lc


def _result(mode: str, seed: int, pass1: float, reward: float, error: str = "") -> cmp.RunResult:
    exp = cmp.Experiment(f"lc-t-{mode}-s{seed}", mode, seed, ())
    metrics = {
        "warmstart/code/lab_heldout_seen/base/pass@1": 1.0,
        "code/lab_heldout_seen/base/pass@1": pass1,
        "delta/code/lab_heldout_seen/base/pass@1": pass1 - 1.0,
        "code/lab_heldout/base/pass@1": pass1 / 4,
        "test/lab_heldout/pass@5": 2 * pass1,
        "test/lab_heldout/mut@5": 50.0,
        "test/lab_heldout/mul": pass1 / 2,
    }
    history = [
        {"iteration": 1.0, "code/reward_mean": 0.1, "test/reward_mean": 0.2, "mistake_book/added": 3.0},
        {"iteration": 2.0, "code/reward_mean": reward, "test/reward_mean": float("nan")},
    ]
    return cmp.RunResult(exp, {} if error else metrics, [] if error else history, error)


# ------------------------------------------------------------------------------------------------
# Plan and validation
# ------------------------------------------------------------------------------------------------


def test_plan_sets_both_seeds_and_the_mistake_book_ablation():
    exps = lc.plan(["golden_sparse", "codea1_nomb"], 2, ["eval.n_samples=2"], "tag")
    assert [e.name for e in exps] == [
        "lc-tag-golden_sparse-s1",
        "lc-tag-codea1_nomb-s1",
        "lc-tag-golden_sparse-s2",
        "lc-tag-codea1_nomb-s2",
    ]
    nomb = exps[3]
    assert nomb.mode == "codea1_nomb" and nomb.seed == 2
    assert {"mode=codea1", "mistake_book.enabled=false", "seed=2", "data.seed=2", "eval.n_samples=2"} <= set(
        nomb.overrides
    )
    assert nomb.overrides[-1] == "eval.n_samples=2"  # user overrides come last, so they win


@pytest.mark.parametrize(
    ("modes", "seeds", "match"), [(["golden_sparse", "nope"], 1, "nope"), (["golden_sparse"], 0, "seeds")]
)
def test_plan_rejects_bad_arguments(modes, seeds, match):
    with pytest.raises(UserError, match=match):
        lc.plan(modes, seeds, [], "t")


def test_validate_names_the_bad_override_key(repo_root):
    exps = lc.plan(["golden_sparse"], 1, ["reward.alpha=lots"], "t")
    with pytest.raises(ConfigError, match="reward.alpha"):
        lc.validate(repo_root / "params.yaml", exps)
    lc.validate(repo_root / "params.yaml", lc.plan(list(lc.MODES), 1, lc.QUICK_OVERRIDES, "t"))


def test_main_reports_bad_mode_as_one_line_exit_2(capsys, tmp_path):
    assert lc.main(["--modes", "golden_sparse,bogus", "--repo", str(tmp_path)]) == 2
    assert "bogus" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# Aggregation and table
# ------------------------------------------------------------------------------------------------


def test_parse_history_and_final_value_skip_missing_and_nan():
    rows = cmp.parse_history("iteration,code/reward_mean,note\n1,0.5,a\n2,,b\n3,nan,c\n")
    assert rows[0] == {"iteration": 1.0, "code/reward_mean": 0.5, "note": "a"}
    assert "code/reward_mean" not in rows[1]
    assert cmp.final_value(rows, "code/reward_mean") == 0.5  # nan at iteration 3 is not a value
    assert cmp.final_value(rows, "absent") is None


def test_aggregate_mean_and_sample_std_per_mode_ignoring_failed_runs():
    results = [_result("codea1", s, p, r) for s, p, r in [(1, 10.0, 0.5), (2, 20.0, 0.7), (3, 40.0, 0.9)]]
    results += [_result("golden_sparse", 1, 5.0, 0.4), _result("golden_sparse", 2, 0.0, 0.0, error="boom")]
    table = cmp.aggregate(results)
    cell = table["codea1"]["code pass@1 held-out seen"]
    assert cell["n"] == 3 and cell["values"] == [10.0, 20.0, 40.0]
    assert cell["mean"] == pytest.approx(70 / 3)
    assert cell["std"] == pytest.approx(statistics.stdev([10.0, 20.0, 40.0]))
    assert table["codea1"]["Δ vs warm start"]["mean"] == pytest.approx(70 / 3 - 1.0)
    assert table["codea1"]["code pass@1 held-out all"]["values"] == [2.5, 5.0, 10.0]
    assert table["codea1"]["final code reward"]["mean"] == pytest.approx(0.7)
    assert table["codea1"]["final test reward"]["mean"] == pytest.approx(0.2)  # last finite value
    golden = table["golden_sparse"]["Mul"]
    assert golden["n"] == 1 and golden["mean"] == 2.5 and golden["std"] is None  # the failed seed is excluded


def test_table_markdown_rows_in_mode_order_and_failures_listed():
    results = [
        _result("codea1", 1, 10.0, 0.5),
        _result("codea1", 2, 30.0, 0.5),
        _result("golden_sparse", 1, 5.0, 0.4),
    ]
    results.append(_result("selfplay", 1, 0.0, 0.0, error="no experiment commit"))
    md = cmp.table_markdown(cmp.aggregate(results), results)
    lines = md.splitlines()
    assert lines[0].startswith(
        "| mode | seeds | warm start code pass@1 | code pass@1 held-out seen | Δ vs warm start |"
    )
    assert lines[2].startswith("| golden_sparse | 1 | 1.00 | 5.00 |")
    half = 12.706 * statistics.stdev([10.0, 30.0]) / 2**0.5  # 95 % CI, t with 1 df
    assert lines[3].startswith(f"| codea1 | 2 | 1.00 ± 0.00 | 20.00 ± {half:.2f} |")
    assert "| selfplay | 0 |" not in md and "FAILED lc-t-selfplay-s1: no experiment commit" in md
    assert "| codea1 | 1 | s1: +5.00 | +5.00 | 1/1 |" in md  # paired vs golden_sparse: only seed 1 has both
    assert "| codea1 | 2 | 1.00 | 30.00 | +29.00 |" in md  # per-seed table


# ------------------------------------------------------------------------------------------------
# Arms, confidence intervals and the paired comparison
# ------------------------------------------------------------------------------------------------


def test_arms_cover_the_papers_comparison_and_only_the_ceiling_sees_boundary_tests(repo_root):
    assert set(cmp.MODES) == {
        "golden_sparse",
        "golden_boundary",
        "selfplay",
        "codea1",
        "codea1_nomb",
        "codea1_a0",
        "codea1_a1",
        "codea1_boundary",
    }
    for mode, overrides in cmp.MODES.items():
        boundary = mode in ("golden_boundary", "codea1_boundary")
        coverage = "lab.golden_tests=boundary" if boundary else "lab.golden_tests=sparse"
        assert coverage in overrides, mode
    assert "reward.alpha=0.0" in cmp.MODES["codea1_a0"] and "reward.alpha=1.0" in cmp.MODES["codea1_a1"]
    assert cmp.BASELINE_ARM == "golden_sparse" and set(cmp.MODE_COLORS) == set(cmp.MODES)
    assert len(set(cmp.MODE_COLORS.values())) == len(cmp.MODES)
    from codea1_core.config import load_config

    cfgs = {m: load_config(repo_root / "params.yaml", cmp.MODES[m]) for m in ("codea1_a1", "golden_sparse")}
    assert cfgs["codea1_a1"].reward.alpha == 1.0 and cfgs["golden_sparse"].lab.golden_tests == "sparse"


def test_the_codea1_arm_is_the_default_run(repo_root):
    """The seed table of docs/results.md is the arm readme_numbers reads: it must be params.yaml as shipped."""
    from codea1_core.config import load_config
    from tools.readme_numbers import DEFAULT_ARM

    params = repo_root / "params.yaml"
    assert DEFAULT_ARM == "codea1"
    assert load_config(params, cmp.MODES[DEFAULT_ARM]) == load_config(params, [])
    assert load_config(params, cmp.MODES["codea1_boundary"]) != load_config(params, [])


def test_ci95_is_the_student_t_interval_of_the_mean():
    values = [6.2, 23.7, 27.4, 18.0, 20.1]
    expected = 2.776 * statistics.stdev(values) / 5**0.5  # t(0.975, 4 df) = 2.776
    assert cmp.ci95(values) == pytest.approx(expected, rel=1e-3)
    assert cmp.ci95([3.0]) is None and cmp.ci95([]) is None
    assert cmp.ci95([1.0, 2.0] * 20) == pytest.approx(1.96 * statistics.stdev([1.0, 2.0] * 20) / 40**0.5)
    scipy_stats = pytest.importorskip(
        "scipy.stats", reason="scipy (a transitive dependency here) checks the t table"
    )
    for n in (2, 3, 5, 10, 31):
        assert cmp._T975[n - 2] == pytest.approx(scipy_stats.t.ppf(0.975, n - 1), abs=1e-3), n


def test_paired_deltas_per_seed_only_where_both_arms_ran():
    results = [_result("golden_sparse", s, p, 0.1) for s, p in [(1, 10.0), (2, 20.0), (3, 30.0), (4, 5.0)]]
    results += [_result("codea1", s, p, 0.1) for s, p in [(1, 14.0), (2, 18.0), (3, 36.0)]]
    results += [_result("codea1", 4, 0.0, 0.0, error="boom"), _result("codea1", 5, 50.0, 0.1)]
    p = cmp.paired(results, "codea1")
    assert p["seeds"] == [1, 2, 3]  # seed 4: codea1 failed; seed 5: no golden_sparse run
    assert p["deltas"] == pytest.approx([4.0, -2.0, 6.0])
    assert p["wins"] == 2 and p["n"] == 3
    assert p["mean"] == pytest.approx(8 / 3)
    assert p["ci95"] == pytest.approx(4.303 * statistics.stdev([4.0, -2.0, 6.0]) / 3**0.5, rel=1e-3)
    assert cmp.paired(results, "selfplay")["n"] == 0 and cmp.paired(results, "selfplay")["mean"] is None
    md = cmp.table_markdown(cmp.aggregate(results), results)
    assert "| codea1 | 3 | s1: +4.00, s2: -2.00, s3: +6.00 | +2.67 ± " in md and "| 2/3 |" in md


def test_write_outputs_writes_every_artifact(tmp_path):
    results = [
        _result(m, s, 10.0 * s, 0.1 * s) for m in ("golden_sparse", "codea1", "codea1_nomb") for s in (1, 2)
    ]
    md = lc.write_outputs(tmp_path, results, wall_s=12.0)
    assert (tmp_path / "table.md").read_text() == md
    data = json.loads((tmp_path / "table.json").read_text())
    assert data["table"]["codea1"]["Mul"]["mean"] == pytest.approx(7.5)
    assert data["experiments"]["lc-t-golden_sparse-s2"]["seed"] == 2 and data["wall_s"] == 12.0
    assert data["paired"]["codea1"]["deltas"] == [0.0, 0.0]  # same numbers per seed as golden_sparse
    assert data["table"]["codea1"]["Mul"]["ci95"] is not None
    for png in ("rewards.png", "mistake_book.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = (tmp_path / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 2 and "lc-t-codea1_nomb-s2" in html
    assert json.loads((tmp_path / "runs" / "lc-t-codea1-s1" / "metrics.json").read_text())
    assert not list(tmp_path.rglob("*.tmp"))


def test_mean_curve_averages_seeds_per_iteration():
    results = [
        _result("codea1", 1, 1.0, 0.4),
        _result("codea1", 2, 1.0, 0.8),
        _result("golden_sparse", 1, 1.0, 0.0),
    ]
    xs, ys = cmp.mean_curve(results, "codea1", ["code/reward_mean"])
    assert xs == [1.0, 2.0] and ys == pytest.approx([0.1, 0.6])


# ------------------------------------------------------------------------------------------------
# Collection from experiment refs (real git)
# ------------------------------------------------------------------------------------------------


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    ).stdout


def test_collect_reads_outputs_from_the_experiment_commit(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "outputs" / "eval").mkdir(parents=True)
    (tmp_path / "outputs" / "train").mkdir(parents=True)
    (tmp_path / lc.EVAL_FILE).write_text(json.dumps({"test/lab_heldout/mul": 3.5}))
    (tmp_path / lc.HISTORY_FILE).write_text("iteration,code/reward_mean\n1,0.25\n")
    _git(tmp_path, "add", "-f", "outputs")
    _git(tmp_path, "commit", "-qm", "exp")
    sha = _git(tmp_path, "rev-parse", "HEAD").strip()
    _git(tmp_path, "update-ref", f"refs/exps/{sha[:2]}/{sha[2:]}/lc-t-golden_sparse-s1", sha)
    (tmp_path / lc.EVAL_FILE).write_text("{}")  # the workspace copy is not what collect reads
    exps = lc.plan(["golden_sparse"], 2, [], "t")
    ok, missing = lc.collect(tmp_path, exps)
    assert ok.error == "" and ok.metrics == {"test/lab_heldout/mul": 3.5}
    assert ok.history == [{"iteration": 1.0, "code/reward_mean": 0.25}]
    assert missing.error.startswith("no experiment commit")


def test_queue_can_return_results_only_when_metrics_are_not_git_ignored(tmp_path):
    _git(tmp_path, "init", "-q")
    assert lc.queue_can_return_results(tmp_path)
    (tmp_path / ".gitignore").write_text("/outputs/train/\n")
    assert not lc.queue_can_return_results(tmp_path)
    assert not lc.queue_can_return_results(tmp_path / "..")  # not a git repo


def test_untracked_paths_collapses_new_dirs_and_skips_symlinks(tmp_path):
    """Regression: an untracked ``.venv`` symlink was copied (followed) into every experiment."""
    _git(tmp_path, "init", "-q")
    (tmp_path / ".gitignore").write_text("ignored.txt\n")
    (tmp_path / "tracked.py").write_text("")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "base")
    (tmp_path / "ignored.txt").write_text("")
    (tmp_path / "new.py").write_text("")
    (tmp_path / "newdir").mkdir()
    (tmp_path / "newdir" / "a.py").write_text("")
    (tmp_path / ".venv").symlink_to(tmp_path / "newdir")
    assert sorted(lc.untracked_paths(tmp_path)) == ["new.py", "newdir"]
    (tmp_path / "outputs" / "train").mkdir(parents=True)
    (tmp_path / "outputs" / "train" / "history.csv").write_text("")
    assert sorted(lc.untracked_paths(tmp_path, ["outputs/train/history.csv", "newdir/a.py"])) == ["new.py"]


def _published_run(runs: Path, name: str, run: dict | None = None) -> None:
    """One experiment's files as the committed comparison in ``docs/lab_compare/runs/`` holds them."""
    (runs / name).mkdir(parents=True)
    (runs / name / "metrics.json").write_text(json.dumps({"test/lab_heldout/mul": 1.5, "name": name}))
    (runs / name / "history.csv").write_text("iteration,code/reward_mean\n1,0.5\n")
    if run is not None:
        (runs / name / lc.RUN_FILE).write_text(json.dumps(run))


def test_collect_dir_reads_a_published_comparison_and_its_recorded_wall_times(tmp_path):
    """``--collect-only`` on copied ``runs/``: metrics, history and each experiment's ``run.json``."""
    runs = tmp_path / "runs"
    run = {"wall_s": 12.5, "load_before": 0.3, "commit": "unknown"}
    _published_run(runs, "lc-t-codea1-s1", run)
    exps = [
        cmp.Experiment("lc-t-codea1-s1", "codea1", 1, ("seed=1",)),
        cmp.Experiment("lc-t-bad-s1", "x", 1, ()),
    ]
    ok, bad = lc.collect_dir(runs, exps)
    assert ok.metrics["name"] == "lc-t-codea1-s1" and ok.history == [
        {"iteration": 1.0, "code/reward_mean": 0.5}
    ]
    assert bad.error.startswith("no outputs")
    assert ok.run == run
    lc.write_outputs(tmp_path / "out", [ok], wall_s=5.0)
    table = json.loads((tmp_path / "out" / "table.json").read_text())
    assert table["experiments_wall_s"] == run["wall_s"] and table["commits"] == ["unknown"]
    lc.write_outputs(tmp_path / "out", [ok, bad], wall_s=5.0)  # an experiment without a time: no false sum
    assert json.loads((tmp_path / "out" / "table.json").read_text())["experiments_wall_s"] is None


def test_collect_dir_reads_back_what_write_outputs_stored(tmp_path):
    """A queued comparison's ``runs/`` hold ``history.json``, no CSV: re-collecting or publishing them (copied
    into ``docs/lab_compare/``) reads the same results."""
    results = [_result(m, s, 10.0 * s, 0.1 * s) for m in ("golden_sparse", "codea1") for s in (1, 2)]
    for res in results:  # as parse_history returns them: no NaN
        res.history = [{k: v for k, v in row.items() if v == v} for row in res.history]
    lc.write_outputs(tmp_path, results, wall_s=12.0)
    again = lc.collect_dir(tmp_path / "runs", [r.experiment for r in results])
    assert [(r.metrics, r.history, r.error) for r in again] == [(r.metrics, r.history, "") for r in results]


def test_a_comparison_stops_before_queueing_when_the_queue_cannot_return_results(repo_root, tmp_path, capsys):
    """Queued experiments return only what their commit holds: git-ignored metrics would come back empty."""
    _git(tmp_path, "init", "-q")
    shutil.copy2(repo_root / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / ".gitignore").write_text("/outputs/\n")
    assert lc.main(["--modes", "codea1", "--seeds", "1", "--repo", str(tmp_path)]) == 2
    assert "git-ignored" in capsys.readouterr().err and not (tmp_path / "outputs").exists()


# ------------------------------------------------------------------------------------------------
# Slow: the real thing, two modes, --quick, in a temp clone
# ------------------------------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.slow
def test_quick_compare_in_a_temp_clone(repo_root, tmp_path):
    """Two modes, one seed, tiny runs; the clone's workspace is left unchanged."""
    if shutil.which("git") is None:
        pytest.skip("git not installed: the comparison runs DVC experiments, which need a git repository")
    clone = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(repo_root), str(clone)], check=True)
    changed = _git(repo_root, "ls-files", "--modified", "--others", "--exclude-standard").split()
    for rel in changed:  # uncommitted work: copied, left uncommitted (exercises `dvc exp run -C`)
        (clone / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo_root / rel, clone / rel)
    assert (clone / ".dvc").is_dir(), "the repo's .dvc/ must be committed"
    params_before = (clone / "params.yaml").read_bytes()
    git_before = (_git(clone, "rev-parse", "HEAD"), _git(clone, "status", "--porcelain"))
    # tracking off: this checks the comparison, not MLflow (the runs would go to the clone's store anyway)
    # data.max_problems_per_source=100000 keeps every lab problem (156 < 100000: the same data) but makes prepare's
    # params differ from the committed dvc.lock's: with the lock's own params DVC wants the committed outputs by
    # hash, which a clone lacks (prepare's report is not byte-reproducible), so every experiment reruns prepare;
    # with other params both experiments meet the run cache, the sharing this checks.
    args = [
        "--quick",
        "--modes",
        "codea1,selfplay",
        "--repo",
        str(clone),
        "tracking.backend='null'",
        "data.max_problems_per_source=100000",
    ]
    code = lc.main(args)
    out = clone / "outputs" / "lab_compare"
    log = (out / "dvc.log").read_text()
    assert code == 0, log[-3000:]
    table = json.loads((out / "table.json").read_text())["table"]
    assert set(table) == {"codea1", "selfplay"}
    for mode in table:
        assert table[mode]["code pass@1 held-out seen"]["n"] == 1
        assert table[mode]["final code reward"]["mean"] is not None
    assert log.count("Running stage 'prepare'") == 1  # shared by both experiments (same seed)
    assert (clone / "params.yaml").read_bytes() == params_before
    assert (_git(clone, "rev-parse", "HEAD"), _git(clone, "status", "--porcelain")) == git_before
    # the queue ran every stage in temp copies: none of its (git-ignored) outputs appeared in the workspace
    assert not [
        p for p in ("data/prepared", "outputs/warmstart", "outputs/train/final") if (clone / p).exists()
    ]


def test_recollecting_keeps_the_recorded_wall_time(tmp_path):
    path = tmp_path / "table.json"
    assert lc.recorded_wall_s(path, default=1.0) == 1.0  # nothing recorded
    path.write_text(json.dumps({"wall_s": 7200.5}))
    assert lc.recorded_wall_s(path, default=1.0) == 7200.5
    path.write_text("{not json")
    assert lc.recorded_wall_s(path, default=1.0) == 1.0


def test_a_running_comparison_locks_out_a_second_start_but_not_collect_only(tmp_path, capsys):
    """While a comparison runs, ``--collect-only`` still reads results and a second start stops with a clear
    error (it would share DVC's queue and ``params.yaml``)."""
    repo = tmp_path / "repo"
    runs = repo / "outputs" / "lab_compare" / "runs"
    (runs / "lc-t-codea1-s1").mkdir(parents=True)
    (runs / "lc-t-codea1-s1" / "metrics.json").write_text('{"code/lab_heldout_seen/base/pass@1": 40.0}')
    (runs / "lc-t-codea1-s1" / "history.csv").write_text("iteration,code/reward_mean\n1,0.25\n")
    args = ["--modes", "codea1", "--seeds", "1", "--repo", str(repo)]
    with lc.comparison_lock(repo):  # the running comparison (flock: another open file, as in another process)
        assert lc.main([*args, "--collect-only", "t"]) == 0  # reads runs/
        assert lc.main(args) == 2
        assert "another lab-compare is running" in capsys.readouterr().err
        assert (repo / lc.LOCK).read_text().strip() == str(os.getpid())
    table = json.loads((repo / "outputs" / "lab_compare" / "table.json").read_text())["table"]
    assert table["codea1"]["code pass@1 held-out seen"]["values"] == [40.0]


def test_the_lock_dies_with_its_process(tmp_path):
    """A hard-killed comparison does not leave the repo locked: the kernel drops a dead process's flock."""
    (tmp_path / ".dvc" / "tmp").mkdir(parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl,sys,time; f=open(sys.argv[1],'a'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('held', flush=True); time.sleep(60)",
            str(tmp_path / lc.LOCK),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match="another lab-compare"), lc.comparison_lock(tmp_path):
            pass
    finally:
        holder.kill()
        holder.wait()
    with lc.comparison_lock(tmp_path):
        pass
