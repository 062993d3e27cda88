"""Every run that starts also ends, as what happened.

Before: a failure in train's setup (the Test LLM's model does not load, after the MLflow run was reopened) left the
MLflow run RUNNING for good, and a SIGTERM-stopped train was recorded by Prefect as COMPLETED (its flow
returned normally). Now the MLflow run ends FAILED, and the stopped flow run ends CANCELLED (the SIGTERM case
is asserted in tests/flows/test_fail_fast.py, where the stopped run already is).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import log_lines, tiny_config


def test_a_failure_in_setup_ends_the_mlflow_run_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path
) -> None:
    from mlflow.tracking import MlflowClient

    from flows.train import train
    from tracking.results import recorded_run_id
    from workspace import resume
    from workspace.lock import LOCK_NAME

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = tiny_config(tmp_path, tiny_model_dir, **{"model.test_path": str(tmp_path / "no-such-model")})
    uri = cfg.tracking.tracking_uri
    with pytest.raises(OSError, match="model.test_path"):  # after the MLflow run was reopened
        train(cfg)
    run_id = recorded_run_id(tmp_path / "train", resume.stored_fingerprint(tmp_path / "train"))
    assert run_id is not None
    assert MlflowClient(tracking_uri=uri).get_run(run_id).info.status == "FAILED"
    assert not (tmp_path / "train" / LOCK_NAME).exists()


def test_a_served_run_stopped_by_sigterm_ends_in_one_line_not_an_engine_traceback() -> None:
    """``codea1 serve`` stopped with SIGTERM during a training run: the run stops after its current task and
    returns a Cancelled state, which Prefect's engine process re-raises as ``CancelledRun`` and logged as
    "Engine execution exited with unexpected exception" with a 40-line traceback. Now: one line (the real
    ``CancelledRun`` of a real Cancelled state, logged as the engine logs it)."""
    import logging

    from prefect.states import Cancelled

    from flows.console import quiet_user_error_tracebacks

    quiet_user_error_tracebacks()
    with log_lines("prefect.flow_runs") as lines:
        try:
            Cancelled(message="stopped by SIGTERM after iteration 1 (checkpointed)").result()
        except BaseException:
            logging.getLogger("prefect.flow_runs").error(
                "Engine execution exited with unexpected exception", exc_info=True
            )
    assert lines == [
        "WARNING: the flow run ended CANCELLED: stopped by SIGTERM after iteration 1 (checkpointed)"
    ], lines


def _warm_started(tmp_path: Path, tiny_model_dir: Path) -> dict[str, Path]:
    """Copies of the tiny model as the warm start builds its folders: each with its ``MANIFEST.json``."""
    import shutil

    from workspace.checkpoints import write_manifest

    roles = {}
    for role in ("code", "test"):
        roles[role] = tmp_path / "warmstart" / role
        shutil.copytree(tiny_model_dir, roles[role])
        write_manifest(roles[role])
    return roles


@pytest.mark.e2e
def test_flipped_bytes_in_the_warm_start_stop_training_in_one_line(
    tmp_path: Path, tiny_model_dir: Path, repo_root: Path
) -> None:
    """The warm start is training's starting point and KL reference: bytes flipped in its weights trained on
    from corrupt weights with a different KL, silently. Now the stage stops before any work, in one line naming
    the file and the rebuild."""
    import subprocess
    import sys

    from support import write_params

    from flows.run_endings import check_starting_models

    roles = _warm_started(tmp_path, tiny_model_dir)
    cfg = tiny_config(
        tmp_path,
        tiny_model_dir,
        **{
            "model.code_path": str(roles["code"]),
            "model.test_path": str(roles["test"]),
            "tracking.backend": "null",
        },
    )
    check_starting_models(cfg)  # intact: no complaint
    weights = roles["test"] / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    proc = subprocess.run(
        [sys.executable, "-m", "flows.train", "--params", write_params(cfg, tmp_path / "params.yaml")],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower() or "Traceback" in line]
    assert len(errors) == 1, proc.stderr  # (the other stderr line: the lab problems generated in memory)
    assert errors[0].startswith(f"error: model.test_path: {weights}: sha256 differs"), errors
    assert "dvc repro warmstart" in errors[0]
    assert not (tmp_path / "train" / "checkpoints").exists()
