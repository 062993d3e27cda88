"""A stage subcommand's ``--help`` and a bad key reach their one line before torch, Prefect, MLflow or GX load;
so does a bad key given to a DVC stage's command, ``python -m flows.<stage>``.

Regression: ``codea1 train --help`` took 6-11 s and a typo'd key 11-18 s on a loaded machine, because the CLI
imported the stage module (and with it torch, transformers, Prefect, MLflow) before it parsed the arguments
and checked the params; ``python -m flows.<stage> no.such=1`` took 2-7 s on an idle machine, its module's imports
running before its ``__main__`` block read the params. The checks look at what the process imported; the DVC
command's also at a clock, with a bound well above the check's own time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import write_params

from codea1_core.config import Config
from flows import common

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


STAGES = ["prepare", "warmstart", "train", "evaluate", "register"]
UNKNOWN_KEY = "error: override no.such: unknown section no"


def _stage_command(
    stage: str, *args: str, importtime: bool = False
) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if k != "DVC_STAGE"}
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", f"flows.{stage}", *args]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    return proc, time.monotonic() - t0


@pytest.mark.e2e
@pytest.mark.parametrize("stage", STAGES)
def test_a_dvc_stage_command_refuses_a_bad_key_in_one_line_within_two_seconds(stage: str) -> None:
    proc, seconds = _stage_command(stage, "no.such=1")
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", UNKNOWN_KEY + "\n")
    assert seconds < 2.0, f"python -m flows.{stage} took {seconds:.1f} s to refuse a bad key"


@pytest.mark.e2e
@pytest.mark.parametrize("stage", STAGES)
def test_a_dvc_stage_command_refuses_a_bad_key_before_any_heavy_import(stage: str) -> None:
    proc, _ = _stage_command(stage, "no.such=1", importtime=True)
    imported = {
        line.rpartition("|")[2].strip().split(".")[0]
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    }
    said = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2 and said == [UNKNOWN_KEY]
    assert "flows" in imported and imported.isdisjoint(HEAVY), sorted(imported & set(HEAVY))


def test_params_the_stage_accepts_pass_the_first_check_and_pin_nothing(monkeypatch) -> None:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(REPO)  # the project's params.yaml, its paths relative to the project
    common.check_params_first("train", ["seed=3", "model.cpu_threads=2"])
    assert "OMP_NUM_THREADS" not in os.environ and "MKL_NUM_THREADS" not in os.environ


def test_the_first_check_names_dvcs_recovery_under_dvc(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("DVC_STAGE", "train")
    params = write_params(Config(), tmp_path / "params.yaml")
    with pytest.raises(SystemExit) as exc:
        common.check_params_first("train", ["--params", params, "reward.alpha=2"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert "reward.alpha" in err and "`dvc checkout train`" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["--help", "no.such=1"],
        ["--code-model", "dir", "no.such=1"],  # evaluate's own options: its own parser reads them
        ["--compare", "a.json", "b.json"],
        ["no.such=1", "--params", "params.yaml", "seed=2"],  # an argparse mistake the stage's parser reports
        ["--params"],
    ],
)
def test_arguments_beyond_params_and_overrides_are_left_to_the_stage(argv: list[str]) -> None:
    assert common.plain_stage_args(argv) is None
    common.check_params_first("evaluate", argv)  # returns: nothing checked, nothing printed


def test_plain_arguments_are_read_as_the_stage_reads_them() -> None:
    argv = ["--params", "other.yaml", "seed=2", "reward.alpha=0.25"]
    assert common.plain_stage_args(argv) == common.parse_stage_args(argv, "d")
    assert common.plain_stage_args([]) == ("params.yaml", [])


def test_prepare_and_register_check_only_what_they_need() -> None:
    assert common.stage_checks("prepare") == ()
    assert common.stage_checks("register") == ("metrics",)
    assert common.stage_checks("train") == common.ALL_CHECKS
