"""The ``codea1`` CLI as a user meets it: one help style, run from anywhere, port clashes, registry models.

Regressions: ``codea1 deploy --help`` listed no options and ``codea1 plan --help`` printed a parser named
after the script; run from another folder a command failed on ``params.yaml: file not found``, and with an
absolute ``--params`` it read the relative paths of that file against the wrong folder (a misleading
"cannot read the architecture of 'outputs/warmstart/code'", or ``prepare`` writing ``data/prepared`` into the
current folder); a second ``codea1 ui`` failed inside Prefect with a traceback naming a ``--port`` flag
``codea1 ui`` does not have; ``solve --code-model models:/codea1-code@champion`` was read as a hub id.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flows.cli import app, project_dir

REPO = Path(__file__).resolve().parents[2]

HELP_OPTIONS = {
    "prepare": ["--params", "overrides"],
    "warmstart": ["--params"],
    "train": ["--params"],
    "evaluate": ["--params"],
    "register": ["--params"],
    "solve": ["--problem", "--code-model", "--test-model"],
    "attack": ["target", "--test-model"],
    "plan": ["--params", "--gpu-gb"],
    "serve": ["--cron", "--limit"],
    "deploy": ["--pool", "--image", "--source", "--cron"],
    "ui": ["--prefect-port", "--mlflow-port"],
    "data": ["fetch"],
}


@pytest.mark.parametrize("command", sorted(HELP_OPTIONS))
def test_every_subcommand_help_lists_its_options_in_one_style(command: str) -> None:
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"usage: codea1 {command}"), result.output
    for option in HELP_OPTIONS[command]:
        assert option in result.output, (command, option, result.output)


def test_help_covers_every_subcommand() -> None:
    assert {c.name or c.callback.__name__ for c in app.registered_commands} == set(HELP_OPTIONS)


def _project(root: Path) -> Path:
    """A project folder: dvc.yaml, and a params.yaml whose Code LLM is a relative folder inside it."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["model"]["code_path"] = params["model"]["test_path"] = "models/tiny"
    (root / "models" / "tiny").mkdir(parents=True)
    shutil.copy(REPO / "configs" / "qwen2.5-coder-1.5b.config.json", root / "models" / "tiny" / "config.json")
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    (root / "dvc.yaml").write_text("stages: {}\n")
    return root


def test_project_dir_rules(tmp_path: Path) -> None:
    root = _project(tmp_path / "proj")
    (root / "configs").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert project_dir(["--params", str(root / "params.yaml")], elsewhere) == root
    assert project_dir(["--params", str(root / "configs" / "x.yaml")], elsewhere) == root
    assert project_dir(["--params", "params.yaml"], root) is None  # already there
    assert project_dir([], root / "configs") == root  # from a subfolder: the project above
    assert project_dir(["--params", str(elsewhere / "p.yaml")], root) is None  # not a project: stay


@pytest.mark.e2e  # the CLI in a subprocess
def test_absolute_params_from_another_folder_reads_the_projects_paths(tmp_path: Path) -> None:
    root = _project(tmp_path / "proj")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "plan", "--params", str(root / "params.yaml"), "--gpu-gb", "80"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 1), proc.stderr  # 1: does not fit; both mean the plan was made
    assert "memory plan for models/tiny" in proc.stdout, proc.stdout + proc.stderr
    assert f"running in the project {root}" in proc.stderr


def _listening() -> tuple[socket.socket, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


def test_ui_port_clash_is_one_line_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tools import ui

    started: list[object] = []
    monkeypatch.setattr(ui.subprocess, "Popen", lambda *a, **k: started.append(a))
    sock, port = _listening()
    with sock:
        rc = ui.main(["--prefect-port", str(port), "--mlflow-port", "1", "--params", str(tmp_path / "none")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and started == []
    assert len(err) == 1 and f"port {port}" in err[0] and "--prefect-port" in err[0], err


def test_ui_tracking_uri_to_export_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tools.ui import absolute_sqlite

    monkeypatch.chdir(tmp_path)
    assert absolute_sqlite("sqlite:///mlflow/mlflow.db") == f"sqlite:///{tmp_path}/mlflow/mlflow.db"
    assert absolute_sqlite("http://host:5000") == "http://host:5000"


def test_solve_reads_registry_uris_and_defaults_to_the_champion(
    mlflow_cfg, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.common import UserError
    from flows.solve import registry_aware
    from tracking import registry
    from tracking.runs import MlflowTracker

    monkeypatch.chdir(tmp_path)  # the download cache is relative to the project
    cfg = mlflow_cfg
    assert registry_aware(cfg, "code", None) is None  # no champion yet: the workspace model
    tracker = MlflowTracker(cfg)
    version = tracker.register("code", tiny_model_dir, 3)
    tracker.end()
    registry.set_alias(cfg, "codea1-code", version, "champion")
    by_uri = registry_aware(cfg, "code", "models:/codea1-code@champion")
    assert Path(by_uri, "config.json").is_file() and Path(by_uri, "tokenizer.json").is_file()
    assert registry_aware(cfg, "code", None) == by_uri  # the champion by default
    assert registry_aware(cfg, "code", f"models:/codea1-code/{version}") == by_uri
    assert registry_aware(cfg, "code", str(tiny_model_dir)) == str(tiny_model_dir)  # a folder as it is
    with pytest.raises(UserError, match="models:/codea1-code@nope: not in the MLflow registry"):
        registry_aware(cfg, "code", "models:/codea1-code@nope")
    from flows.evaluate import evaluated_policy

    policy = evaluated_policy(cfg, "code", by_uri)  # what solve builds from it
    assert policy is not None
