"""Prefect deployments: the objects ``codea1 serve`` registers, and (slow) a real server -> serve -> UI-style run.

The end-to-end test starts ``prefect server start`` on a free 127.0.0.1 port with its own PREFECT_HOME, runs
``python -m flows.serve`` against it, triggers a tiny training run through the API (``run_deployment``), waits
for it, checks MLflow got its metrics, and stops only the two processes it started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from support import build_tiny, free_port, stop_process, tiny_config, wait_healthy

from codea1_core.config import ConfigError
from flows.deploy import (
    DEPLOYMENTS,
    EVALUATE_DEPLOYMENT,
    PIPELINE_DEPLOYMENT,
    TRAIN_DEPLOYMENT,
    build_deployments,
)
from flows.serve import main as serve_main
from flows.train import train_flow
from tracking.results import recorded_run_id


def test_deployment_objects(tmp_path: Path, repo_root: Path) -> None:
    """One builder: serve and deploy built their deployments separately, through adapter flows; now both
    build :data:`DEPLOYMENTS` with the stages' own flows, whose parameters are the one flow signature."""
    params = tmp_path / "p.yaml"
    params.write_text("mode: golden\n")
    train, evaluate, pipeline = build_deployments(str(params), ["reward.alpha=0.25"], cron="0 3 * * *")
    assert (train.name, train.flow_name) == (TRAIN_DEPLOYMENT, "train")
    assert (evaluate.name, evaluate.flow_name) == (EVALUATE_DEPLOYMENT, "evaluate")
    assert (pipeline.name, pipeline.flow_name) == (PIPELINE_DEPLOYMENT, "pipeline")
    assert train.parameters == {"params": str(params), "overrides": ["reward.alpha=0.25"], "run_dir": "auto"}
    assert train.schedules and train.schedules[0].schedule.cron == "0 3 * * *" and not evaluate.schedules
    for dep in (train, evaluate, pipeline):  # every parameter the UI shows is one the flow honours
        extra = {"code_model", "test_model"} if dep is evaluate else set()
        assert set(dep._parameter_openapi_schema.properties) == {"params", "overrides", "run_dir"} | extra
        assert dep.entrypoint.endswith(DEPLOYMENTS[dep.name][0])
    assert train.entrypoint.endswith("flows/train.py:train_flow")  # the DVC stage's flow, no adapter
    with pytest.raises(ConfigError, match="reward.alpha"):
        build_deployments(str(params), ["reward.alpha=high"])


def test_every_flow_takes_params_and_overrides() -> None:
    """One flow signature: flows took their config three ways (a dict, a ``Config`` with
    ``validate_parameters=False``, an
    adapter's ``mode``); every flow now starts with ``(params="params.yaml", overrides=None)``, JSON-friendly."""
    import inspect

    from flows.deploy import pipeline_flow
    from flows.evaluate import evaluate_flow
    from flows.prepare import prepare_flow
    from flows.register import register_flow
    from flows.warmstart import warmstart_flow

    for fl in (prepare_flow, warmstart_flow, train_flow, evaluate_flow, register_flow, pipeline_flow):
        sig = inspect.signature(fl.fn)
        names = list(sig.parameters)
        assert names[:2] == ["params", "overrides"], (fl.name, names)
        assert (
            sig.parameters["params"].default == "params.yaml" and sig.parameters["overrides"].default is None
        )
        assert set(names[2:]) <= {"run_dir", "code_model", "test_model"}, (fl.name, names)
        assert fl.should_validate_parameters, fl.name


def test_every_stage_entry_takes_params_and_overrides() -> None:
    """``codea1 <stage>`` and ``python -m flows.<stage>`` call ``<module>.run`` through ``stage_main`` with the
    params file and overrides, which ``run`` passes on to its flow (``codea1 evaluate`` needs one too)."""
    import importlib
    import inspect

    for stage in ("prepare", "warmstart", "train", "evaluate", "register"):
        run = importlib.import_module(f"flows.{stage}").run
        assert list(inspect.signature(run).parameters) == ["params", "overrides"], stage


def test_bad_cron_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Regression: `serve --cron bad` printed a 69-line traceback."""
    params = tmp_path / "p.yaml"
    params.write_text("mode: golden\n")
    assert serve_main(["--params", str(params), "--cron", "bad"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --cron 'bad': not a cron expression (five fields, e.g. \"0 3 * * *\")"]


def test_mode_override_is_honoured_and_writes_to_the_run_folder(tmp_path: Path) -> None:
    """Regression: the train deployment's mode was never applied (golden trained codea1) and its
    runs wrote into the workspace's DVC outputs."""
    from mlflow.tracking import MlflowClient

    model = build_tiny(tmp_path / "model")
    cfg = tiny_config(tmp_path, model, **{"orchestration.max_steps": 1, "mode": "codea1"})
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(cfg.to_dict()))
    run_dir = tmp_path / "runs" / "r1"
    train_flow.fn(str(params), ["seed=3", "mode=golden"], run_dir=str(run_dir))
    done = json.loads((run_dir / "train" / "final" / "DONE.json").read_text())
    assert set(done["versions"]) == {"code"}  # golden trains no Test LLM
    assert not Path(
        cfg.orchestration.checkpoint_dir
    ).exists()  # the params file's (workspace) folder untouched
    client = MlflowClient(tracking_uri=cfg.tracking.tracking_uri)
    run = client.get_run(recorded_run_id(run_dir / "train", done["fingerprint"]))
    assert run.data.tags["codea1.mode"] == "golden" and run.data.params["mode"] == "golden"
    assert run.info.run_name == "train-golden-seed3"


