"""Shared entry-point plumbing for the flows: ``python -m flows.<stage> [--params FILE] [key=value ...]``.

Every DVC stage and every ``codea1`` subcommand goes through :func:`stage_main`, so a malformed
``params.yaml`` or override always ends in one clear line naming the file and dotted key (exit 2),
never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from codea1_core.config import Config, ConfigError, load_config

PROJECT_LOGGERS = ("codea1", "codea1_core", "tasks", "flows", "sandbox")
"""Logger names of this project (``codea1.<part>`` and module loggers); their INFO lines reach the console."""


def child_env() -> dict[str, str]:
    """This process's environment with this interpreter's ``bin/`` first on ``PATH``, for child processes
    (``dvc`` and the stages it runs call ``python``: it must be this environment's)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


class UserError(Exception):
    """A mistake the user can fix (bad input, missing file): printed as one line, exit 2."""


def parse_stage_args(argv: list[str] | None, description: str) -> tuple[str, list[str]]:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. reward.alpha=0.25")
    args = parser.parse_args(argv)
    return args.params, list(args.overrides)


def load_stage_config(params: str, overrides: list[str]) -> Config:
    """Load and validate params; raises ConfigError with a one-line message."""
    return load_config(params, overrides)


def run_user_errors(fn: Callable[[], Any]) -> int:
    """Run ``fn``; turn user mistakes (ConfigError, UserError) into one line on stderr and exit code 2."""
    try:
        fn()
    except (ConfigError, UserError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


def stage_main(run: Callable[[Config], Any], description: str, argv: list[str] | None = None) -> int:
    """``python -m flows.<stage>``: parse args, load params, call ``run(cfg)``; exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Prefect has usually configured the root logger already (level WARNING, its console handler), which makes
    # basicConfig a no-op: our own INFO lines (warm-start epochs, checkpoint notes) need their loggers' level set.
    for name in PROJECT_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)
    params, overrides = parse_stage_args(argv, description)
    return run_user_errors(lambda: run(load_stage_config(params, overrides)))
