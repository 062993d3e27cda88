"""``flows/lab_compare.py``: plan, aggregation, table, collection from experiment refs; one slow real run.

The fast tests use synthetic metrics and a real (tiny) git repository for the ``refs/exps`` collection; the
``slow`` test runs ``--quick`` with two modes through DVC's experiment queue in a temp clone of the repo.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest

from codea1_core import comparison as cmp
from codea1_core.config import ConfigError
from flows import lab_compare as lc
from flows.common import UserError


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
    exps = lc.plan(["golden", "codea1_nomb"], 2, ["eval.n_samples=2"], "tag")
    assert [e.name for e in exps] == [
        "lc-tag-golden-s1",
        "lc-tag-codea1_nomb-s1",
        "lc-tag-golden-s2",
        "lc-tag-codea1_nomb-s2",
    ]
    nomb = exps[3]
    assert nomb.mode == "codea1_nomb" and nomb.seed == 2
    assert {"mode=codea1", "mistake_book.enabled=false", "seed=2", "data.seed=2", "eval.n_samples=2"} <= set(
        nomb.overrides
    )
    assert nomb.overrides[-1] == "eval.n_samples=2"  # user overrides come last, so they win


@pytest.mark.parametrize(
    ("modes", "seeds", "match"), [(["golden", "nope"], 1, "nope"), (["golden"], 0, "seeds")]
)
def test_plan_rejects_bad_arguments(modes, seeds, match):
    with pytest.raises(UserError, match=match):
        lc.plan(modes, seeds, [], "t")


def test_validate_names_the_bad_override_key(repo_root):
    exps = lc.plan(["golden"], 1, ["reward.alpha=lots"], "t")
    with pytest.raises(ConfigError, match="reward.alpha"):
        lc.validate(repo_root / "params.yaml", exps)
    lc.validate(repo_root / "params.yaml", lc.plan(list(lc.MODES), 1, lc.QUICK_OVERRIDES, "t"))


def test_main_reports_bad_mode_as_one_line_exit_2(capsys, tmp_path):
    assert lc.main(["--modes", "golden,bogus", "--repo", str(tmp_path)]) == 2
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
    results += [_result("golden", 1, 5.0, 0.4), _result("golden", 2, 0.0, 0.0, error="boom")]
    table = cmp.aggregate(results)
    cell = table["codea1"]["code pass@1 held-out seen"]
    assert cell["n"] == 3 and cell["values"] == [10.0, 20.0, 40.0]
    assert cell["mean"] == pytest.approx(70 / 3)
    assert cell["std"] == pytest.approx(statistics.stdev([10.0, 20.0, 40.0]))
    assert table["codea1"]["Δ vs warm start"]["mean"] == pytest.approx(70 / 3 - 1.0)
    assert table["codea1"]["code pass@1 held-out all"]["values"] == [2.5, 5.0, 10.0]
    assert table["codea1"]["final code reward"]["mean"] == pytest.approx(0.7)
    assert table["codea1"]["final test reward"]["mean"] == pytest.approx(0.2)  # last finite value
    golden = table["golden"]["Mul"]
    assert golden["n"] == 1 and golden["mean"] == 2.5 and golden["std"] is None  # the failed seed is excluded


def test_table_markdown_rows_in_mode_order_and_failures_listed():
    results = [
        _result("codea1", 1, 10.0, 0.5),
        _result("codea1", 2, 30.0, 0.5),
        _result("golden", 1, 5.0, 0.4),
    ]
    results.append(_result("selfplay", 1, 0.0, 0.0, error="no experiment commit"))
    md = cmp.table_markdown(cmp.aggregate(results), results)
    lines = md.splitlines()
    assert lines[0].startswith(
        "| mode | seeds | warm start code pass@1 | code pass@1 held-out seen | Δ vs warm start |"
    )
    assert lines[2].startswith("| golden | 1 | 1.00 | 5.00 |")
    assert lines[3].startswith(f"| codea1 | 2 | 1.00 ± 0.00 | 20.00 ± {statistics.stdev([10.0, 30.0]):.2f} |")
    assert "selfplay |" not in md and "FAILED lc-t-selfplay-s1: no experiment commit" in md


def test_write_outputs_writes_every_artifact(tmp_path):
    results = [_result(m, s, 10.0 * s, 0.1 * s) for m in ("golden", "codea1", "codea1_nomb") for s in (1, 2)]
    md = lc.write_outputs(tmp_path, results, wall_s=12.0)
    assert (tmp_path / "table.md").read_text() == md
    data = json.loads((tmp_path / "table.json").read_text())
    assert data["table"]["codea1"]["Mul"]["mean"] == pytest.approx(7.5)
    assert data["experiments"]["lc-t-golden-s2"]["seed"] == 2 and data["wall_s"] == 12.0
    for png in ("rewards.png", "mistake_book.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = (tmp_path / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 2 and "lc-t-codea1_nomb-s2" in html
    assert json.loads((tmp_path / "runs" / "lc-t-codea1-s1" / "metrics.json").read_text())
    assert not list(tmp_path.rglob("*.tmp"))


def test_mean_curve_averages_seeds_per_iteration():
    results = [_result("codea1", 1, 1.0, 0.4), _result("codea1", 2, 1.0, 0.8), _result("golden", 1, 1.0, 0.0)]
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
    _git(tmp_path, "update-ref", f"refs/exps/{sha[:2]}/{sha[2:]}/lc-t-golden-s1", sha)
    (tmp_path / lc.EVAL_FILE).write_text("{}")  # the workspace copy is not what collect reads
    exps = lc.plan(["golden"], 2, [], "t")
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


FAKE_DVC = """#!/bin/sh
# fake `dvc exp run evaluate -S k=v ... -n NAME`: edits params.yaml, writes the outputs, fails for *-bad-*
name=""; while [ $# -gt 0 ]; do [ "$1" = "-n" ] && name="$2"; shift; done
echo "edited: $name" >> params.yaml
case "$name" in *bad*) exit 3;; esac
mkdir -p outputs/eval outputs/train data/prepared
echo '{"test/lab_heldout/mul": 1.5, "name": "'$name'"}' > outputs/eval/metrics.json
printf 'iteration,code/reward_mean\\n1,0.5\\n' > outputs/train/history.csv
echo lock > dvc.lock; echo new > data/prepared/x
"""

DVC_YAML = """stages:
  prepare: {cmd: x, outs: [data/prepared]}
  evaluate: {cmd: y, outs: [outputs/train/history.csv], metrics: [{outputs/eval/metrics.json: {cache: false}}]}
