"""Stage runs under sandbox limits that fail the references: one line naming the limit, exit 2, nothing trained.

Bug guarded: ``codea1 train sandbox.call_timeout_s=1.0e-6`` (or a ``sandbox.memory_mb`` the references do not
fit) masked every problem and trained on zero rewards to exit 0; evaluate scored every model 0. The unit tests
of the check are in ``tests/tasks/test_execute.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import build_tiny, problem, tiny_config, write_params

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model")


def _stage(stage: str, params: str, repo_root: Path, *overrides: str) -> tuple[int, str]:
    from prefect.settings import PREFECT_API_URL

    env = dict(os.environ, OMP_NUM_THREADS="1", PREFECT_API_URL=str(PREFECT_API_URL.value()))
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run(
        [sys.executable, "-m", f"flows.{stage}", "--params", params, *overrides],
        cwd=repo_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stdout + proc.stderr


def _one_error_line(log: str) -> str:
    errors = [line for line in log.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in log, log[-3000:]
    return errors[0]


def test_train_with_a_call_timeout_no_reference_meets_stops_before_any_step(
    prefect_harness, tiny_model, tmp_path, repo_root
) -> None:
    params = write_params(tiny_config(tmp_path, tiny_model), tmp_path / "params.yaml")
    rc, log = _stage("train", params, repo_root, "sandbox.call_timeout_s=1.0e-6")
    line = _one_error_line(log)
    assert rc == 2
    assert line.startswith("error: train: ") and "sampled references fail their own golden tests" in line
    assert line.endswith("raise sandbox.call_timeout_s (now 1e-06)")
    assert not (tmp_path / "train" / "checkpoints").exists()


def test_train_with_a_memory_limit_the_references_do_not_fit_stops_before_any_step(
    prefect_harness, tiny_model, tmp_path, repo_root
) -> None:
    """References that need ~50 MB (the lab's fit in a few MB here): 16 MB fails them with MemoryError."""
    from codea1_core.data.prepared import prepared_record, save_prepared

    cfg = tiny_config(tmp_path, tiny_model, **{"data.prepared_dir": str(tmp_path / "prepared")})
    grow = "def grow(n):\n    return len(bytearray(n))\n"
    big = [
        problem(
            f"big/{i}", entry="grow", tests=((f"grow({50_000_000 + i})", 50_000_000 + i),), reference=grow
        )
        for i in range(4)
    ]
    save_prepared(big, tmp_path / "prepared" / "train.parquet", prepared_record(cfg, "train"))
    params = write_params(cfg, tmp_path / "params.yaml")
    rc, log = _stage("train", params, repo_root, "sandbox.memory_mb=16")
    line = _one_error_line(log)
    assert rc == 2 and "4/4 sampled references fail" in line and "MemoryError" in line
    assert line.endswith("raise sandbox.memory_mb (now 16)")
    assert not (tmp_path / "train" / "checkpoints").exists()


def test_evaluate_with_a_call_timeout_no_reference_meets_stops_before_any_model_loads(
    prefect_harness, tiny_model, tmp_path, repo_root
) -> None:
    from codea1_core.data.lab import lab_problems
    from codea1_core.data.prepared import prepared_record, save_prepared

    cfg = tiny_config(
        tmp_path,
        tiny_model,
        **{"data.prepared_dir": str(tmp_path / "prepared"), "eval.out_dir": str(tmp_path / "eval")},
    )
    path = tmp_path / "prepared" / "eval_lab_heldout.parquet"
    save_prepared(lab_problems(cfg.lab, "test"), path, prepared_record(cfg, "eval_lab_heldout"))
    params = write_params(cfg, tmp_path / "params.yaml")
    rc, log = _stage("evaluate", params, repo_root, "sandbox.call_timeout_s=1.0e-6")
    line = _one_error_line(log)
    assert rc == 2 and line.startswith("error: evaluate: 8/8 sampled references fail their own golden tests")
    assert line.endswith("raise sandbox.call_timeout_s (now 1e-06)")
    assert not (tmp_path / "eval" / "metrics.json").exists()
