"""``codea1 deploy``: create the train, evaluate and full-pipeline deployments on a Prefect work pool.

What it does: makes sure the work pool exists (a **process** pool named ``codea1-process`` by default; it is
created when missing), then registers three deployments whose code comes from ``--source`` (default: this
checkout; a git URL makes Prefect clone it on the worker's machine):

* ``train/codea1-train`` — the training flow (``flows/train.py``), parameters ``params`` + ``overrides``;
* ``evaluate-params/codea1-evaluate`` — the evaluation stage (``flows/serve.py``), same parameters;
* ``pipeline/codea1-pipeline`` — the whole DVC pipeline, what ``make run`` runs (``flows/pipeline.py``:
  ``dvc repro`` and the learning table; with ``overrides`` a ``dvc exp run -S key=value ...`` experiment),
  in the deployment's working directory.

A run started from the UI or the API is then picked up by any worker polling the pool, on any machine that
can reach the Prefect API::

    prefect server start --host 0.0.0.0 &                          # once, on the orchestrating machine
    export PREFECT_API_URL=http://HOST:4200/api                     # on every machine below
    python -m flows.deploy [--pool codea1-process] [--params params.yaml] [key=value ...]
    prefect worker start --pool codea1-process                      # on each machine that runs flows
    prefect deployment run 'train/codea1-train' -p overrides='["reward.alpha=0.25"]'

Clusters: a Docker or Kubernetes pool runs each flow run in a container of an image with this project and
its dependencies installed (``pip install prefect-docker`` / ``prefect-kubernetes`` on the worker side):
``prefect work-pool create codea1-k8s --type kubernetes``, then
``python -m flows.deploy --pool codea1-k8s --image REGISTRY/codea1:TAG --source /opt/codea1`` (the path of
the checkout inside the image) and ``prefect worker start --pool codea1-k8s``. Only process pools are created
here; other pool types must exist first (their job templates come from their worker packages).

What it does not: start the server or a worker, build or push images, or run anything by itself.
``codea1 serve`` (``flows/serve.py``) is the single-process alternative without a pool.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

from prefect import flow

from codea1_core.config import load_config
from flows.common import UserError, child_env, run_user_errors
from flows.serve import EVALUATE_DEPLOYMENT, TRAIN_DEPLOYMENT

PROJECT_DIR = Path(__file__).resolve().parent.parent
DEFAULT_POOL = "codea1-process"
PIPELINE_DEPLOYMENT = "codea1-pipeline"
ENTRYPOINTS = {
    TRAIN_DEPLOYMENT: ("flows/train.py:train_flow", "Code-A1 co-evolution training; resumes automatically."),
    EVALUATE_DEPLOYMENT: ("flows/serve.py:evaluate_params_flow", "Benchmark evaluation of both LLMs."),
    PIPELINE_DEPLOYMENT: (
        "flows/deploy.py:pipeline_flow",
        "The whole DVC pipeline (dvc repro / dvc exp run).",
    ),
}


def pipeline_command(overrides: list[str]) -> list[str]:
    """``make run``'s pipeline (``python -m flows.pipeline``: ``dvc repro`` + the learning table, on the run's
    Prefect API), or a ``dvc exp run -S key=value ...`` experiment when there are overrides."""
    if not overrides:
        return [sys.executable, "-m", "flows.pipeline"]
    return [sys.executable, "-m", "dvc", "exp", "run", *[a for o in overrides for a in ("-S", o)]]


@flow(name="pipeline", log_prints=True)
def pipeline_flow(overrides: list[str] | None = None) -> dict[str, Any]:
    """Run the DVC pipeline in the working directory (the deployment's source); fail with DVC's last lines."""
    cmd = pipeline_command(list(overrides or []))
    print("running:", " ".join(cmd[2:]))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=child_env())
    print(proc.stdout[-4000:])
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[2:])} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return {"command": " ".join(cmd[2:]), "returncode": proc.returncode}


def build_deployments(
    params: str, overrides: list[str], pool: str, source: str, cron: str | None = None
) -> list[Any]:
    """``RunnerDeployment`` objects for ``pool``, their code loaded from ``source`` (a folder or git URL)."""
    if Path(source).is_dir():  # fail here, with the key's path, rather than in the first run
        load_config(str(Path(source) / params), overrides)
    stage_params = {"params": params, "overrides": list(overrides)}
    out = []
    for name, (entrypoint, description) in ENTRYPOINTS.items():
        loaded = flow.from_source(source=source, entrypoint=entrypoint)
        out.append(
            loaded.to_deployment(
                name=name,
                work_pool_name=pool,
                description=description,
                tags=["codea1", name.removeprefix("codea1-")],
                parameters={"overrides": list(overrides)} if name == PIPELINE_DEPLOYMENT else stage_params,
                cron=cron if name == TRAIN_DEPLOYMENT and cron else None,
            )
        )
    return out


def ensure_work_pool(pool: str, pool_type: str) -> str:
    """The pool's type; a missing **process** pool is created (other types must be created by the user)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            return client.read_work_pool(pool).type
        except ObjectNotFound:
            if pool_type != "process":
                raise UserError(
                    f"work pool {pool!r} does not exist; create it first: "
                    f"prefect work-pool create {pool} --type {pool_type}"
                ) from None
        from prefect.workers.process import ProcessWorker

        template = ProcessWorker.get_default_base_job_template()
        client.create_work_pool(WorkPoolCreate(name=pool, type="process", base_job_template=template))
        return "process"


def deploy_all(
    params: str,
    overrides: list[str],
    pool: str,
    pool_type: str,
    source: str,
    image: str | None,
    cron: str | None,
) -> list[Any]:
    """Ensure the pool, register the three deployments on it; returns their ids."""
    from prefect import deploy
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        raise UserError("PREFECT_API_URL is not set: point it at your Prefect server (prefect server start)")
    ensure_work_pool(pool, pool_type)
    deployments = build_deployments(params, overrides, pool, source, cron)
    return deploy(
        *deployments,
        work_pool_name=pool,
        image=image,
        build=False,
        push=False,
        print_next_steps_message=False,
        ignore_warnings=True,
    )


def main(argv: list[str] | None = None) -> int:
    """Parse args, then create the pool (if needed) and the deployments."""
    parser = argparse.ArgumentParser(
        description="Register train/evaluate/pipeline deployments on a work pool"
    )
    parser.add_argument("--params", default="params.yaml", help="params file passed to every run")
    parser.add_argument("--pool", default=DEFAULT_POOL, help=f"work pool (default {DEFAULT_POOL})")
    parser.add_argument("--pool-type", default="process", help="type used when the pool must be created")
    parser.add_argument("--source", default=str(PROJECT_DIR), help="code location: a folder or a git URL")
    parser.add_argument("--image", default=None, help="image for Docker/Kubernetes pools (not built here)")
    parser.add_argument("--cron", default=None, help='optional schedule for training, e.g. "0 3 * * *"')
    parser.add_argument("overrides", nargs="*", help="key=value overrides passed to every run")
    args = parser.parse_args(argv)

    def go() -> None:
        ids = deploy_all(
            args.params, args.overrides, args.pool, args.pool_type, args.source, args.image, args.cron
        )
        print(
            f"deployed {', '.join(ENTRYPOINTS)} ({len(ids)}) on work pool {args.pool!r}; start a worker with:"
        )
        print(f"  prefect worker start --pool {args.pool}")

    return run_user_errors(go)


if __name__ == "__main__":
    raise SystemExit(main())
