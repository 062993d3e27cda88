"""dvc.yaml: the DAG and params wiring — `reward.alpha` re-runs train and later, never prepare/warmstart.

The tests run in a temporary copy of the pipeline definition (dvc.yaml + params.yaml) where every stage's
command is replaced by a stub that writes the stage's declared outputs: they check DVC's decisions (what
re-runs, which params each stage tracks, `dvc exp run -S`), not the stages themselves (their own tests do).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

DVC = str(Path(sys.executable).with_name("dvc"))
STUB = """
import json, pathlib, sys, time, yaml
CSV = ("iteration,code/reward_mean,test/reward_mean,mistake_book/size,mistake_book/added,mistake_book/removed,"
       "sandbox/timeouts,sandbox/infra_errors\\n1,0.5,0.4,3,3,0,0,0\\n2,0.6,0.3,5,3,1,1,0\\n")
stage = yaml.safe_load(open("dvc.yaml"))["stages"][sys.argv[1]]
params = yaml.safe_load(open("params.yaml"))
stamp = json.dumps({"stage": sys.argv[1], "t": time.time_ns(), "alpha": params["reward"]["alpha"]})
if sys.argv[1] == "params":  # as flows.params_check: the same bytes for every valid params file
    stamp = json.dumps({"params": "checked"})
for kind in ("outs", "metrics", "plots"):
    for entry in stage.get(kind, []):
        path = pathlib.Path(entry if isinstance(entry, str) else next(iter(entry)))
        if path.suffix:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(CSV if path.suffix == ".csv" else stamp)
        else:
            path.mkdir(parents=True, exist_ok=True)
            (path / "stub.json").write_text(stamp)
