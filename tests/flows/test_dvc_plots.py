"""Every data plot of dvc.yaml names its ``y``: without it DVC draws an arbitrary column of the file.

Regression: the train stage declared ``outputs/train/history.csv`` as a plot with ``x: iteration`` and no ``y``,
so ``dvc plots show`` drew the file's last column. (Image plots such as ``training.png`` have no axes.)
"""

from __future__ import annotations

from pathlib import Path

import yaml

DATA = (".csv", ".tsv", ".json", ".yaml")


def test_every_data_plot_has_a_y(repo_root: Path) -> None:
    pipeline = yaml.safe_load((repo_root / "dvc.yaml").read_text())
    missing = []
    for name, stage in pipeline["stages"].items():
        for entry in stage.get("plots", []):
            path, props = (entry, {}) if isinstance(entry, str) else next(iter(entry.items()))
            if path.endswith(DATA) and not (props or {}).get("y"):
                missing.append(f"stage {name}: {path}")
    for entry in pipeline.get("plots", []):
        name, props = (entry, {}) if isinstance(entry, str) else next(iter(entry.items()))
        if str(name).endswith(DATA) or not (props or {}).get("y"):
            if not str(name).endswith((".png", ".jpg", ".svg")):
                missing.append(f"plots: {name}")
    assert not missing, missing


def test_the_folder_dvc_plots_show_writes_is_ignored(repo_root: Path) -> None:
    """``dvc plots show`` renders into ``dvc_plots/`` in the working folder: git must not list it as untracked."""
    import subprocess

    proc = subprocess.run(["git", "check-ignore", "-q", "dvc_plots/index.html"], cwd=repo_root, check=False)
    assert proc.returncode == 0, "dvc_plots/ is not in .gitignore"
