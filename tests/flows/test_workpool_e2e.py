"""Prefect work pools: the deployments ``codea1 deploy`` creates, and (slow) a real server + process worker run.

The end-to-end test starts ``prefect server start`` on a free 127.0.0.1 port with its own PREFECT_HOME, runs
``python -m flows.deploy`` against it (which creates the process work pool and the three deployments),
triggers a tiny training run through the API, starts ``prefect worker start --pool ... --run-once`` (a real
process worker, which must pick the run up from the pool), waits for the run to complete, checks that the
worker ran it and that MLflow got its metrics, and stops only the processes it started.
"""

from __future__ import annotations

import asyncio
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
    DEFAULT_POOL,
    DEPLOYMENTS,
    TRAIN_DEPLOYMENT,
    build_deployments,
    main,
)


def test_deployments_target_the_pool_with_code_from_the_checkout(repo_root: Path) -> None:
    train, evaluate, pipeline = build_deployments(
        "params.yaml", ["reward.alpha=0.25"], cron="0 3 * * *", pool="pool-x", source=str(repo_root)
    )
    assert [d.name for d in (train, evaluate, pipeline)] == list(DEPLOYMENTS)
    assert [d.flow_name for d in (train, evaluate, pipeline)] == ["train", "evaluate", "pipeline"]
    assert {d.work_pool_name for d in (train, evaluate, pipeline)} == {"pool-x"}
    for dep in (train, evaluate, pipeline):  # the same parameters as `codea1 serve`'s (one builder)
        assert dep.parameters == {
            "params": "params.yaml",
            "overrides": ["reward.alpha=0.25"],
            "run_dir": "auto",
        }
    assert [d.entrypoint for d in (train, evaluate, pipeline)] == [
        "flows/train.py:train_flow",
        "flows/evaluate.py:evaluate_flow",
        "flows/deploy.py:pipeline_flow",
    ]
    assert train.schedules and train.schedules[0].schedule.cron == "0 3 * * *" and not evaluate.schedules
    steps = train.storage.to_pull_step()  # the worker runs the flow in the checkout
    assert steps["prefect.deployments.steps.set_working_directory"]["directory"] == str(repo_root)
    with pytest.raises(ConfigError, match="reward.alpha"):
        build_deployments("params.yaml", ["reward.alpha=high"], pool="pool-x", source=str(repo_root))


def test_deploy_without_a_server_is_one_clear_line(monkeypatch, capsys, repo_root: Path) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: None}):
        assert main(["--source", str(repo_root)]) == 2
    assert "PREFECT_API_URL is not set" in capsys.readouterr().err


@pytest.mark.timeout(900)  # server, worker and a 300 s run
@pytest.mark.e2e
@pytest.mark.slow
def test_a_run_triggered_through_the_api_is_executed_by_a_process_worker(
    tmp_path: Path, repo_root: Path
) -> None:
    from mlflow.tracking import MlflowClient

    model = build_tiny(tmp_path / "model")
    cfg = tiny_config(tmp_path, model, **{"orchestration.max_steps": 1})
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(cfg.to_dict()))
    port, pool = free_port(), f"{DEFAULT_POOL}-test"
    api = f"http://127.0.0.1:{port}/api"
    env = dict(
        os.environ, PREFECT_HOME=str(tmp_path / "prefect_home"), PREFECT_API_URL=api, OMP_NUM_THREADS="1"
    )
    env.pop("MLFLOW_TRACKING_URI", None)
    procs: list[subprocess.Popen] = []
    logs = tmp_path / "logs"
    logs.mkdir()

    def start(*args: str) -> subprocess.Popen:
        """A child in its own session, its output in a file (a full pipe would block it)."""
        with open(logs / f"{args[1]}.log", "w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", *args],
                cwd=repo_root,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        procs.append(proc)
        return proc

    def tail(name: str) -> str:
        return (logs / f"{name}.log").read_text()[-3000:]

    try:
        server = start("prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port))
        wait_healthy(api, server, 180)
        deployed = subprocess.run(
            [sys.executable, "-m", "flows.deploy", "--params", str(params), "--pool", pool],
            cwd=repo_root,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        run_dir = tmp_path / "run"  # not the default runs/<name> under the checkout (the worker's cwd)
        flow_run = asyncio.run(_trigger(api, f"train/{TRAIN_DEPLOYMENT}", {"run_dir": str(run_dir)}))
        worker = start("prefect", "worker", "start", "--pool", pool, "--run-once")
        final = asyncio.run(_wait_final(api, flow_run.id, worker, 600))
        assert final.state.is_completed(), (final.state, tail("worker"))
        assert final.work_pool_name == pool and final.deployment_id == flow_run.deployment_id
        client = MlflowClient(tracking_uri=cfg.tracking.tracking_uri)
        exp = client.get_experiment_by_name(cfg.tracking.experiment)
        (mlrun,) = client.search_runs([exp.experiment_id])
        assert [m.step for m in client.get_metric_history(mlrun.info.run_id, "code/reward_mean")] == [1]
        assert (run_dir / "train" / "final" / "DONE.json").is_file()  # the run's folder, not the workspace
        assert not Path(cfg.orchestration.checkpoint_dir).exists()
        assert {d.name for d in asyncio.run(_deployments(api))} == set(DEPLOYMENTS)
    finally:
        for proc in reversed(procs):
            stop_process(proc)


async def _trigger(api: str, name: str, parameters: dict | None = None):
    """Create a flow run of the deployment through the API (no waiting: no worker is polling yet)."""
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api}):
        return await run_deployment(name, parameters=parameters, timeout=0)


async def _wait_final(api: str, flow_run_id, worker: subprocess.Popen, timeout_s: float):
    """Poll the flow run until it is final (the worker must have picked it up from the pool)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api}):
        async with get_client() as client:
            deadline = time.monotonic() + timeout_s
            while True:
                run = await client.read_flow_run(flow_run_id)
                if run.state and run.state.is_final():
                    return run
                assert time.monotonic() < deadline, f"flow run still {run.state} after {timeout_s}s"
                await asyncio.sleep(2)


async def _deployments(api: str):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api}):
        async with get_client() as client:
            return await client.read_deployments()
