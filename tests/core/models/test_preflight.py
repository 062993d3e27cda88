"""Config checks against this machine and the model files: one line naming the key, before any model loads.

Regressions: ``model.device=cuda`` without CUDA failed in 161 lines after the warm start;
``rollout.max_new_tokens_*=200000`` against the lab's 1,024-token context was accepted and drove the host out
of memory; a real-model config without weights on disk gave 90 s of Hugging Face retries, then 277 lines.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from codea1_core.config import ConfigError, load_config
from codea1_core.models import preflight


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_a_cuda_device_this_torch_cannot_see_is_one_line(no_cuda, device: str) -> None:
    with pytest.raises(ConfigError, match=rf"model.device={device}: .*use model.device=auto or cpu"):
        preflight.check_device(device)


def test_a_cuda_index_past_the_devices_names_them(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    preflight.check_device("cuda:1")
    with pytest.raises(ConfigError, match=r"model.device=cuda:2: only 2 CUDA device\(s\) \(cuda:0..cuda:1\)"):
        preflight.check_device("cuda:2")


@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_auto_and_cpu_pass_without_importing_anything(device: str) -> None:
    preflight.check_device(device)


@pytest.mark.parametrize(
    "override",
    ["rollout.max_new_tokens_code=200000", "rollout.max_new_tokens_test=1025", "eval.max_new_tokens=5000"],
)
def test_a_generation_budget_past_the_lab_context_is_refused(override: str) -> None:
    cfg = load_config("params.yaml", [override])
    key = override.split("=")[0]
    with pytest.raises(
        ConfigError, match=rf"{key}=\d+: above model.\w+_path's context of 1024 tokens \(lab.max_position_"
    ):
        preflight.check_models(cfg, ("code", "test"), hub=False)


def test_the_shipped_params_pass() -> None:
    preflight.check_models(load_config("params.yaml"), ("code", "test"), hub=False)


def test_a_local_model_folder_gives_its_own_context(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    cfg = load_config("params.yaml", [f"model.code_path={model}", "rollout.max_new_tokens_code=600"])
    with pytest.raises(
        ConfigError, match=r"rollout.max_new_tokens_code=600: above .* 512 tokens \(.*config.json\)"
    ):
        preflight.check_models(cfg, ("code",), hub=False)
    preflight.check_models(cfg.replace(**{"rollout.max_new_tokens_code": 96}), ("code",), hub=False)


def test_a_hub_id_offline_and_not_cached_is_one_line_naming_the_key_fast(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = load_config("configs/qwen2.5-coder-1.5b.yaml", ["model.test_path=no-such-org/no-such-model"])
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        preflight.check_model_source(cfg.model.test_path, "model.test_path")
    assert time.perf_counter() - t0 < 2
    text = str(err.value)
    assert (
        text.startswith("model.test_path=no-such-org/no-such-model: not a local folder") and "\n" not in text
    )
    assert "HF_HUB_OFFLINE is set" in text and "huggingface-cli download no-such-org/no-such-model" in text


def test_a_hub_id_whose_host_cannot_be_reached_is_refused(monkeypatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(preflight, "_unreachable", lambda host, port: f"{host} cannot be reached (refused)")
    with pytest.raises(ConfigError, match="model.code_path=org/model: .* cannot be reached"):
        preflight.check_model_source("org/model", "model.code_path")


def test_local_folders_cached_models_and_the_warm_start_are_not_probed(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    preflight.check_model_source("outputs/warmstart/code", "model.code_path")
    preflight.check_model_source(str(tmp_path), "model.code_path")
    monkeypatch.setattr(preflight, "_cached_config", lambda path: "/cache/config.json")
    preflight.check_model_source("org/model", "model.code_path")
