"""Kill-and-resume: SIGKILL the training process mid-run, re-run it, compare with an uninterrupted run.

Invariants (docs/method.md §3 step 16 + our resume rule): no completed iteration is lost, no MLflow step is
logged twice, the MLflow run id is reused, and the history, the Mistake Book and the final weights equal
those of an uninterrupted run with the same seed. The killed run is a real subprocess
(``python -m flows.train``) talking to the test session's Prefect API.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from support import build_tiny, tiny_config, write_params

from codea1_core.config import Config
from tracking.results import recorded_run_id
from workspace.resume import stored_fingerprint

VOLATILE = ("time/", "sandbox/calls_per_s", "grpo/code/seconds", "grpo/test/seconds")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model")


def _stable(history: list[dict]) -> list[dict]:
    """The history without timings; NaN (nothing replayed) as a string, as NaN is unequal to itself."""
    return [
        {k: "nan" if v != v else v for k, v in row.items() if not k.startswith(VOLATILE)} for row in history
    ]


def _history(out: Path) -> list[dict]:
    from codea1_core.evaluation.comparison import parse_history

    return parse_history((out / "history.csv").read_text())


def _spawn(params: Path, repo_root: Path) -> subprocess.Popen:
    from prefect.settings import PREFECT_API_URL

    env = dict(os.environ, OMP_NUM_THREADS="1", PREFECT_API_URL=str(PREFECT_API_URL.value()))
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.Popen(
        [sys.executable, "-m", "flows.train", "--params", str(params)],
        cwd=repo_root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _kill_when(proc: subprocess.Popen, ready, timeout_s: float = 300) -> bool:
    """SIGKILL ``proc`` as soon as ``ready()`` holds; False if it finished first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if ready():
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            return True
        time.sleep(0.02)
    proc.kill()
    raise AssertionError("training never reached the kill point")


def _reference(cfg: Config) -> list[dict]:
    import torch

    from flows.train import train_flow

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the subprocess runs with OMP_NUM_THREADS=1
    params = write_params(cfg, Path(cfg.orchestration.checkpoint_dir).parent / "reference_params.yaml")
    try:
        train_flow(params)
    finally:
        torch.set_num_threads(threads)
    return _history(Path(cfg.orchestration.checkpoint_dir))


def _weights(out: Path, role: str) -> dict:
    from safetensors.torch import load_file

    files = sorted((out / "final" / role).glob("*.safetensors"))
    return {k: v for f in files for k, v in load_file(f).items()}


def _check_resumed(cfg: Config, reference_out: Path, ref_history: list[dict], roles: list[str]) -> None:
    import torch
    from mlflow.tracking import MlflowClient

    out = Path(cfg.orchestration.checkpoint_dir)
    history = _history(out)
    assert [r["iteration"] for r in history] == [1, 2, 3]
    assert _stable(history) == _stable(ref_history)
    if (reference_out / "mistake_book.json").exists():
        assert json.loads((out / "mistake_book.json").read_text()) == json.loads(
            (reference_out / "mistake_book.json").read_text()
        )
    run_id = recorded_run_id(out, stored_fingerprint(out))
    client = MlflowClient(tracking_uri=cfg.tracking.tracking_uri)
    for key in ("code/reward_mean", "progress/iteration", "grpo/code/loss"):
        assert sorted(m.step for m in client.get_metric_history(run_id, key)) == [1, 2, 3], key
    runs = client.search_runs([client.get_experiment_by_name(cfg.tracking.experiment).experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]  # the resumed process reused the run
    for role in roles:
        got, want = _weights(out, role), _weights(reference_out, role)
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want), role


def _kill_resume(tmp_path: Path, repo_root: Path, cfg: Config, ready_factory) -> bool:
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(cfg.to_dict()))
    out = Path(cfg.orchestration.checkpoint_dir)
    proc = _spawn(params, repo_root)
    killed = _kill_when(proc, ready_factory(out))
    again = _spawn(params, repo_root)
    log, _ = again.communicate(timeout=600)
    assert again.returncode == 0, log[-3000:]
    return killed


def _latest_is(n: int):
    def factory(out: Path):
        pointer = out / "checkpoints" / "LATEST"
        return lambda: pointer.is_file() and pointer.read_text().strip() == f"it_{n:06d}"

    return factory


@pytest.mark.timeout(1500)  # reference, killed and resumed training runs
@pytest.mark.e2e
def test_sigkill_after_first_checkpoint_resumes_exactly(
    prefect_harness, tiny_model, tmp_path, repo_root
) -> None:
    """Killed right after iteration 1's checkpoint (typically before its MLflow log): nothing lost or doubled."""
    ref_cfg = tiny_config(tmp_path / "ref", tiny_model, **{"orchestration.max_steps": 3})
    ref_history = _reference(ref_cfg)
    cfg = tiny_config(tmp_path / "kill", tiny_model, **{"orchestration.max_steps": 3})
    assert _kill_resume(tmp_path, repo_root, cfg, _latest_is(1))
    _check_resumed(cfg, Path(ref_cfg.orchestration.checkpoint_dir), ref_history, ["code", "test"])


def _outcomes_of(n: int):
    def factory(out: Path):
        path = out / "outcomes" / f"it_{n:06d}.parquet"
        return path.is_file

    return factory


def _checkpoint_tmp_of(n: int):
    def factory(out: Path):
        tmp = out / "checkpoints" / f".it_{n:06d}.tmp"
        return tmp.is_dir

    return factory


@pytest.mark.timeout(1500)  # reference, killed and resumed training runs
@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["codea1", "golden", "selfplay"])
@pytest.mark.parametrize("point", ["latest1", "outcomes2", "checkpoint_tmp2", "latest3"])
def test_kill_matrix(prefect_harness, tiny_model, tmp_path, repo_root, mode, point) -> None:
    """Every mode, killed at several points of an iteration (mid-task, mid-checkpoint, after the last one)."""
    factories = {
        "latest1": _latest_is(1),
        "outcomes2": _outcomes_of(2),
        "checkpoint_tmp2": _checkpoint_tmp_of(2),
        "latest3": _latest_is(3),
    }
    extra = {"orchestration.max_steps": 3, "mode": mode}
    ref_cfg = tiny_config(tmp_path / "ref", tiny_model, **extra)
    ref_history = _reference(ref_cfg)
    cfg = tiny_config(tmp_path / "kill", tiny_model, **extra)
    _kill_resume(tmp_path, repo_root, cfg, factories[point])
    roles = ["code"] if mode != "codea1" else ["code", "test"]
    _check_resumed(cfg, Path(ref_cfg.orchestration.checkpoint_dir), ref_history, roles)
