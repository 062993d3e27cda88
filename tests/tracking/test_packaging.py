"""A registered model loads with MLflow's transformers loader and with plain ``from_pretrained``."""

from __future__ import annotations

import os
from pathlib import Path

from codea1_core.config import Config
from tracking import registry
from tracking.runs import MlflowTracker


def test_champion_loads_as_transformers_model_and_with_from_pretrained(
    cfg: Config, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Regression: registered versions had no MLmodel file, so no MLflow loader could read them.

    ``mlflow.set_tracking_uri`` / ``set_registry_uri`` also export ``MLFLOW_TRACKING_URI`` /
    ``MLFLOW_REGISTRY_URI``, which the tracker prefers over the config: both are put back as they were, else
    every later test's runs went to the working folder's ``mlflow.db`` (seen: a later flow test's run was not
    in its own store).
    """
    saved = {var: os.environ.get(var) for var in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    import mlflow
    import mlflow.transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tr = MlflowTracker(cfg)
    version = tr.register("code", tiny_model_dir, 7)
    registry.set_alias(cfg, "codea1-code", version, "champion")
    before = (mlflow.get_tracking_uri(), mlflow.get_registry_uri())
    mlflow.set_tracking_uri(cfg.tracking.tracking_uri)
    mlflow.set_registry_uri(cfg.tracking.tracking_uri)
    try:
        pipe = mlflow.transformers.load_model("models:/codea1-code@champion")
        assert pipe.task == "text-generation" and pipe.model.config.model_type == "qwen2"
        out = pipe("def f(x):", max_new_tokens=4, do_sample=False)
        assert isinstance(out[0]["generated_text"], str)
        local = Path(
            mlflow.artifacts.download_artifacts("models:/codea1-code@champion", dst_path=str(tmp_path))
        )
    finally:
        mlflow.set_tracking_uri(before[0])
        mlflow.set_registry_uri(before[1])
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
    model = AutoModelForCausalLM.from_pretrained(local / "model")
    tokenizer = AutoTokenizer.from_pretrained(local / "model")
    ids = tokenizer("def f(x):", return_tensors="pt")["input_ids"]
    assert (local / "MLmodel").is_file() and model(ids).logits.shape[:2] == ids.shape
