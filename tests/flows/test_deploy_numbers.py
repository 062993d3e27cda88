"""The warm start scores the same whichever entry point evaluates it: the DVC stage or a deployment run.

The evaluate stage (DVC's ``python -m flows.evaluate``) keeps the warm start's numbers in
``<eval.out_dir>/baseline_cache/``; a deployment run evaluates into a new run folder, where that cache is empty.
An entry written under other params (``rollout.batch_size`` splits the prompts into chunks seeded by their offset,
so it changes the samples) must never be read back as this run's warm start, or the warm-start column depends on
which entry point ran. Regression: the key covered ``eval``/``tests``/``sandbox`` but no ``rollout``/``model`` key,
so after ``make run`` a ``rollout.batch_size=4`` run through DVC reported the default run's warm start, and the
same params through the pipeline deployment another (about 48 of the warm start's keys).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import build_tiny, tiny_config

from codea1_core.config import Config
from flows.evaluate import BASELINE_PREFIX, baseline_cache_key


def test_every_key_the_evaluation_reads_is_in_the_baseline_cache_key(tmp_path: Path) -> None:
    cfg = Config()
    paths = {"code": str(tmp_path), "test": str(tmp_path)}
    key = baseline_cache_key(cfg, paths)
    for changed in (
        {"rollout.batch_size": 4},
        {"rollout.backend": "vllm"},
        {"model.cpu_threads": 1},
        {"model.cpu_numerics": "native"},
        {"model.dtype": "float32"},
        {"eval.temperature": 0.5},
    ):
        assert baseline_cache_key(cfg.replace(**changed), paths) != key, changed
    for training_only in ({"grpo.lr": 0.5}, {"rollout.n_code": 2}, {"rollout.max_new_tokens_code": 64}):
        assert baseline_cache_key(cfg.replace(**training_only), paths) == key, training_only


def _warmstart_numbers(metrics_file: Path) -> dict[str, float]:
    metrics = json.loads(metrics_file.read_text())
    return {k: v for k, v in metrics.items() if k.startswith(f"{BASELINE_PREFIX}/")}


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_dvc_stage_and_deployment_give_the_same_warm_start(
    tmp_path: Path, prefect_harness, monkeypatch, repo_root: Path
) -> None:
    """The same params through the evaluate stage's command (in a workspace evaluated before under other params)
    and through the deployment's flow (``run_dir="auto"``): the warm-start keys agree one by one.

    A random tiny model scores 0 under any batch size, so the workspace's earlier entry is marked (its numbers
    set to -1) to make a reuse of it visible; the real entry holds other numbers for the same reason.
    """
    from prefect.settings import PREFECT_API_URL

    from codea1_core.data.lab import lab_problems
    from codea1_core.data.prepared import prepared_record, save_prepared
    from flows.evaluate import evaluate_flow

    work = tmp_path / "work"
    model = build_tiny(tmp_path / "warm")
    cfg = tiny_config(
        tmp_path,
        model,
        **{
            "data.prepared_dir": str(work / "prepared"),
            "eval.n_samples": 2,
            "eval.k_list": [1],
            "eval.max_new_tokens": 8,
            "eval.max_mutants": 2,
            "eval.out_dir": str(work / "outputs" / "eval"),
            "orchestration.checkpoint_dir": str(work / "outputs" / "train"),
            "tracking.backend": "null",
        },
    )
    save_prepared(
        lab_problems(cfg.lab, "test")[:3],
        work / "prepared" / "eval_lab_heldout.parquet",
        prepared_record(cfg, "eval_lab_heldout"),  # what evaluate checks before reading it
    )
    for role in ("code", "test"):  # the "trained" models: other folders than the warm start's
        shutil.copytree(model, work / "outputs" / "train" / "final" / role)
    params = work / "params.yaml"
    params.write_text(yaml.safe_dump(cfg.to_dict()))
    env = dict(os.environ, OMP_NUM_THREADS="1", PREFECT_API_URL=str(PREFECT_API_URL.value()))

    def stage(*overrides: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "flows.evaluate", "--params", str(params), *overrides],
            cwd=work,
            env=dict(env, PYTHONPATH=str(repo_root)),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]

    stage("rollout.batch_size=64")  # the workspace's earlier evaluation, under other params
    cache = work / "outputs" / "eval" / "baseline_cache"
    (earlier,) = cache.iterdir()
    marked = {k: -1.0 for k in json.loads(earlier.read_text())}
    earlier.write_text(json.dumps(marked))

    stage("rollout.batch_size=1")
    through_dvc = _warmstart_numbers(work / "outputs" / "eval" / "metrics.json")
    monkeypatch.chdir(work)
    evaluate_flow(str(params), ["rollout.batch_size=1"], run_dir="auto")
    (run_folder,) = (work / "runs").iterdir()
    through_deployment = _warmstart_numbers(run_folder / "eval" / "metrics.json")

    assert through_deployment and -1.0 not in through_deployment.values()
    assert sorted(through_dvc) == sorted(through_deployment)
    differ = {
        k: (through_dvc[k], through_deployment[k])
        for k in through_dvc
        if through_dvc[k] != through_deployment[k]
    }
    assert not differ, differ
    assert len(list(cache.iterdir())) == 2  # the earlier entry stays, for the params it was written under
