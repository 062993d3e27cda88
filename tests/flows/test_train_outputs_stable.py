"""A second fresh run of the train stage writes the same DVC outputs: ``dvc.lock`` does not change.

Bug guarded: the stage's outputs held wall-clock values (``time/*``, ``*/seconds``, ``sandbox/calls_per_s`` in
``history.csv``, ``metrics.json`` and every checkpoint's history) and the MLflow run id (``final/DONE.json``, the
checkpoints' ``run.json`` and ``state.json``), so a fresh clone's ``make run`` rewrote ``dvc.lock`` with new
hashes though the run decided the same things. Here the real train stage runs under ``dvc repro`` on a tiny config,
then again where a fresh clone would (no outputs, no MLflow store, no DVC cache, no ``dvc.lock``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from support import build_tiny, make_repo

from tracking.results import RUNS_FILE


def _repro(repo: Path, env: dict[str, str]) -> dict:
    proc = subprocess.run(["dvc", "repro"], cwd=repo, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return yaml.safe_load((repo / "dvc.lock").read_text())["stages"]["train"]


def _fresh_clone(repo: Path) -> None:
    for path in ("outputs", "mlflow.db", "artifacts", ".dvc/cache", "dvc.lock"):
        target = repo / path
        shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_a_second_fresh_run_leaves_dvc_lock_unchanged(
    prefect_harness, tmp_path: Path, repo_root: Path
) -> None:
    repo = tmp_path / "repo"
    env = make_repo(repo, build_tiny(tmp_path / "model"), repo_root)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["orchestration"]["checkpoint_dir"] = "outputs/train"  # relative, as the shipped params
    params["tracking"] |= {"tracking_uri": "sqlite:///mlflow.db", "artifact_location": "artifacts"}
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    first = _repro(repo, env)
    first_runs = json.loads((repo / "outputs" / "train" / RUNS_FILE).read_text())
    timings = (repo / "outputs" / "train" / "timings.csv").read_text().splitlines()
    assert timings[0].startswith("iteration,") and "time/iteration_s" in timings[0] and len(timings) == 3
    _fresh_clone(repo)
    second = _repro(repo, env)
    assert json.loads((repo / "outputs" / "train" / RUNS_FILE).read_text()) != first_runs  # a new MLflow run
    assert second["outs"] == first["outs"]
    history = (repo / "outputs" / "train" / "history.csv").read_text()
    assert "code/reward_mean" in history and "time/" not in history and "seconds" not in history
