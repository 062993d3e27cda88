"""The Prefect deployments, built in one place, and ``codea1 deploy``: create them on a Prefect work pool.

The deployments (:func:`build_deployments`, also what ``codea1 serve`` serves from its own process):

* ``train/codea1-train`` — ``flows/train.py:train_flow``, the flow the DVC ``train`` stage runs;
* ``evaluate/codea1-evaluate`` — ``flows/evaluate.py:evaluate_flow``, the ``evaluate`` stage's flow;
* ``pipeline/codea1-pipeline`` — :func:`pipeline_flow` here: train -> evaluate -> register (the stages' flows, as
  subflows) in one run folder.

Each takes the parameters every flow takes (``params``, ``overrides``, e.g. ``["mode=golden"]``) plus ``run_dir``,
all editable per run in the UI. A deployment run writes to its own folder, ``runs/<flow run name>-<id>/``
(``run_dir`` defaults to ``"auto"``; ``train/`` checkpoints and final models, ``eval/`` metrics and report,
``register.json``), never into the DVC workspace's ``outputs/`` (``dvc status`` tracks those); an empty
``run_dir`` writes there as the DVC stages do. The evaluate deployment with ``run_dir`` set to a training run's
folder evaluates that run's models; with ``"auto"``, the workspace's trained models (read only). Inputs
(``data/prepared``, the warm start) are read from the workspace, where ``dvc repro`` put them.

``codea1 deploy`` makes sure the work pool exists (a **process** pool named ``codea1-process`` by default; it
is created when missing), then registers the deployments with their code from ``--source`` (default: this
checkout; a git URL makes Prefect clone it on the worker's machine). A run started from the UI or the API is
then picked up by any worker polling the pool, on any machine that can reach the Prefect API::

    prefect server start --host 0.0.0.0 &                          # once, on the orchestrating machine
    export PREFECT_API_URL=http://HOST:4200/api                     # on every machine below
    python -m flows.deploy [--pool codea1-process] [--params params.yaml] [key=value ...]
    prefect worker start --pool codea1-process                      # on each machine that runs flows
    prefect deployment run 'train/codea1-train' -p overrides='["mode=golden", "reward.alpha=0.25"]'

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
import importlib
from pathlib import Path
from typing import Any

from prefect import flow

from codea1_core.config import load_config
from flows.common import AUTO_RUN_DIR, UserError, flow_run_name, resolve_run_dir, run_user_errors

PROJECT_DIR = Path(__file__).resolve().parent.parent
DEFAULT_POOL = "codea1-process"
TRAIN_DEPLOYMENT = "codea1-train"
EVALUATE_DEPLOYMENT = "codea1-evaluate"
PIPELINE_DEPLOYMENT = "codea1-pipeline"
DEPLOYMENTS = {
    TRAIN_DEPLOYMENT: (
        "flows/train.py:train_flow",
        "Code-A1 co-evolution training (overrides: mode=codea1/golden/selfplay) into runs/<run name>/.",
    ),
    EVALUATE_DEPLOYMENT: (
        "flows/evaluate.py:evaluate_flow",
        "Benchmark evaluation of a run folder's (run_dir) or the workspace's trained models.",
    ),
    PIPELINE_DEPLOYMENT: (
        "flows/deploy.py:pipeline_flow",
        "Train -> evaluate -> register (champion only when it beats the champion and warm start).",
    ),
}
"""Deployment name -> (entrypoint, description): the one list ``serve`` and ``deploy`` build from."""


@flow(name="pipeline", flow_run_name=flow_run_name, log_prints=True)
def pipeline_flow(
    params: str = "params.yaml", overrides: list[str] | None = None, run_dir: str = ""
) -> dict[str, Any]:
    """Train -> evaluate -> register with the same ``params`` and ``overrides``, all in one run folder; returns
    the registry decision (a CANCELLED state when SIGTERM stopped the training)."""
    from flows.evaluate import evaluate_flow
    from flows.register import register_flow
    from flows.train import train_flow

    folder = str(resolve_run_dir(run_dir) or "")  # resolved once: the three subflows share it
    overrides = list(overrides or [])
    trained = train_flow(params, overrides, folder, return_state=True)
    if trained.is_cancelled():  # SIGTERM stopped training: this run ends CANCELLED too
        return trained
    trained.result()  # a failed training fails the pipeline here
    evaluate_flow(params, overrides, run_dir=folder)
    return register_flow(params, overrides, folder)


def _local_flow(entrypoint: str) -> Any:
    """The flow object named by ``path/to/module.py:function``, imported from this checkout."""
    path, _, name = entrypoint.partition(":")
    return getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), name)


def build_deployments(
    params: str,
    overrides: list[str],
    cron: str | None = None,
    pool: str | None = None,
    source: str | None = None,
) -> list[Any]:
    """The ``RunnerDeployment`` objects of :data:`DEPLOYMENTS` (validated params; ``cron`` schedules training).

    Without ``pool`` they are served from this process (``codea1 serve``); with it they target that work pool,
    their code loaded from ``source`` (a folder or git URL; ``codea1 deploy``).
    """
    folder = Path(source) if source and Path(source).is_dir() else None
    if source is None or folder is not None:  # fail here, with the key's path, rather than in the first run
        load_config(str(folder / params) if folder else params, overrides)
    schedule = validate_cron(cron) if cron else None
    parameters = {"params": params, "overrides": list(overrides), "run_dir": AUTO_RUN_DIR}
    out = []
    for name, (entrypoint, description) in DEPLOYMENTS.items():
        fl = flow.from_source(source=source, entrypoint=entrypoint) if source else _local_flow(entrypoint)
        out.append(
            fl.to_deployment(
                name=name,
                work_pool_name=pool,
                description=description,
                tags=["codea1", name.removeprefix("codea1-")],
                parameters=parameters,
                cron=schedule if name == TRAIN_DEPLOYMENT else None,
            )
        )
    return out


def validate_cron(cron: str) -> str:
    """``cron`` unchanged when Prefect accepts it as a cron schedule, else a one-line UserError."""
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=cron)
    except ValueError:
        raise UserError(f'--cron {cron!r}: not a cron expression (five fields, e.g. "0 3 * * *")') from None
    return cron


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
    """Ensure the pool, register the deployments on it; returns their ids."""
    from prefect import deploy
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        raise UserError("PREFECT_API_URL is not set: point it at your Prefect server (prefect server start)")
    ensure_work_pool(pool, pool_type)
    deployments = build_deployments(params, overrides, cron, pool=pool, source=source)
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
        prog="codea1 deploy", description="Register train/evaluate/pipeline deployments on a work pool"
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
            f"deployed {', '.join(DEPLOYMENTS)} ({len(ids)}) on work pool {args.pool!r}; start a worker with:"
        )
        print(f"  prefect worker start --pool {args.pool}")

    return run_user_errors(go)


if __name__ == "__main__":
    raise SystemExit(main())
