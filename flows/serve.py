"""``codea1 serve``: register Prefect deployments (train, evaluate) and serve them, so runs can be started and
scheduled from the Prefect UI.

What it does: builds two deployments — ``train/codea1-train`` (the training flow) and
``evaluate-params/codea1-evaluate`` (the evaluation stage) — whose parameters are a params file and a list of
``key=value`` overrides (editable per run in the UI), optionally on a cron schedule, then serves them from this
process (Ctrl-C stops serving; schedules are paused on shutdown). Runs execute in this working directory, so
relative paths in ``params.yaml`` resolve as they do for ``dvc repro``.
What it does not: start the Prefect server (``codea1 ui`` or ``prefect server start`` does; point
``PREFECT_API_URL`` at it), or run anything by itself.

Run::

    prefect server start &                       # or: codea1 ui
    PREFECT_API_URL=http://127.0.0.1:4200/api python -m flows.serve [--params params.yaml] [--cron "0 3 * * *"]
    # then: prefect deployment run 'train/codea1-train' -p overrides='["reward.alpha=0.25"]'
"""

from __future__ import annotations

import argparse
from typing import Any

from prefect import flow

from codea1_core.config import load_config
from flows.common import run_user_errors
from flows.train import train_flow

TRAIN_DEPLOYMENT = "codea1-train"
EVALUATE_DEPLOYMENT = "codea1-evaluate"


@flow(name="evaluate-params")
def evaluate_params_flow(params: str = "params.yaml", overrides: list[str] | None = None) -> dict[str, float]:
    """The evaluate stage from a params file + overrides (deployment-friendly parameters)."""
    from flows.evaluate import run as run_evaluate

    return run_evaluate(load_config(params, overrides or []))


def build_deployments(params: str, overrides: list[str], cron: str | None = None) -> list[Any]:
    """The ``RunnerDeployment`` objects served by :func:`main` (validated params, optional schedule)."""
    load_config(params, overrides)  # fail here, with the key's path, rather than in the first run
    common = {"parameters": {"params": params, "overrides": list(overrides)}, "cron": cron or None}
    return [
        train_flow.to_deployment(
            name=TRAIN_DEPLOYMENT,
            description="Code-A1 co-evolution training (modes codea1/golden/selfplay); resumes automatically.",
            tags=["codea1", "train"],
            **common,
        ),
        evaluate_params_flow.to_deployment(
            name=EVALUATE_DEPLOYMENT,
            description="Benchmark evaluation of the trained Code and Test LLMs.",
            tags=["codea1", "evaluate"],
            **common,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    """Parse args, build the deployments and serve them until interrupted."""
    parser = argparse.ArgumentParser(description="Serve the train/evaluate deployments for the Prefect UI")
    parser.add_argument("--params", default="params.yaml", help="params file passed to every run")
    parser.add_argument("--cron", default=None, help='optional schedule for training, e.g. "0 3 * * *"')
    parser.add_argument(
        "--limit", type=int, default=1, help="concurrent runs (default 1: one GPU/CPU budget)"
    )
    parser.add_argument("overrides", nargs="*", help="key=value overrides passed to every run")
    args = parser.parse_args(argv)

    def go() -> None:
        from prefect import serve

        deployments = build_deployments(args.params, args.overrides, args.cron)
        print(f"serving {', '.join(d.name for d in deployments)}; start runs from the Prefect UI")
        serve(*deployments, limit=args.limit)

    return run_user_errors(go)


if __name__ == "__main__":
    raise SystemExit(main())