"""


def _dvc(cwd: Path, *args: str) -> str:
    env = dict(
        os.environ,
        DVC_NO_ANALYTICS="1",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
    )
    proc = subprocess.run([DVC, *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"dvc {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def _ran(output: str) -> list[str]:
    return re.findall(r"Running stage '(\w+)'", output)


@pytest.fixture()
def stub_repo(tmp_path: Path, repo_root: Path) -> Path:
    """A git + DVC repo with the real dvc.yaml/params.yaml, stub commands and placeholder code deps."""
    pipeline = yaml.safe_load((repo_root / "dvc.yaml").read_text())
    produced = set()
    for stage in pipeline["stages"].values():
        for kind in ("outs", "metrics", "plots"):
            produced |= {e if isinstance(e, str) else next(iter(e)) for e in stage.get(kind, [])}
    for name, stage in pipeline["stages"].items():
        stage["cmd"] = f"{sys.executable} stub.py {name}"
        for dep in stage.get("deps", []):
            if dep in produced or any(dep.startswith(p + "/") for p in produced):
                continue
            target = tmp_path / dep
            if Path(dep).suffix:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(f"# placeholder for {dep}\n")
            else:
                target.mkdir(parents=True, exist_ok=True)
                (target / "placeholder.py").write_text("")
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    shutil.copy(repo_root / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "stub.py").write_text(STUB)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    _dvc(tmp_path, "init", "-q")
    for name in (".gitignore", ".dvcignore"):  # what git versions decides what an experiment commit holds
        shutil.copy(repo_root / name, tmp_path / name)
    return tmp_path


def _plots(cwd: Path) -> str:
    out = _dvc(cwd, "plots", "show", "--json")
    return out[out.index("{") :]


def _commit(cwd: Path) -> None:
    subprocess.run(["git", "add", "-A"], cwd=cwd, check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"], cwd=cwd, check=True
    )


@pytest.mark.timeout(900)  # several dvc runs of up to 300 s
@pytest.mark.e2e
def test_alpha_reruns_train_and_later_only(stub_repo: Path) -> None:
    first = _ran(_dvc(stub_repo, "repro"))
    assert first == ["params", "prepare", "warmstart", "train", "evaluate", "register"]
    assert "up to date" in _dvc(stub_repo, "status")
    params = stub_repo / "params.yaml"
    params.write_text(params.read_text().replace("alpha: 0.5", "alpha: 0.25"))
    status = _dvc(stub_repo, "status")
    assert "train:" in status and "prepare:" not in status and "warmstart:" not in status
    assert _ran(_dvc(stub_repo, "repro")) == ["params", "train", "evaluate", "register"]
    plots = json.loads(_plots(stub_repo))  # `dvc plots show` renders the curves from history.csv
    for name in ("rewards", "mistake_book"):
        values = plots["data"][name][0]["content"]["data"]["values"]
        assert [v["iteration"] for v in values][:2] == ["1", "2"], name
    # a key only the last stages read (eval.promote_metric: evaluate's headline.json, register) re-runs them alone
    params.write_text(params.read_text().replace("promote_metric: ", "promote_metric: x"))
    assert _ran(_dvc(stub_repo, "repro")) == ["params", "evaluate", "register"]


@pytest.mark.timeout(900)  # several dvc runs of up to 300 s
@pytest.mark.e2e
def test_exp_run_with_set_param(stub_repo: Path) -> None:
    _dvc(stub_repo, "repro")
    _commit(stub_repo)
    out = _dvc(stub_repo, "exp", "run", "-S", "reward.alpha=0.75")
    assert _ran(out) == ["params", "train", "evaluate", "register"], out
    shown = _dvc(stub_repo, "exp", "show", "--no-pager", "--csv")
    assert "0.75" in shown


def _exp_rows(shown: list[dict]) -> dict[str, dict]:
    """``dvc exp show --json`` (DVC 3) flattened to ``{name or rev: data}`` for the baseline and every experiment."""
    rows = {}
    for commit in shown:
        rows[commit.get("name") or commit["rev"]] = commit.get("data") or {}
        for exp in commit.get("experiments") or []:
            for rev in exp.get("revs") or []:
                rows[rev.get("name") or rev["rev"]] = rev.get("data") or {}
    return rows


def _headline(data: dict) -> dict:
    return ((data.get("metrics") or {}).get("outputs/eval/headline.json") or {}).get("data") or {}


@pytest.mark.timeout(900)  # several dvc runs of up to 300 s
@pytest.mark.e2e
def test_two_experiments_compare_in_exp_show(stub_repo: Path) -> None:
    """Regression: outputs/ was git-ignored, so experiment commits held no metrics ("!" everywhere).

    The baseline commit and two `dvc exp run`s must each carry their own headline metrics, readable by
    `dvc exp show --json` and `dvc metrics diff`.
    """
    _dvc(stub_repo, "repro")
    _commit(stub_repo)
    for alpha in ("0.25", "0.75"):
        _dvc(stub_repo, "exp", "run", "-S", f"reward.alpha={alpha}", "-n", f"alpha-{alpha}")
    out = _dvc(stub_repo, "exp", "show", "--json")
    rows = _exp_rows(json.loads(out[out.index("[") :]))
    assert _headline(rows["alpha-0.25"]).get("alpha") == 0.25, rows["alpha-0.25"]
    assert _headline(rows["alpha-0.75"]).get("alpha") == 0.75, rows["alpha-0.75"]
    baseline = next(data for name, data in rows.items() if not name.startswith(("alpha-", "workspace")))
    assert _headline(baseline).get("alpha") == 0.5, rows  # the committed baseline has metrics too
    diff = _dvc(stub_repo, "metrics", "diff", "alpha-0.25", "alpha-0.75", "--json")
    changed = json.loads(diff[diff.index("{") :])["outputs/eval/headline.json"]["alpha"]
    assert (changed["old"], changed["new"]) == (0.25, 0.75)
    assert "outputs/eval/headline.json" in _dvc(stub_repo, "metrics", "show")


@pytest.mark.timeout(900)  # several dvc runs of up to 300 s
@pytest.mark.e2e
def test_a_refused_value_fails_before_dvc_removes_any_output(stub_repo: Path, repo_root: Path) -> None:
    """Regression: ``dvc exp run -S reward.alpha=2`` was refused by the train stage itself, after DVC had removed
    its outputs (DVC removes them just before running a stage's command). The ``params`` stage (the real
    ``flows.params_check``) refuses it first, in one line naming the key; train's outputs stay as they were.
    The train stub checks its params as the real stage does."""
    pipeline = yaml.safe_load((stub_repo / "dvc.yaml").read_text())
    real = f"env PYTHONPATH={repo_root} {sys.executable} -m"
    pipeline["stages"]["params"]["cmd"] = f"{real} flows.params_check"
    pipeline["stages"]["train"]["cmd"] = f"{real} flows.params_check && {pipeline['stages']['train']['cmd']}"
    (stub_repo / "dvc.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    _dvc(stub_repo, "repro")
    _commit(stub_repo)
    final = stub_repo / "outputs" / "train" / "final" / "stub.json"
    before = final.read_text()
    env = dict(os.environ, DVC_NO_ANALYTICS="1", GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t")
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    run = subprocess.run(
        [DVC, "exp", "run", "-S", "reward.alpha=2"], cwd=stub_repo, capture_output=True, text=True, env=env
    )
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "reward.alpha" in out, out
    assert _ran(out) == ["params"], out
    assert final.read_text() == before  # nothing of train's removed
    assert "Traceback" not in out


@pytest.mark.timeout(900)  # several dvc runs of up to 300 s
@pytest.mark.e2e
def test_an_experiment_runs_where_git_has_no_identity(
    stub_repo: Path, tmp_path: Path, repo_root: Path
) -> None:
    """Regression: ``dvc exp run`` failed with "unexpected error - Git user name and email must be configured"
    where git had no identity (a fresh machine). ``python -m flows.pipeline exp`` (``make exp``) makes the
    experiment commit as codea1 <codea1@localhost> there and says how to set one; git's config is left alone."""
    _dvc(stub_repo, "repro")
    _commit(stub_repo)
    (stub_repo / "new_module.py").write_text("")  # a change to commit with the experiment
    subprocess.run(["git", "add", "new_module.py"], cwd=stub_repo, check=True)
    home = tmp_path / "home"
    home.mkdir()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("GIT_AUTHOR_", "GIT_COMMITTER_", "EMAIL"))
    }
    env |= {
        "HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "DVC_NO_ANALYTICS": "1",
        "PYTHONPATH": str(repo_root),
    }
    env["PREFECT_API_URL"] = "http://127.0.0.1:9/api"  # given (the stubs never call it): no server is started
    no_identity = subprocess.run(
        ["git", "var", "GIT_AUTHOR_IDENT"], cwd=stub_repo, env=env, capture_output=True
    )
    assert no_identity.returncode != 0  # the machine this test stands for
    run = subprocess.run(
        [sys.executable, "-m", "flows.pipeline", "exp", "-S", "reward.alpha=0.75", "-n", "no-identity"],
        cwd=stub_repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = run.stdout + run.stderr
    assert "git has no user identity here" in out and "git config user.name" in out, out
    assert _ran(out) == ["params", "train", "evaluate", "register"], out
    authors = subprocess.run(
        ["git", "log", "--all", "--format=%an <%ae>"], cwd=stub_repo, env=env, capture_output=True, text=True
    ).stdout
    assert "codea1 <codea1@localhost>" in authors, authors
    assert subprocess.run(["git", "config", "user.name"], cwd=stub_repo, env=env).returncode != 0


def test_stage_params_are_declared_precisely(repo_root: Path) -> None:
    """Guard: prepare must not track whole sections train reads (else alpha sweeps re-prepare data)."""
    stages = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]
    assert "reward" not in stages["prepare"]["params"] and "data" not in stages["prepare"]["params"]
    assert "reward" in stages["train"]["params"] and "mistake_book" in stages["train"]["params"]
    outs = {next(iter(o)): o[next(iter(o))] for o in stages["train"]["outs"] if isinstance(o, dict)}
    assert outs["outputs/train/checkpoints"]["persist"] and outs["outputs/train/mistake_book.json"]["persist"]
    metrics = [m for stage in stages.values() for m in stage.get("metrics", [])]
    assert metrics == [{"outputs/eval/headline.json": {"cache": False}}]  # a readable `dvc metrics show`


