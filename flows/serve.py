"""``codea1 serve``: register Prefect deployments (train, evaluate, pipeline) and serve them, so runs can be
started and scheduled from the Prefect UI.

What it does: builds three deployments — ``train/codea1-train`` (co-evolution training),
``evaluate-params/codea1-evaluate`` (the evaluation stage) and ``pipeline/codea1-pipeline`` (train -> evaluate ->
register) — whose parameters (editable per run in the UI) are all honoured: a params file, ``key=value``
overrides, ``mode`` (``codea1`` / ``golden`` / ``selfplay``; empty: the params file's) and ``run_dir``.
Optionally on a cron schedule; served from this process (Ctrl-C stops serving; schedules pause on shutdown).

Run folders: a deployment run never writes into the DVC workspace (``outputs/``, which ``dvc status`` tracks).
Each run writes to its own folder, ``runs/<flow run name>-<id>/`` (``train/`` checkpoints and final models,
``eval/`` metrics and report, ``register.json``), or to ``run_dir`` when given: the evaluate deployment with
``run_dir`` set evaluates that training run's models; without it, the workspace's trained models (read only).
Inputs (``data/prepared``, the warm start) are read from the workspace, where ``dvc repro`` put them.
What it does not: start the Prefect server (``codea1 ui`` or ``prefect server start`` does; point
``PREFECT_API_URL`` at it), or run anything by itself.

Run::

    prefect server start &                       # or: codea1 ui
    PREFECT_API_URL=http://127.0.0.1:4200/api python -m flows.serve [--params params.yaml] [--cron "0 3 * * *"]
    # then: prefect deployment run 'train/codea1-train' -p mode=golden -p overrides='["reward.alpha=0.25"]'
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from prefect import flow

from codea1_core.config import Config, load_config
from flows.common import UserError, run_user_errors

TRAIN_DEPLOYMENT = "codea1-train"
EVALUATE_DEPLOYMENT = "codea1-evaluate"
PIPELINE_DEPLOYMENT = "codea1-pipeline"
RUNS_DIR = Path("runs")
MODES = ("", "codea1", "golden", "selfplay")


# --------------------------------------------------------------------------------------------------
# Parameters -> one run's config (pure helpers, tested without a server)
# --------------------------------------------------------------------------------------------------


def run_config(params: str, overrides: list[str] | None, mode: str = "") -> Config:
    """The params file with the overrides and ``mode`` applied (``mode`` wins: it is the UI's own field)."""
    if mode not in MODES:
        raise UserError(f"mode: expected one of codea1, golden, selfplay, got {mode!r}")
    extra = [f"mode={mode}"] if mode else []
    return load_config(params, [*(overrides or []), *extra])


def in_run_dir(cfg: Config, run_dir: Path, train_dir: Path | None = None) -> Config:
    """``cfg`` writing into ``run_dir`` (checkpoints, eval) instead of the workspace's ``outputs/``."""
    return cfg.replace(
        **{
            "orchestration.checkpoint_dir": str(train_dir or run_dir / "train"),
            "eval.out_dir": str(run_dir / "eval"),
        }
    )


def default_run_dir() -> Path:
    """``runs/<flow run name>-<id>`` for the current flow run (unique: two runs never share checkpoints)."""
    from prefect.runtime import flow_run

    name = f"{flow_run.get_name() or 'run'}-{str(flow_run.get_id() or 'local')[:8]}"
    return RUNS_DIR / re.sub(r"[^A-Za-z0-9._=-]+", "_", name)


def run_name() -> str:
    """``<flow>-<mode>-seed<seed>[-alpha..][-<overrides>]`` from the run's parameters: runs that differ in mode,
    seed or overrides are told apart in the Prefect UI and in ``runs/``."""
    from prefect.runtime import flow_run

    from flows.train import run_name as train_name

    p = dict(flow_run.get_parameters() or {})
    flow_name = flow_run.get_flow_name() or "run"
    try:
        cfg = run_config(p.get("params", "params.yaml"), p.get("overrides"), p.get("mode", ""))
    except Exception:  # a bad parameter fails in the flow itself, with its own message
        return f"{flow_name}-invalid-config"
    keys = [o for o in p.get("overrides") or [] if not o.startswith(("mode=", "seed=", "reward.alpha="))]
    return "-".join([train_name(cfg).replace("train", flow_name, 1), *keys])


# --------------------------------------------------------------------------------------------------
# The deployed flows
# --------------------------------------------------------------------------------------------------


@flow(name="train", flow_run_name=run_name, log_prints=True)
def train_deployment_flow(
    params: str = "params.yaml", overrides: list[str] | None = None, mode: str = "", run_dir: str = ""
) -> dict[str, Any]:
    """Co-evolution training into the run folder (``run_dir``, default ``runs/<flow run name>``)."""
    from flows.train import train

    folder = Path(run_dir) if run_dir else default_run_dir()
    return train(in_run_dir(run_config(params, overrides, mode), folder))


@flow(name="evaluate-params", flow_run_name=run_name, log_prints=True)
def evaluate_params_flow(
    params: str = "params.yaml", overrides: list[str] | None = None, mode: str = "", run_dir: str = ""
) -> dict[str, float]:
    """Evaluate a training run folder's models (``run_dir``), or the workspace's; results go to the run folder."""
    from flows.evaluate import run as run_evaluate

    cfg = run_config(params, overrides, mode)
    if run_dir:
        cfg = in_run_dir(cfg, Path(run_dir))
    else:
        cfg = in_run_dir(cfg, default_run_dir(), train_dir=Path(cfg.orchestration.checkpoint_dir))
    return run_evaluate(cfg)


@flow(name="pipeline", flow_run_name=run_name, log_prints=True)
def pipeline_flow(
    params: str = "params.yaml", overrides: list[str] | None = None, mode: str = "", run_dir: str = ""
) -> dict[str, Any]:
    """Train -> evaluate -> register, all in one run folder; returns the registry decision."""
    from flows.evaluate import run as run_evaluate
    from flows.register import register
    from flows.train import train

    folder = Path(run_dir) if run_dir else default_run_dir()
    cfg = in_run_dir(run_config(params, overrides, mode), folder)
    train(cfg)
    run_evaluate(cfg)
    return register(cfg, out_path=folder / "register.json")


def build_deployments(params: str, overrides: list[str], cron: str | None = None) -> list[Any]:
    """The ``RunnerDeployment`` objects served by :func:`main` (validated params, optional schedule)."""
    load_config(params, overrides)  # fail here, with the key's path, rather than in the first run
    schedule = {"cron": validate_cron(cron)} if cron else {}
    common = {"parameters": {"params": params, "overrides": list(overrides)}}
    return [
        train_deployment_flow.to_deployment(
            name=TRAIN_DEPLOYMENT,
            description="Code-A1 co-evolution training (mode: codea1 / golden / selfplay) into runs/<run name>/.",
            tags=["codea1", "train"],
            **common,
            **schedule,
        ),
        evaluate_params_flow.to_deployment(
            name=EVALUATE_DEPLOYMENT,
            description="Benchmark evaluation of a run folder's (run_dir) or the workspace's trained models.",
            tags=["codea1", "evaluate"],
            **common,
        ),
        pipeline_flow.to_deployment(
            name=PIPELINE_DEPLOYMENT,
            description="Train -> evaluate -> register (champion only when it beats the champion and warm start).",
            tags=["codea1", "pipeline"],
            **common,
        ),
    ]


def validate_cron(cron: str) -> str:
    """``cron`` unchanged when Prefect accepts it as a cron schedule, else a one-line UserError."""
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=cron)
    except ValueError:
        raise UserError(f'--cron {cron!r}: not a cron expression (five fields, e.g. "0 3 * * *")') from None
    return cron


def parser() -> argparse.ArgumentParser:
    """The options of ``codea1 serve`` (also shown by ``codea1 serve --help``)."""
    p = argparse.ArgumentParser(
        prog="codea1 serve",
        description="Serve the train / evaluate / pipeline deployments for the Prefect UI",
    )
    p.add_argument("--params", default="params.yaml", help="params file passed to every run")
    p.add_argument("--cron", default=None, help='optional schedule for training, e.g. "0 3 * * *"')
    p.add_argument("--limit", type=int, default=1, help="concurrent runs (default 1: one GPU/CPU budget)")
    p.add_argument("overrides", nargs="*", help="key=value overrides passed to every run")
    return p


def main(argv: list[str] | None = None) -> int:
    """Parse args, build the deployments and serve them until interrupted."""
    args = parser().parse_args(argv)

    def go() -> None:
        from prefect import serve

        deployments = build_deployments(args.params, args.overrides, args.cron)
        print(f"serving {', '.join(d.name for d in deployments)}; start runs from the Prefect UI")
        serve(*deployments, limit=args.limit)

    return run_user_errors(go)


if __name__ == "__main__":
    raise SystemExit(main())