"""


def _fake_dvc_repo(tmp_path, monkeypatch):
    repo, bin_dir = tmp_path / "repo", tmp_path / "bin"
    (repo / "data" / "prepared").mkdir(parents=True)
    bin_dir.mkdir()
    (bin_dir / "dvc").write_text(FAKE_DVC)
    (bin_dir / "dvc").chmod(0o755)
    (repo / "dvc.yaml").write_text(DVC_YAML)
    (repo / "params.yaml").write_text("seed: 1\n")
    (repo / "data" / "prepared" / "mine").write_text("user data")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    monkeypatch.setattr(lc, "_env", lambda: env)
    return repo


def test_workspace_runner_copies_each_run_and_restores_the_workspace(tmp_path, monkeypatch):
    """The user's params.yaml, dvc.lock and stage outputs are back, byte for byte, even after a failed run."""
    repo = _fake_dvc_repo(tmp_path, monkeypatch)
    exps = [
        cmp.Experiment("lc-t-codea1-s1", "codea1", 1, ("seed=1",)),
        cmp.Experiment("lc-t-bad-s1", "x", 1, ()),
    ]
    runs = repo / "outputs" / "lab_compare" / "runs"
    with open(tmp_path / "dvc.log", "w") as log:
        lc.run_in_workspace(repo, exps, runs, log)
    assert (repo / "params.yaml").read_text() == "seed: 1\n"
    assert sorted(p.name for p in (repo / "data" / "prepared").iterdir()) == ["mine"]
    assert not (repo / "dvc.lock").exists() and not (repo / "outputs" / "eval").exists()
    assert not (repo / ".dvc" / "tmp" / "lab_compare_backup").exists()
    ok, bad = lc.collect_dir(runs, exps)
    assert ok.metrics["name"] == "lc-t-codea1-s1" and ok.history == [
        {"iteration": 1.0, "code/reward_mean": 0.5}
    ]
    assert (
        bad.error.startswith("no outputs")
        and "lc-t-bad-s1 failed: exit 3" in (tmp_path / "dvc.log").read_text()
    )


