"""Shared test set-up: quiet, local, offline services; one Prefect ephemeral API per session.

Environment variables are set before any test module imports prefect/mlflow/GX.
"""

from __future__ import annotations

import os
from pathlib import Path

# Test-only settings; the product's own defaults come from flows.environment (imported next), as in every
# entry point, so the tests run with exactly what users get.
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("CODEA1_PREFECT_REUSE", "0")  # a developer's running `codea1 ui` gets no test runs

import pytest  # noqa: E402

import flows  # noqa: E402,F401  (applies flows.environment before any test module imports prefect/mlflow/GX)

REPO_ROOT = Path(__file__).resolve().parent.parent


def _shared_data_dir() -> Path | None:
    env = os.environ.get("CODEA1_DATA_DIR")
    if env:
        return Path(env)
    default = REPO_ROOT.parent / "shared" / "data"
    return default if default.is_dir() else None


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The offline EvalPlus/MBPP folder; tests needing it skip with a reason when it is absent (CI has it)."""
    path = _shared_data_dir()
    if path is None or not path.is_dir():
        pytest.skip("offline data folder not found: set CODEA1_DATA_DIR or place shared/data beside the repo")
    return path


@pytest.fixture(scope="session")
def prefect_harness():
    """One Prefect ephemeral API for the whole session (it takes seconds to start)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture()
def mlflow_cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A default Config whose MLflow store is a fresh sqlite file under ``tmp_path`` (env URI ignored)."""
    from codea1_core.config import Config

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return Config().replace(
        **{
            "tracking.tracking_uri": f"sqlite:///{tmp_path}/mlflow.db",
            "tracking.artifact_location": str(tmp_path / "artifacts"),
        }
    )


@pytest.fixture()
def fake_vllm(monkeypatch: pytest.MonkeyPatch):
    """A fake ``vllm`` module for one test (vLLM is GPU-only): ``support.install_fake_vllm``."""
    from support import install_fake_vllm

    return install_fake_vllm(monkeypatch)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-init tiny Qwen2 model + lab tokenizer, built once per session (registry and loading tests)."""
    from support import build_tiny

    return build_tiny(tmp_path_factory.mktemp("tiny") / "model")


SLOW_TIMEOUT_S = 3600
"""Per-test timeout of the opt-in ``slow`` and ``gpu`` tests that name none themselves (the default, in
``addopts``, is for the default run)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that starts the Prefect test API (``prefect_harness``, a server process) carries ``e2e``;
    an opt-in ``slow`` / ``gpu`` test without its own ``timeout`` mark gets :data:`SLOW_TIMEOUT_S`.

    The marker is for selection (``-m e2e`` / ``-m "not e2e"``); ``make test`` runs both. This check keeps it
    honest for the one server every flow test shares; the other e2e tests (DVC, ``make``, stages or the CLI in
    a subprocess, the UIs, Ray) carry it by hand.
    """
    unmarked = [
        item.nodeid
        for item in items
        if "prefect_harness" in getattr(item, "fixturenames", ()) and item.get_closest_marker("e2e") is None
    ]
    if unmarked:
        raise pytest.UsageError(f"tests that start the Prefect test server must be marked e2e: {unmarked}")
    for item in items:
        opt_in = item.get_closest_marker("slow") or item.get_closest_marker("gpu")
        if opt_in and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
