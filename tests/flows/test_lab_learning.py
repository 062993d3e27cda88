"""Warm start vs trained: the evaluate stage's baseline keys, and (``slow``) the lab learns end to end.

Fast tests: the lab's seen/unseen subsets, ``warmstart/`` + ``delta/`` keys from injected policies, the
baseline cache. The ``slow`` test runs prepare -> warmstart -> train -> evaluate as subprocesses in a temp
dir with a shortened lab and asserts the Code LLM's held-out pass rate rises over its warm start.

Run: ``.venv/bin/python -m pytest tests/flows/test_lab_learning.py -q`` (add ``-m slow`` for the end-to-end run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import FakeExecutor, TextPolicy, fenced, problem

from codea1_core.config import Config, LabConfig
from codea1_core.data.lab import lab_problems
from codea1_core.evaluation.benchmarks import lab_subsets
from tasks.evaluate import score_codes

REPO = Path(__file__).resolve().parents[2]


def test_lab_subsets_split_seen_and_unseen_families():
    problems = lab_problems(LabConfig(train_per_family=1, heldout_per_family=2), "test")
    subsets = lab_subsets(problems)
    seen = {problems[i].metadata["family"] for i in subsets["seen"]}
    unseen = {problems[i].metadata["family"] for i in subsets["unseen"]}
    assert len(subsets["seen"]) == 2 * len(seen) and len(unseen) == 3 and not seen & unseen
    assert sorted(subsets["seen"] + subsets["unseen"]) == list(range(len(problems)))
    assert lab_subsets(problems[:2]) == {}  # only one kind: no subsets
    assert lab_subsets([problem()]) == {}  # not a lab problem


def test_score_codes_subsets_reuse_the_same_verdicts():
    good, bad = problem("lab/a/0"), problem("lab/b/0")
    ex = FakeExecutor()
    codes = [["def add(a, b):\n    return a + b\n"], ["def add(a, b):\n    return a - b\n"]]
    cfg = Config.from_dict({"eval": {"k_list": [1]}})
    m = score_codes([good, bad], codes, cfg, ex, "x", {"seen": [0], "unseen": [1]})
    assert m["code/x/base/pass@1"] == 50.0
    assert m["code/x_seen/base/pass@1"] == 100.0 and m["code/x_unseen/base/pass@1"] == 0.0
    alone = FakeExecutor()
    score_codes([good, bad], codes, cfg, alone, "x")
    assert ex.jobs == alone.jobs  # subsets execute nothing more


def _cfg(tmp_path: Path, **eval_kw) -> Config:
    return Config.from_dict(
        {
            "data": {"eval_benchmarks": ["toy"], "prepared_dir": str(tmp_path / "prepared")},
            "eval": {
                "n_samples": 2,
                "k_list": [1],
                "test_sources": ["toy"],
                "out_dir": str(tmp_path / "eval"),
            }
            | eval_kw,
            "orchestration": {"checkpoint_dir": str(tmp_path / "train")},
            "tracking": {"backend": "null"},
        }
    )


@pytest.mark.e2e
def test_evaluate_reports_warmstart_and_delta(tmp_path, prefect_harness):
    from prefect import flow

    from codea1_core.data.prepared import save_prepared
    from flows.evaluate import evaluate

    evaluate = flow(name="evaluate-injected", validate_parameters=False)(evaluate)  # a run, as the stage has
    ps = [problem("a")]
    save_prepared(ps, tmp_path / "prepared" / "eval_toy.parquet")
    oracle = TextPolicy(lambda text: fenced(ps[0].reference_solution))
    wrong = TextPolicy(lambda text: fenced("def add(a, b):\n    return 0\n"))
    golden = TextPolicy(lambda text: fenced("assert add(1, 2) == 3\nassert add(-1, 1) == 0"))
    silly = TextPolicy(lambda text: fenced("assert add(1, 2) == 4"))
    m = evaluate(
        _cfg(tmp_path),
        code_policy=oracle,
        test_policy=golden,
        executor=FakeExecutor(),
        baseline_policies=(wrong, silly),
    )
    assert m["code/toy/base/pass@1"] == 100.0 and m["warmstart/code/toy/base/pass@1"] == 0.0
    assert m["delta/code/toy/base/pass@1"] == 100.0
    assert m["delta/test/toy/pass@5"] == 100.0 and m["warmstart/test/toy/pass@5"] == 0.0
    assert "delta/code/toy/n_problems" not in m  # deltas only for rates
    on_disk = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert on_disk == m
    off = evaluate(
        _cfg(tmp_path, baseline=False),
        code_policy=oracle,
        test_policy=golden,
        executor=FakeExecutor(),
        baseline_policies=(wrong, silly),
    )
    assert not any(k.startswith(("warmstart/", "delta/")) for k in off)


def test_baseline_paths_and_cache_key(tmp_path):
    from flows.evaluate import baseline_cache_key, baseline_paths

    cfg = _cfg(tmp_path).replace(
        **{"model.code_path": str(tmp_path / "ws" / "code"), "model.test_path": str(tmp_path / "ws" / "test")}
    )
    assert baseline_paths(cfg, None, None) is None  # no warm-start dirs
    for role in ("code", "test"):
        (tmp_path / "ws" / role).mkdir(parents=True)
        (tmp_path / "ws" / role / "w.bin").write_bytes(b"1")
    assert baseline_paths(cfg, None, None) is None  # nothing trained: the evaluated models are the baseline
    for role in ("code", "test"):
        (tmp_path / "train" / "final" / role).mkdir(parents=True)
    paths = baseline_paths(cfg, None, None)
    assert paths == {"code": cfg.model.code_path, "test": cfg.model.test_path}
    key = baseline_cache_key(cfg, paths)
    assert key == baseline_cache_key(cfg.replace(**{"grpo.lr": 0.5}), paths)  # training knobs: same key
    assert key != baseline_cache_key(cfg.replace(**{"eval.n_samples": 3}), paths)
    (tmp_path / "ws" / "code" / "w.bin").write_bytes(b"2")
    assert key != baseline_cache_key(cfg, paths)
    assert baseline_paths(cfg.replace(**{"eval.baseline": False}), None, None) is None


# --------------------------------------------------------------------------------------------------
# End to end (slow): a shortened lab learns
# --------------------------------------------------------------------------------------------------

SHORT_LAB = {
    "seed": 1,
    "lab": {"families": ["is_above", "in_range", "tidy"], "train_per_family": 30, "heldout_per_family": 6},
    "data": {"train_batch_size": 8, "epochs": 3},
    "eval": {"n_samples": 8, "k_list": [1], "every": 0, "max_mutants": 5},
    "tracking": {"backend": "null"},
}


@pytest.mark.timeout(1800)  # the lab run may take 1200 s
@pytest.mark.e2e
@pytest.mark.slow
def test_short_lab_code_pass_rate_rises_over_warmstart(tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for section, values in SHORT_LAB.items():
        params[section] = params[section] | values if isinstance(values, dict) else values
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    env = os.environ | {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for stage in ("prepare", "warmstart", "train", "evaluate"):
        proc = subprocess.run(
            [sys.executable, "-m", f"flows.{stage}"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
        )
        assert proc.returncode == 0, f"{stage} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    m = json.loads((tmp_path / "outputs" / "eval" / "metrics.json").read_text())
    key = "code/lab_heldout_seen/base/pass@1"
    assert m[f"delta/{key}"] == pytest.approx(m[key] - m[f"warmstart/{key}"], abs=1e-3)
    # seed 1 only: whether the gain holds over other seeds is not established
    assert m[f"delta/{key}"] > 0.0, {k: v for k, v in m.items() if "pass@1" in k}


def test_mlflow_tracker_accepts_at_sign_metric_names(tmp_path, monkeypatch):
    """The train flow's validation logs ``code/val/avg@8``; MLflow rejects '@', so it is logged as ``_at_``."""
    from mlflow.tracking import MlflowClient

    from tracking.runs import make_tracker

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = Config.from_dict({"tracking": {"tracking_uri": uri, "artifact_location": str(tmp_path / "art")}})
    tracker = make_tracker(cfg, run_name="t")
    assert tracker.log_iteration(0, {"code/val/avg@8": 25.0, "code/val/pass@1": 25.0})
    tracker.end()
    metrics = MlflowClient(tracking_uri=uri).get_run(tracker.run_id).data.metrics
    assert metrics["code/val/avg_at_8"] == 25.0 and metrics["code/val/pass_at_1"] == 25.0
