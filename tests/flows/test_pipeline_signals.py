"""Stopping ``make run`` stops everything: the pipeline runner hands SIGINT/SIGTERM to the running stage.

Before: Ctrl-C on the process group stopped ``make`` and the Prefect server in ~2 s but orphaned the train stage
for minutes (it retried the stopped API while holding the workspace lock), and SIGTERM to the pipeline never
reached the stage at all: it trained to the end and registered a model version after the pipeline had printed
"interrupted". Here the real runner (``python -m flows.pipeline``) runs ``dvc repro`` of the real train stage on
a tiny config in a DVC repo; once the first checkpoint is written it is stopped as a terminal's Ctrl-C does
(SIGINT to its process group) or as a service manager does (SIGTERM to it). After it exits: the stage's process
is gone, no lock is left, the MLflow run is KILLED and the Prefect flow run CANCELLED (nothing RUNNING); the
pipeline exits 130 after Ctrl-C and 143 after SIGTERM, the code of a stage stopped by SIGTERM.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from support import build_tiny, make_repo

from tracking.results import recorded_run_id
from workspace.resume import stored_fingerprint


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _as_foreground_job() -> None:
    """In the pipeline's process (before exec): SIGINT at its default, as for a terminal's foreground job, whatever
    this test process inherited (a shell starts a background job, e.g. ``pytest ... &``, with SIGINT ignored, and
    the pipeline would inherit that and never see the Ctrl-C this test sends)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop(proc: subprocess.Popen, how: str, stage_pid: int, stage: str) -> str:
    """Stop the pipeline as a terminal (``ctrl-c``: SIGINT to its group) or a service manager (SIGTERM) does; its
    log. Fails if it does not exit within 200 s or the stage's process outlives it (which is then killed)."""
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal does: the foreground process group
    else:
        proc.send_signal(signal.SIGTERM)
    try:
        log, _ = proc.communicate(timeout=200)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("the pipeline did not stop within 200 s") from None
    orphan = _alive(stage_pid)
    if orphan:  # do not leave it running on
        os.kill(stage_pid, signal.SIGKILL)
    assert not orphan, f"the {stage} stage (pid {stage_pid}) outlived the pipeline:\n{log[-3000:]}"
    return log


