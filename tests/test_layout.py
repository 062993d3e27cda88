"""Layout guards: the mlflow/ folder never shadows the mlflow package; dvc.yaml params exist in params.yaml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml


def test_import_mlflow_resolves_to_site_packages(repo_root: Path) -> None:
    """Regression guard: an ``mlflow/__init__.py`` in the repo would shadow the installed package."""
    assert not (repo_root / "mlflow" / "__init__.py").exists()
    assert not list((repo_root / "mlflow").glob("*.py"))
    proc = subprocess.run(
        [sys.executable, "-c", "import mlflow, sys; print(mlflow.__file__)"],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "site-packages" in proc.stdout, proc.stdout


def test_top_level_layout(repo_root: Path) -> None:
    for name in ["flows", "tasks", "codea1_core", "sandbox", "mlflow", "tests", "bench"]:
        assert (repo_root / name).is_dir(), name
    for name in ["dvc.yaml", "params.yaml", "pyproject.toml", "Makefile", "README.md", "constraints.txt"]:
        assert (repo_root / name).is_file(), name


def _lookup(tree: dict, dotted: str) -> bool:
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_every_dvc_param_exists_in_params_yaml(repo_root: Path) -> None:
    params = yaml.safe_load((repo_root / "params.yaml").read_text())
    dvc = yaml.safe_load((repo_root / "dvc.yaml").read_text())
    used = []
    for name, stage in dvc["stages"].items():
        for entry in stage.get("params", []):
            keys = entry if isinstance(entry, str) else [k for spec in entry.values() for k in spec]
            used.extend((name, k) for k in ([keys] if isinstance(keys, str) else keys))
    assert used, "dvc.yaml declares no params"
    missing = [f"{stage}: {key}" for stage, key in used if not _lookup(params, key)]
    assert not missing, f"dvc.yaml params missing from params.yaml: {missing}"


def test_packages_are_explicit(repo_root: Path) -> None:
    import tomllib

    project = tomllib.loads((repo_root / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["packages"] == ["codea1_core", "sandbox", "tasks", "flows"]
    assert project["project"]["scripts"]["codea1"] == "flows.cli:app"


def test_cli_help_lists_every_subcommand() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    for sub in ["prepare", "warmstart", "train", "evaluate", "register", "solve", "attack", "serve", "ui"]:
        assert sub in proc.stdout, sub