CODE_DIRS = ("codea1_core", "tracking", "workspace", "gates", "tasks", "flows", "sandbox")
"""The packages whose modules a stage's deps list (``tools`` and ``bench`` are no stage's code)."""


def _local_imports(path: Path, root: Path) -> set[Path]:
    """Repo files imported by ``path`` (top level and inside functions): ``codea1_core.x``, ``tasks.x``, ..."""
    import ast

    found: set[Path] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            if name.split(".")[0] not in CODE_DIRS:
                continue
            for candidate in (root / f"{name.replace('.', '/')}.py", root / name.replace(".", "/")):
                if candidate.parent == root and candidate.name != "sandbox":
                    continue  # `from codea1_core.method import batches`: the namespace itself is not a dependency
                if candidate.is_dir() and candidate.parent.name == "codea1_core":
                    found.add(candidate / "__init__.py")  # a core sub-package: its (docstring-only) __init__
                elif candidate.is_file() or (candidate / "__init__.py").is_file():
                    found.add(candidate)
    return found


def _closure(start: Path, root: Path) -> set[Path]:
    seen, todo = set(), [start]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        if path.is_file():
            todo.extend(_local_imports(path, root))
        # a package dir (sandbox/) is listed as a whole: its files are covered by the dir entry
    return seen