@pytest.mark.e2e
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_stopping_the_pipeline_during_train_stops_the_stage(
    prefect_harness, tiny_model, tmp_path, repo_root, how
):
    from mlflow.tracking import MlflowClient
    from prefect.client.orchestration import get_client

    repo = tmp_path / "repo"
    env = make_repo(repo, tiny_model, repo_root)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["orchestration"]["max_steps"], params["data"]["epochs"] = 50, 50
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    started = dt.datetime.now(dt.UTC)
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.pipeline"],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_as_foreground_job,
    )
    out = repo / "outputs" / "train"
    deadline = time.monotonic() + 400
    while (
        not (out / "checkpoints" / "LATEST").is_file() and proc.poll() is None and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()[0][-3000:]
    stage_pid = json.loads((out / "train.lock").read_text())["pid"]
    log = _stop(proc, how, stage_pid, "train")
    assert proc.returncode == (130 if how == "ctrl-c" else 143), log[-3000:]  # SIGTERM: as a stage
    assert not (out / "train.lock").exists()
    run_id = recorded_run_id(out, stored_fingerprint(out))
    mlflow = MlflowClient(tracking_uri=f"sqlite:///{repo}/mlflow.db")
    assert mlflow.get_run(run_id).info.status == "KILLED", log[-3000:]
    with get_client(sync_client=True) as prefect:
        runs = [
            r
            for r in prefect.read_flow_runs()
            if r.created and r.created >= started and r.name.startswith("train-")
        ]
    assert [r.state_type.value for r in runs] == ["CANCELLED"], [(r.name, r.state_type) for r in runs]


def _stage_pid(repo: Path, stage: str) -> int | None:
    """The pid of ``python -m flows.<stage>`` running in ``repo`` (dvc starts it in the pipeline's stage group)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if f"flows.{stage}".encode() in argv and cwd == str(repo):
            return int(proc.name)
    return None


STAGE_SETUP = {
    # the warm start's SFT runs for minutes: stopped inside an epoch
    "warmstart": {"lab.warmstart_code_epochs": 400, "lab.warmstart_code_problems_per_family": 4},
    # the evaluation samples for minutes: stopped while it samples and runs programs
    "evaluate": {"eval.n_samples": 64, "eval.k_list": [1], "eval.baseline": False},
}


@pytest.mark.e2e
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
@pytest.mark.parametrize("stage", sorted(STAGE_SETUP))
def test_stopping_the_pipeline_during_warm_start_or_evaluate_leaves_nothing_running(
    prefect_harness, tiny_model, tmp_path, repo_root, stage, how
):
    """The same stops at the two other long stages: no process, no temporary output, no RUNNING flow run."""
    from prefect.client.orchestration import get_client

    repo = tmp_path / "repo"
    env = make_repo(repo, tiny_model, repo_root)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    if stage == "warmstart":
        params["model"]["code_path"] = "outputs/warmstart/code"
        params["model"]["test_path"] = "outputs/warmstart/test"
    for dotted, value in STAGE_SETUP[stage].items():
        section, key = dotted.split(".")
        params[section][key] = value
    stages = {stage: {"cmd": f"{sys.executable} -m flows.{stage} --params params.yaml"}}
    if stage == "evaluate":  # it reads the prepared lab benchmark
        params["data"]["prepared_dir"] = "data/prepared"
        prepare = {
            "cmd": f"{sys.executable} -m flows.prepare --params params.yaml",
            "outs": ["data/prepared"],
        }
        stages = {"prepare": prepare, "evaluate": {**stages["evaluate"], "deps": ["data/prepared"]}}
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
    started = dt.datetime.now(dt.UTC)
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.pipeline"],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_as_foreground_job,
    )

    def running() -> list:
        with get_client(sync_client=True) as prefect:
            return [
                r
                for r in prefect.read_flow_runs()
                if r.created and r.created >= started and r.name.startswith(f"{stage}-")
            ]

    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if [r for r in running() if r.state_type.value == "RUNNING"]:
            break
        time.sleep(0.5)
    time.sleep(8)  # well inside the stage's work (the SFT epochs, the evaluation's sampling)
    assert proc.poll() is None, proc.communicate()[0][-3000:]
    stage_pid = _stage_pid(repo, stage)
    assert stage_pid is not None
    log = _stop(proc, how, stage_pid, stage)
    assert proc.returncode == (130 if how == "ctrl-c" else 143), log[-3000:]  # SIGTERM: as a stage
    states = [(r.name, r.state_type.value) for r in running()]
    assert len(states) == 1 and states[0][1] in ("CANCELLED", "CRASHED"), (states, log[-4000:])
    leftovers = (
        [p for p in (repo / "outputs").rglob("*") if p.name.endswith(".tmp")]
        if (repo / "outputs").exists()
        else []
    )
    assert not leftovers, leftovers
    locks = [p for p in repo.rglob("*.lock") if p.name != "dvc.lock" and ".dvc" not in p.parts]
    assert not locks, locks


def test_sigterm_ends_the_pipeline_with_143_and_ctrl_c_with_130(monkeypatch) -> None:
    """Regression: SIGTERM exited 130, a Ctrl-C's code; the stages exit 143 after SIGTERM."""
    from flows import pipeline

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # a given API: no server is started

    def interrupted(signum: int):
        def run(cmd: list[str], *args: object, **kwargs: object) -> int:
            os.kill(os.getpid(), signum)
            time.sleep(5)
            raise AssertionError("no signal arrived")

        return run

    monkeypatch.setattr(pipeline, "run_child", interrupted(signal.SIGTERM))
    assert pipeline.main([]) == 143
    monkeypatch.setattr(pipeline, "run_child", interrupted(signal.SIGINT))
    assert pipeline.main([]) == 130
