"""The DVC pipeline's first stage: ``params.yaml`` checked before DVC removes any stage's outputs.

DVC removes a stage's outputs before it runs the stage's command, so a value a stage refuses
(``dvc exp run -S reward.alpha=2``) would be refused only after DVC deleted what the stage wrote last time. This
stage tracks the whole file, runs before every other stage (``prepare`` depends on its output, and every stage
on ``prepare``'s) and fails in one line naming the key, before any other stage's outputs are touched. Its output
holds no param value (:data:`CHECKED`), so rerunning it never reruns the stages after it.

What it does not: check data, models or the machine (each stage does when it starts), or replace a stage's own
check (a stage run on its own, ``codea1 train ...``, checks its params first).

How to run: ``python -m flows.params_check [--params FILE] [key=value ...]`` (DVC runs it as the ``params``
stage).
"""

from __future__ import annotations

import json
from pathlib import Path

from codea1_core.atomic import write_text_atomic
from flows.common import check_loaded, parse_stage_args, run_user_errors, stage_config

OUTPUT = Path("outputs/params_check.json")
CHECKED = {"params": "checked"}
"""The stage's whole output: the same bytes for every valid params file."""


def check(params: str, overrides: list[str]) -> None:
    """Load and validate ``params`` + ``overrides`` (ConfigError naming the key) and check its promotion metrics
    are names the evaluate stage writes (a typo there would otherwise surface at register, after training),
    then write :data:`OUTPUT`."""
    check_loaded(stage_config(params, overrides), params, ("metrics",))
    write_text_atomic(OUTPUT, json.dumps(CHECKED) + "\n")


def main(argv: list[str] | None = None) -> int:
    params, overrides = parse_stage_args(argv, "Check params.yaml before any DVC stage runs.")
    return run_user_errors(lambda: check(params, overrides))


if __name__ == "__main__":
    raise SystemExit(main())
