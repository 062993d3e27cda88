"""The ``codea1`` command line: one subcommand per pipeline stage, plus solve / attack / serve / deploy / ui.

Every stage subcommand takes ``--params FILE`` and ``key=value`` overrides, exactly like the DVC stages
(``python -m flows.<stage>``) which it calls; user mistakes end in one line on stderr and exit code 2.
"""

from __future__ import annotations

import importlib
from typing import Annotated

import typer

app = typer.Typer(
    name="codea1",
    help="Co-evolve a Code LLM and a Test LLM by RL (Code-A1): data, training, evaluation, inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

PARAMS_HELP = "params file (default: params.yaml)"
OVERRIDES_HELP = "key=value overrides validated like params.yaml, e.g. reward.alpha=0.25"
ParamsOpt = Annotated[str, typer.Option(help=PARAMS_HELP)]
OverridesArg = Annotated[list[str] | None, typer.Argument(help=OVERRIDES_HELP, show_default=False)]
PASSTHROUGH = {
    "allow_extra_args": True,
    "ignore_unknown_options": True,
}
"""solve / attack / serve own their argparse options: every argument, ``--help`` included, goes to them, so
``codea1 solve --help`` lists the real options (``--problem``, ``--suites``, ``--cron``, ...)."""


def _run_stage(name: str, params: str, overrides: list[str] | None) -> None:
    from flows.common import load_stage_config, run_user_errors, stage_main

    # Validate params first: a malformed params.yaml is reported the same way for every subcommand.
    if run_user_errors(lambda: load_stage_config(params, list(overrides or []))) != 0:
        raise typer.Exit(2)
    run = importlib.import_module(f"flows.{name}").run
    argv = ["--params", params, *(overrides or [])]
    raise typer.Exit(stage_main(run, f"codea1 {name}", argv))


def _run_main(name: str, argv: list[str]) -> None:
    raise typer.Exit(importlib.import_module(f"flows.{name}").main(argv))


@app.command()
def prepare(
    params: ParamsOpt = "params.yaml",
    overrides: OverridesArg = None,
) -> None:
    """Load problem sources, fill expected values in the sandbox, gate them, write data/prepared/."""
    _run_stage("prepare", params, overrides)


@app.command()
def warmstart(
    params: ParamsOpt = "params.yaml",
    overrides: OverridesArg = None,
) -> None:
    """Build the tiny lab model and SFT-warm-start the Code and Test LLMs (skipped for user models)."""
    _run_stage("warmstart", params, overrides)


@app.command()
def train(
    params: ParamsOpt = "params.yaml",
    overrides: OverridesArg = None,
) -> None:
    """Run the co-evolution training flow (modes: codea1, golden, selfplay); resumes automatically."""
    _run_stage("train", params, overrides)


@app.command()
def evaluate(
    params: ParamsOpt = "params.yaml",
    overrides: OverridesArg = None,
) -> None:
    """Evaluate the Code LLM (avg@n, pass@k, base/plus) and the Test LLM (pass@5, mut@5, Mul); write the report."""
    _run_stage("evaluate", params, overrides)


@app.command()
def register(
    params: ParamsOpt = "params.yaml",
    overrides: OverridesArg = None,
) -> None:
    """Register the trained checkpoints in MLflow; promote to 'champion' only if the evaluation beats it."""
    _run_stage("register", params, overrides)


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def solve(ctx: typer.Context) -> None:
    """Test-time collaboration: candidates from the Code LLM, tests from the Test LLM, the best-tested code wins.

    Usage: codea1 solve --problem FILE [--params FILE] [key=value ...]
    """
    _run_main("solve", list(ctx.args))


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def attack(ctx: typer.Context) -> None:
    """Adversarial tests for your function: codea1 attack FILE.py::function [--spec TEXT]."""
    _run_main("attack", list(ctx.args))


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def plan(ctx: typer.Context) -> None:
    """Estimate the peak GPU memory of a training config and say whether it fits 80 GB and 141 GB GPUs.

    Usage: codea1 plan --params FILE [--gpu-gb N] [key=value ...]
    """
    _run_main("plan", list(ctx.args))


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def serve(ctx: typer.Context) -> None:
    """Register Prefect deployments (train, evaluate) so runs can be started and scheduled from the UI."""
    _run_main("serve", list(ctx.args))


@app.command(context_settings=PASSTHROUGH)
def deploy(ctx: typer.Context) -> None:
    """Create train/evaluate/pipeline deployments on a Prefect work pool (default: process pool)."""
    _run_main("deploy", list(ctx.args))


@app.command()
def ui(
    prefect_port: int = typer.Option(4200, help="Prefect UI port"),
    mlflow_port: int = typer.Option(5000, help="MLflow UI port"),
    params: str = typer.Option("params.yaml", help=PARAMS_HELP),
) -> None:
    """Start the Prefect and MLflow UIs on 127.0.0.1 and print their URLs (Ctrl-C stops both)."""
    from tools.ui import start_uis

    raise typer.Exit(start_uis(params, prefect_port, mlflow_port))


def main() -> None:  # pragma: no cover - console-script shim
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
