"""The ``codea1`` command line: one subcommand per pipeline stage, plus solve / attack / plan / serve / deploy /
ui / data.

Every subcommand owns an argparse parser in its flow module, and every argument (``--help`` included) goes to
it, so ``codea1 <command> --help`` lists the real options, in one style, with ``usage: codea1 <command>``. The
stage subcommands take ``--params FILE`` and ``key=value`` overrides exactly like the DVC stages
(``python -m flows.<stage>``), which they call; user mistakes end in one line on stderr and exit code 2.

Where it runs: in the project (the folder with ``params.yaml`` and ``dvc.yaml``), since the paths in
``params.yaml`` (``data/prepared``, ``outputs/...``, ``mlflow/``) are relative to it. Run from elsewhere, a
command moves to the project first (:func:`project_dir`): the one holding an absolute ``--params`` file, else
the one above the current folder, else this source checkout; file arguments (``--problem``, ``attack``'s
target) are made absolute before the move, and the move is said in one line on stderr.
"""

from __future__ import annotations

import ast
import importlib
import os
import sys
from pathlib import Path

import typer

app = typer.Typer(
    name="codea1",
    help="Co-evolve a Code LLM and a Test LLM by RL (Code-A1): data, training, evaluation, inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}
"""Every argument, ``--help`` included, goes to the subcommand's own argparse parser."""
SOURCE_DIR = Path(__file__).resolve().parent.parent
"""This source checkout (an editable install's project)."""
STAGES = ("prepare", "warmstart", "train", "evaluate", "register")
FILE_OPTIONS = ("--problem",)
"""Options whose value is a user's file: made absolute before moving to the project."""


def _is_project(folder: Path) -> bool:
    return (folder / "dvc.yaml").is_file() and (folder / "params.yaml").is_file()


def _option_value(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    return None


def project_dir(args: list[str], cwd: Path | None = None) -> Path | None:
    """The project a command runs in: the folder holding ``--params`` (or its nearest ancestor that is a
    project), else the current folder or an ancestor that is one, else this source checkout; None when
    the current folder will do (or nothing better is known)."""
    cwd = (cwd or Path.cwd()).resolve()
    params = _option_value(args, "--params")
    if params is not None:
        start = (cwd / params).resolve().parent
        found = next((f for f in (start, *start.parents) if _is_project(f)), None)
        return None if found in (None, cwd) else found
    if (cwd / "params.yaml").is_file():
        return None
    found = next((f for f in cwd.parents if _is_project(f)), None)
    if found is None and _is_project(SOURCE_DIR):
        found = SOURCE_DIR
    return found


def _absolute_files(args: list[str], cwd: Path, target_positional: bool) -> list[str]:
    """``args`` with ``--params``, :data:`FILE_OPTIONS` values and (attack) ``FILE.py::function`` absolute."""
    out = list(args)
    for i, arg in enumerate(out):
        for name in ("--params", *FILE_OPTIONS):
            if arg == name and i + 1 < len(out):
                out[i + 1] = str((cwd / out[i + 1]).resolve())
            elif arg.startswith(f"{name}="):
                out[i] = f"{name}={(cwd / arg.split('=', 1)[1]).resolve()}"
        if (
            target_positional
            and "::" in arg
            and not arg.startswith("-")
            and (i == 0 or out[i - 1] != "--spec")
        ):
            file, func = arg.rsplit("::", 1)
            out[i] = f"{(cwd / file).resolve()}::{func}"
    return out


def _delegate(name: str, args: list[str]) -> None:
    """Move to the project (see the module docstring), then call ``flows.<name>.main(args)`` (``tools.ui`` for
    ``ui``: a tool built on the pipeline, not part of it)."""
    cwd = Path.cwd().resolve()
    if "-h" not in args and "--help" not in args:
        root = project_dir(args, cwd)
        if root is not None:
            args = _absolute_files(args, cwd, target_positional=name == "attack")
            print(
                f"codea1: running in the project {root} (its paths in params.yaml are relative to it)",
                file=sys.stderr,
            )
            os.chdir(root)
    if name in STAGES:
        from flows.common import stage_checks, stage_main

        def run(params: str, overrides: list[str]) -> object:  # imports torch, Prefect, ...: after the checks
            return importlib.import_module(f"flows.{name}").run(params, overrides)

        raise typer.Exit(stage_main(run, stage_description(name), args, f"codea1 {name}", stage_checks(name)))
    module = importlib.import_module("tools.ui" if name == "ui" else f"flows.{name}")
    raise typer.Exit(module.main(args))


def stage_description(name: str) -> str:
    """The first line of ``flows/<name>.py``'s docstring, read from its source: ``--help`` and the params
    checks run before the stage module (and the torch, Prefect, MLflow it imports) is loaded."""
    source = Path(__file__).with_name(f"{name}.py").read_text(encoding="utf-8")
    doc = ast.get_docstring(ast.parse(source)) or name
    return doc.strip().splitlines()[0]


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def prepare(ctx: typer.Context) -> None:
    """Load problem sources, fill expected values in the sandbox, gate them, write data/prepared/."""
    _delegate("prepare", list(ctx.args))


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def warmstart(ctx: typer.Context) -> None:
    """Build the tiny lab model and SFT-warm-start the Code and Test LLMs (skipped for user models)."""
    _delegate("warmstart", list(ctx.args))


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def train(ctx: typer.Context) -> None:
    """Run the co-evolution training flow (modes: codea1, golden, selfplay); resumes automatically."""
    _delegate("train", list(ctx.args))


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def evaluate(ctx: typer.Context) -> None:
    """Evaluate the Code LLM (avg@n, pass@k, base/plus) and the Test LLM (pass@5, mut@5, Mul); write the report."""
    _delegate("evaluate", list(ctx.args))


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def register(ctx: typer.Context) -> None:
    """Register the trained checkpoints in MLflow; promote to 'champion' only if the evaluation beats it."""
    _delegate("register", list(ctx.args))


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def solve(ctx: typer.Context) -> None:
    """Test-time collaboration: candidates from the Code LLM, tests from the Test LLM, the best-tested code wins."""
    _delegate("solve", list(ctx.args))


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def attack(ctx: typer.Context) -> None:
    """Adversarial tests for your function: codea1 attack FILE.py::function [--spec TEXT]."""
    _delegate("attack", list(ctx.args))


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def plan(ctx: typer.Context) -> None:
    """Estimate the peak GPU memory of a training config and say whether it fits 80 GB and 141 GB GPUs."""
    _delegate("plan", list(ctx.args))


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def serve(ctx: typer.Context) -> None:
    """Register Prefect deployments (train, evaluate) so runs can be started and scheduled from the UI."""
    _delegate("serve", list(ctx.args))


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def deploy(ctx: typer.Context) -> None:
    """Create train/evaluate/pipeline deployments on a Prefect work pool (default: process pool)."""
    _delegate("deploy", list(ctx.args))


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def ui(ctx: typer.Context) -> None:
    """Start the Prefect and MLflow UIs on 127.0.0.1 and print their URLs (Ctrl-C stops both)."""
    _delegate("ui", list(ctx.args))


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def data(ctx: typer.Context) -> None:
    """Download the pinned HumanEval+ / MBPP+ / MBPP releases into the project's data folder: codea1 data fetch."""
    _delegate("data", list(ctx.args))


def main() -> None:  # pragma: no cover - console-script shim
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
