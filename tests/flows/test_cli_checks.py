"""A stage subcommand's ``--help`` and a bad key reach their one line before torch, Prefect, MLflow or GX load.

Regression: ``codea1 train --help`` took 6-11 s and a typo'd key 11-18 s on a loaded machine, because the CLI
imported the stage module (and with it torch, transformers, Prefect, MLflow) before it parsed the arguments
and checked the params. The checks below look at what the process imported, not at a clock.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "prefect", "mlflow", "great_expectations")

PROBE = """
import json, sys
from flows.cli import app
try:
    app(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = [m for m in {heavy!r} if m in sys.modules]
print("PROBE " + json.dumps({{"code": code, "heavy": heavy}}), file=sys.stderr)
"""


def _cli(*args: str) -> tuple[dict, str, str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    probe = [line for line in proc.stderr.splitlines() if line.startswith("PROBE ")]
    assert probe, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("PROBE ")]
    return json.loads(probe[0].removeprefix("PROBE ")), proc.stdout, "\n".join(lines)


@pytest.mark.e2e
@pytest.mark.parametrize("stage", ["prepare", "warmstart", "train", "evaluate", "register"])
def test_stage_help_imports_nothing_heavy(stage: str) -> None:
    result, out, _ = _cli(stage, "--help")
    assert result["code"] in (0, None) and result["heavy"] == []
    assert out.startswith(f"usage: codea1 {stage}") and "--params" in out


@pytest.mark.e2e
@pytest.mark.parametrize(
    "override, message",
    [
        ("rewrd.alpha=0.3", "unknown section rewrd"),
        ("grpo.lr=.inf", "grpo.lr: must be a finite number"),
        ("eval.promote_metric=code/nope/pass@1", "eval.promote_metric"),
        ("rollout.max_new_tokens_code=200000", "rollout.max_new_tokens_code=200000"),
    ],
)
def test_a_bad_key_or_value_is_one_line_before_any_heavy_import(override: str, message: str) -> None:
    result, _, err = _cli("train", override)
    assert result["code"] == 2 and result["heavy"] == []
    assert err.count("\n") == 0 and message in err and "Traceback" not in err