# ------------------------------------------------------------------------------------------------
# Slow: the real thing, two modes, --quick, in a temp clone
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_quick_compare_in_a_temp_clone(repo_root, tmp_path):
    """Two modes, one seed, tiny runs; the workspace of the clone is as before afterwards."""
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
    args = ["--quick", "--modes", "codea1,selfplay", "--repo", str(clone), "tracking.backend='null'"]
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
    assert (
        not (clone / "outputs" / "train").exists() and not (clone / "dvc.lock").exists()
    )  # workspace restored


def test_a_hard_killed_run_is_restored_and_resumed_without_redoing_finished_experiments(
    tmp_path, monkeypatch
):
    repo = _fake_dvc_repo(tmp_path, monkeypatch)
    # State after SIGKILL during the 2nd experiment: the user's files in the backup, an experiment's in place.
    backup = repo / lc.BACKUP
    (backup / "data" / "prepared").mkdir(parents=True)
    os.replace(repo / "params.yaml", backup / "params.yaml")
    os.replace(repo / "data" / "prepared" / "mine", backup / "data" / "prepared" / "mine")
    (repo / "params.yaml").write_text("seed: 1\nedited: by an experiment\n")
    (repo / "data" / "prepared" / "x").write_text("experiment data")
    (repo / "dvc.lock").write_text("experiment lock")
    runs = repo / "outputs" / "lab_compare" / "runs"
    (runs / "lc-t-codea1-s1").mkdir(parents=True)
    (runs / "lc-t-codea1-s1" / "metrics.json").write_text('{"code/lab_heldout_seen/base/pass@1": 40.0}')
    (runs / "lc-t-codea1-s1" / "history.csv").write_text("iteration,code/reward_mean\n1,0.25\n")
    (runs / ".lc-t-golden-s1.tmp").mkdir()  # a copy cut short by the kill: not a finished run

    args = ["--resume", "t", "--modes", "codea1,golden", "--seeds", "1", "--repo", str(repo)]
    assert lc.main([*args, "--runner", "workspace"]) == 0
    log = (repo / "outputs" / "lab_compare" / "dvc.log").read_text()
    assert "-n lc-t-golden-s1" in log and "-n lc-t-codea1-s1" not in log  # only the unfinished one ran
    assert (repo / "params.yaml").read_text() == "seed: 1\n"
    assert sorted(p.name for p in (repo / "data" / "prepared").iterdir()) == ["mine"]
    assert not (repo / "dvc.lock").exists() and not backup.exists()
    table = json.loads((repo / "outputs" / "lab_compare" / "table.json").read_text())["table"]
    assert table["codea1"]["code pass@1 held-out seen"]["values"] == [40.0]
    assert table["golden"]["Mul"]["values"] == [1.5]


def test_restore_workspace_without_backup_is_a_no_op(tmp_path):
    (tmp_path / "dvc.yaml").write_text(DVC_YAML)
    (tmp_path / "params.yaml").write_text("seed: 1\n")
    assert lc.restore_workspace(tmp_path) is False
    assert (tmp_path / "params.yaml").read_text() == "seed: 1\n"


def test_recollecting_keeps_the_recorded_wall_time(tmp_path):
    path = tmp_path / "table.json"
    assert lc.recorded_wall_s(path, default=1.0) == 1.0  # nothing recorded
    path.write_text(json.dumps({"wall_s": 7200.5}))
    assert lc.recorded_wall_s(path, default=1.0) == 7200.5
    path.write_text("{not json")
    assert lc.recorded_wall_s(path, default=1.0) == 1.0
