"""The registry: one version per registration, linked to its logged model and run; aliases with tags."""

from __future__ import annotations

import os
from pathlib import Path

from codea1_core.config import Config
from tracking import registry
from tracking.runs import MlflowTracker


def test_register_and_aliases(cfg: Config, tiny_model_dir: Path) -> None:
    model = tiny_model_dir
    tr = MlflowTracker(cfg)
    v1 = tr.register("code", model, 3)
    v2 = tr.register("code", model, 4)
    assert (v1, v2) == ("1", "2")
    assert registry.latest_version(cfg, "codea1-code")["version"] == "2"
    assert registry.alias_info(cfg, "codea1-code", "champion") is None
    registry.set_alias(cfg, "codea1-code", "2", "champion", {"eval.metric": "0.4"})
    info = registry.alias_info(cfg, "codea1-code", "champion")
    assert info["version"] == "2" and info["tags"]["eval.metric"] == "0.4"
    mv = tr.client.get_model_version("codea1-code", "2")
    logged = tr.client.get_logged_model(mv.source.removeprefix("models:/"))  # MLflow 3's Models tab
    assert logged.source_run_id == tr.run_id and logged.name == "codea1-code" and logged.status == "READY"
    assert mv.source == f"models:/{logged.model_id}" and mv.run_id == tr.run_id  # portable, not a local path
    outputs = tr.client.get_run(tr.run_id).outputs.model_outputs  # the run page's "Logged models"
    assert len(outputs) == 2 and (logged.model_id, 4) in {(o.model_id, o.step) for o in outputs}
    assert os.environ.get("MLFLOW_TRACKING_URI") is None  # registering leaves the process's settings alone
