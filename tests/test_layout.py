"""Layout guards: the mlflow/ folder never shadows the mlflow package; dvc.yaml params exist in params.yaml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
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
    packages = ["codea1_core", "sandbox", "tracking", "workspace", "gates", "tasks", "flows", "tools"]
    for name in [*packages, "mlflow", "tests", "bench"]:
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


def _dvc_params(repo_root: Path) -> list[tuple[str, str]]:
    dvc = yaml.safe_load((repo_root / "dvc.yaml").read_text())
    used = []
    for name, stage in dvc["stages"].items():
        for entry in stage.get("params", []):
            keys = entry if isinstance(entry, str) else [k for spec in entry.values() for k in spec or ()]
            used.extend((name, k) for k in ([keys] if isinstance(keys, str) else keys))
    assert used, "dvc.yaml declares no params"
    return used


@pytest.mark.parametrize("rel", ["params.yaml", "configs/qwen2.5-coder-1.5b.yaml"])
def test_shipped_params_files_load_and_cover_dvc_params(repo_root: Path, rel: str) -> None:
    """Each shipped params file validates and can replace params.yaml under `dvc repro` (every key present)."""
    from codea1_core.config import load_config

    cfg = load_config(repo_root / rel, [])
    params = yaml.safe_load((repo_root / rel).read_text())
    missing = [f"{stage}: {key}" for stage, key in _dvc_params(repo_root) if not _lookup(params, key)]
    assert not missing, f"dvc.yaml params missing from {rel}: {missing}"
    bench = cfg.eval.promote_metric.split("/")[1]
    assert bench.split("_")[0] in {b.split("_")[0] for b in cfg.data.eval_benchmarks + cfg.eval.test_sources}


def test_real_model_config_is_the_papers_recipe(repo_root: Path) -> None:
    from codea1_core.config import load_config

    cfg = load_config(repo_root / "configs" / "qwen2.5-coder-1.5b.yaml", [])
    assert cfg.model.code_path == cfg.model.test_path == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert (cfg.data.train_batch_size, cfg.rollout.n_code, cfg.rollout.n_tests, cfg.reward.k) == (
        256,
        8,
        8,
        8,
    )
    assert (cfg.data.epochs, cfg.reward.alpha, cfg.mistake_book.top_k, cfg.rollout.backend) == (
        3,
        0.5,
        8,
        "vllm",
    )


def test_packages_are_explicit(repo_root: Path) -> None:
    import tomllib

    project = tomllib.loads((repo_root / "pyproject.toml").read_text())
    packages = project["tool"]["setuptools"]["packages"]
    on_disk = {
        ".".join(init.parent.relative_to(repo_root).parts)
        for top in ["codea1_core", "sandbox", "tracking", "workspace", "gates", "tasks", "flows", "tools"]
        for init in (repo_root / top).rglob("__init__.py")
    }
    assert sorted(packages) == sorted(on_disk)  # a sub-package missing here would be left out of the wheel
    assert project["project"]["scripts"]["codea1"] == "flows.cli:app"


@pytest.mark.e2e
def test_cli_help_lists_every_subcommand() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    for sub in [
        "prepare",
        "warmstart",
        "train",
        "evaluate",
        "register",
        "solve",
        "attack",
        "serve",
        "ui",
        "deploy",
        "plan",
    ]:
        assert sub in proc.stdout, sub


def test_readme_layout_names_every_module(repo_root: Path) -> None:
    """README's Layout section matches the tree: every module and core sub-package is named there, and every
    name it gives under codea1_core/, sandbox/, tracking/, workspace/, gates/, tasks/, flows/ and tools/
    exists."""
    import re

    readme = (repo_root / "README.md").read_text()
    block = readme.split("## Layout", 1)[1].split("```", 2)[1]
    words = set(re.findall(r"[a-z_][a-z0-9_]*", block))
    missing = []
    for top in ["codea1_core", "sandbox", "tracking", "workspace", "gates", "tasks", "flows", "tools"]:
        for path in (repo_root / top).rglob("*.py"):
            name = path.parent.name if path.name == "__init__.py" else path.stem
            if path.name == "__init__.py" and path.parent.name == top:
                continue
            if name not in words:
                missing.append(str(path.relative_to(repo_root)))
    assert not missing, f"README's Layout section does not mention: {missing}"
    for sub in re.findall(r"^  ([a-z_]+)/", block, flags=re.M):
        assert (repo_root / "codea1_core" / sub / "__init__.py").is_file(), f"Layout names codea1_core/{sub}/"