@pytest.mark.slow
def test_pipeline_deployment_trains_evaluates_and_registers_in_its_run_folder(tmp_path: Path) -> None:
    """Regression: a deployment run registered versions with no evaluation; the pipeline runs all three, in
    its own folder, and the evaluation lands on the training run."""
    from mlflow.tracking import MlflowClient

    from codea1_core.data.lab import lab_problems
    from codea1_core.data.prepared import prepared_record, save_prepared
    from flows.deploy import pipeline_flow

    model = build_tiny(tmp_path / "model")
    cfg = tiny_config(
        tmp_path,
        model,
        **{"orchestration.max_steps": 1, "mode": "golden", "eval.out_dir": str(tmp_path / "eval")},
    )  # the params file's eval folder in tmp_path: the relative default (outputs/eval) exists in a checkout
    record = prepared_record(cfg, "eval_lab_heldout")  # what evaluate checks before reading it
    save_prepared(
        lab_problems(cfg.lab, "test")[:3], Path(cfg.data.prepared_dir) / "eval_lab_heldout.parquet", record
    )
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(cfg.to_dict()))
    run_dir = tmp_path / "runs" / "p1"
    small = [
        "eval.n_samples=2",
        "eval.k_list=[1]",
        "eval.baseline=false",
        "eval.max_mutants=2",
        "eval.promote_metric=code/lab_heldout/base/pass@1",
    ]
    decision = pipeline_flow.fn(str(params), small, run_dir=str(run_dir))
    assert set(decision["models"]) == {"code"} and decision["models"]["code"]["alias"] in {
        "champion",
        "candidate",
    }
    assert json.loads((run_dir / "register.json").read_text()) == decision
    assert (run_dir / "eval" / "headline.json").is_file() and (
        run_dir / "train" / "final" / "DONE.json"
    ).is_file()
    assert not Path(cfg.orchestration.checkpoint_dir).exists() and not Path(cfg.eval.out_dir).exists()
    client = MlflowClient(tracking_uri=cfg.tracking.tracking_uri)
    done = json.loads((run_dir / "train" / "final" / "DONE.json").read_text())
    train_run = client.get_run(recorded_run_id(run_dir / "train", done["fingerprint"]))
    assert "eval/code/lab_heldout/base/pass_at_1" in train_run.data.metrics  # evaluation on the training run
    assert "register/code/new" in train_run.data.metrics  # and the decision


@pytest.mark.timeout(1200)  # the deployment run may take 600 s
@pytest.mark.e2e
@pytest.mark.slow
def test_serve_end_to_end(tmp_path: Path, repo_root: Path) -> None:
    import asyncio

    from mlflow.tracking import MlflowClient

    model = build_tiny(tmp_path / "model")
    cfg = tiny_config(tmp_path, model, **{"orchestration.max_steps": 1})
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(cfg.to_dict()))
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = dict(
        os.environ, PREFECT_HOME=str(tmp_path / "prefect_home"), PREFECT_API_URL=api, OMP_NUM_THREADS="1"
    )
    env.pop("MLFLOW_TRACKING_URI", None)
    server = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    serving = None
    try:
        wait_healthy(api, server, 180)
        work = tmp_path / "work"  # the serving workspace: the code linked in, run folders land here
        work.mkdir()
        for name in ("flows", "tasks", "codea1_core", "sandbox"):
            (work / name).symlink_to(repo_root / name)
        serving = subprocess.Popen(
            [sys.executable, "-m", "flows.serve", "--params", str(params)],
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        run = asyncio.run(_trigger(api, f"train/{TRAIN_DEPLOYMENT}", serving, {"overrides": ["mode=golden"]}))
        assert run.state.is_completed(), run.state
        assert run.name == "train-golden-seed1"
        client = MlflowClient(tracking_uri=cfg.tracking.tracking_uri)
        exp = client.get_experiment_by_name(cfg.tracking.experiment)
        (mlrun,) = client.search_runs([exp.experiment_id])
        assert mlrun.data.tags["codea1.mode"] == "golden"  # the UI's mode parameter is the run's mode
        assert [m.step for m in client.get_metric_history(mlrun.info.run_id, "code/reward_mean")] == [1]
        (folder,) = (work / "runs").iterdir()  # its own run folder; the params file's outputs untouched
        assert (folder / "train" / "final" / "DONE.json").is_file()
        assert not Path(cfg.orchestration.checkpoint_dir).exists()
    finally:
        if serving is not None:
            stop_process(serving)
        stop_process(server)


async def _trigger(api: str, name: str, serving: subprocess.Popen, parameters: dict | None = None):
    """Wait for the deployment to appear (served), then run it through the API and wait for the result."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api}):  # this process's client talks to the test's server
        async with get_client() as client:
            deadline = time.monotonic() + 180
            while True:
                assert serving.poll() is None, serving.stdout.read() if serving.stdout else "serve exited"
                try:
                    await client.read_deployment_by_name(name)
                    break
                except Exception:  # not registered yet
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(1)
        return await run_deployment(name, parameters=parameters, timeout=600, poll_interval=2)