@pytest.mark.parametrize("stage", ["params", "prepare", "warmstart", "train", "evaluate", "register"])
def test_stage_deps_cover_the_code_the_stage_imports(repo_root: Path, stage: str) -> None:
    """`dvc repro` reruns a stage only when a listed dep changes: every repo module it imports is listed."""
    spec = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"][stage]
    deps = {repo_root / d for d in spec.get("deps", [])}
    module = repo_root / spec["cmd"].split("-m ")[1].split()[0].replace(".", "/")
    imported = _closure(module.with_suffix(".py"), repo_root)
    trivial = {p for p in imported if p.name == "__init__.py" or p.stat().st_size == 0 if p.is_file()}
    missing = sorted(
        str(p.relative_to(repo_root))
        for p in imported - trivial
        if p not in deps and not any(d in p.parents for d in deps)
    )
    assert not missing, f"dvc.yaml stage {stage!r}: imported but not in deps: {missing}"


@pytest.mark.parametrize("stage", ["params", "prepare", "warmstart", "train", "evaluate", "register"])
def test_stage_deps_list_no_code_the_stage_does_not_import(repo_root: Path, stage: str) -> None:
    """Bug guarded: the train stage listed ``mutants.py``, ``report.py`` and ``benchmarks.py`` (modules
    it does not import), so editing the mutant generator re-ran training.
    Every listed code dep (a module of :data:`CODE_DIRS`, or ``sandbox/`` as a whole) must be imported."""
    spec = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"][stage]
    module = repo_root / spec["cmd"].split("-m ")[1].split()[0].replace(".", "/")
    imported = _closure(module.with_suffix(".py"), repo_root)
    code = [d for d in spec.get("deps", []) if d.split("/")[0] in CODE_DIRS]
    extra = sorted(d for d in code if repo_root / d not in imported)
    assert not extra, f"dvc.yaml stage {stage!r}: listed in deps but not imported: {extra}"


def test_train_stage_does_not_depend_on_the_test_llm_evaluation(repo_root: Path) -> None:
    """Regression: ``tasks/score.py`` (in-training validation) imported ``tasks/evaluate.py``
    whole, mutants and benchmark loaders included, so editing the mutant generator re-ran training."""
    spec = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]["train"]
    imported = _closure(repo_root / "flows/train.py", repo_root)
    evaluation_only = ["codea1_core/evaluation/mutants.py", "codea1_core/evaluation/benchmarks.py"]
    evaluation_only += ["tasks/evaluate_tests.py", "codea1_core/evaluation/suites.py"]
    assert not [p for p in evaluation_only if repo_root / p in imported or p in spec["deps"]]


def test_golden_tests_coverage_reprepares_the_data(repo_root: Path) -> None:
    """``lab.golden_tests`` decides the prepared training problems, so prepare must track it
    (warmstart tracks the whole ``lab`` section; train and evaluate follow through ``data/prepared``)."""
    stages = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]
    assert "lab.golden_tests" in stages["prepare"]["params"]
    assert "lab" in stages["warmstart"]["params"]
    assert all("data/prepared" in stages[s]["deps"] for s in ("warmstart", "train", "evaluate"))
    params = yaml.safe_load((repo_root / "params.yaml").read_text())
    assert params["lab"]["golden_tests"] == "sparse"  # chosen by make lab-compare (README); the codea1 arm
