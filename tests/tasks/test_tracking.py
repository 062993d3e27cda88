"""Tracking: the MLflow tracker never logs a step twice (resume), registers checkpoints, sets aliases."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from codea1_core.config import Config
from tasks import tracking
from tasks.tracking import STEP_KEY, MlflowTracker, NullTracker


@pytest.fixture()
def cfg(mlflow_cfg: Config) -> Config:
    return mlflow_cfg


def test_null_tracker_skips_logged_steps() -> None:
    tr = NullTracker()
    assert tr.log_iteration(1, {"code/reward_mean": 0.5})
    assert not tr.log_iteration(1, {"code/reward_mean": 0.9})
    assert tr.metrics[1]["code/reward_mean"] == 0.5
    assert tr.logged_steps() == {1}


def test_mlflow_resume_never_duplicates_a_step(cfg: Config) -> None:
    """Regression guard: MLflow appends duplicate points, so a resumed run must skip logged steps."""
    first = MlflowTracker(cfg, run_name="t")
    assert first.log_iteration(1, {"code/reward_mean": 0.25, "test/validity": 0.5, "bad": float("nan")})
    assert first.log_iteration(2, {"code/reward_mean": 0.5})
    again = MlflowTracker(cfg, run_id=first.run_id)
    assert again.run_id == first.run_id
    assert again.logged_steps() == {1, 2}
    assert not again.log_iteration(2, {"code/reward_mean": 0.75})
    assert again.log_iteration(3, {"code/reward_mean": 1.0})
    hist = again.client.get_metric_history(first.run_id, "code/reward_mean")
    assert sorted((m.step, m.value) for m in hist) == [(1, 0.25), (2, 0.5), (3, 1.0)]
    assert [m.step for m in again.client.get_metric_history(first.run_id, STEP_KEY)] == [1, 2, 3]
    run = again.client.get_run(first.run_id)
    assert run.data.params["reward.alpha"] == "0.5"
    assert "git.commit" in run.data.tags
    again.end()
    assert again.client.get_run(first.run_id).info.status == "FINISHED"


def test_resume_of_a_missing_run_starts_a_new_one_but_a_store_error_is_not_missing(
    cfg: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only "not found" starts a new run on resume; a transient store error must not fork the training run
    (a second MLflow run would register every model again)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    first = MlflowTracker(cfg, run_name="t")
    fresh = MlflowTracker(cfg, run_id="0" * 32)  # an id the store never had: a new run
    assert fresh.run_id not in {first.run_id, "0" * 32}

    def locked(self, run_id):
        raise MlflowException("(sqlite3.OperationalError) database is locked", error_code="INTERNAL_ERROR")

    monkeypatch.setattr(MlflowClient, "get_run", locked)
    with pytest.raises(MlflowException, match="database is locked"):
        MlflowTracker(cfg, run_id=first.run_id)
    monkeypatch.undo()
    runs = first.client.search_runs([first.client.get_run(first.run_id).info.experiment_id])
    assert sorted(r.info.run_id for r in runs) == sorted([first.run_id, fresh.run_id])


def test_log_iteration_task_logs_table_and_files(cfg: Config, tmp_path: Path) -> None:
    tr = MlflowTracker(cfg)
    book = tmp_path / "mistake_book.json"
    book.write_text('{"schema": "x"}')
    rows = [{"problem": "lab/a/0", "code": "def f(): pass", "code_reward": 0.5}]
    assert tracking.log_iteration.fn(tr, 1, {"code/reward_mean": 0.5}, rows, {"mistake_book": str(book)})
    assert not tracking.log_iteration.fn(tr, 1, {"code/reward_mean": 0.5}, rows, {"mistake_book": str(book)})
    names = {a.path for a in tr.client.list_artifacts(tr.run_id, "samples")}
    assert names == {"samples/it_000001.json"}
    assert [a.path for a in tr.client.list_artifacts(tr.run_id, "mistake_book")] == [
        "mistake_book/mistake_book.json"
    ]


def test_register_and_aliases(cfg: Config, tiny_model_dir: Path) -> None:
    model = tiny_model_dir
    tr = MlflowTracker(cfg)
    v1 = tr.register("code", model, 3)
    v2 = tr.register("code", model, 4)
    assert (v1, v2) == ("1", "2")
    assert tracking.latest_version(cfg, "codea1-code")["version"] == "2"
    assert tracking.alias_info(cfg, "codea1-code", "champion") is None
    tracking.set_alias(cfg, "codea1-code", "2", "champion", {"eval.metric": "0.4"})
    info = tracking.alias_info(cfg, "codea1-code", "champion")
    assert info["version"] == "2" and info["tags"]["eval.metric"] == "0.4"
    mv = tr.client.get_model_version("codea1-code", "2")
    logged = tr.client.get_logged_model(mv.source.removeprefix("models:/"))  # MLflow 3's Models tab
    assert logged.source_run_id == tr.run_id and logged.name == "codea1-code" and logged.status == "READY"
    assert mv.source == f"models:/{logged.model_id}" and mv.run_id == tr.run_id  # portable, not a local path
    assert os.environ.get("MLFLOW_TRACKING_URI") is None  # registering leaves the process's settings alone


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
    tracking.set_alias(cfg, "codea1-code", version, "champion")
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


def test_evaluation_is_recorded_on_and_nested_under_the_training_run(cfg: Config, tmp_path: Path) -> None:
    """Regression: evaluation lived in a separate run with no link to its training run."""
    train = MlflowTracker(cfg, run_name="train-codea1-seed1-alpha0.5")
    report = tmp_path / "report.html"
    report.write_text("<html></html>")
    eval_id = tracking.log_evaluation(cfg, {"code/lab/pass@1": 40.0, "n": "x"}, report, train.run_id)
    run = train.client.get_run(train.run_id)
    assert run.data.metrics["eval/code/lab/pass_at_1"] == 40.0
    assert run.data.tags["codea1.evaluate_run_id"] == eval_id
    nested = train.client.get_run(eval_id)
    assert nested.data.tags["mlflow.parentRunId"] == train.run_id
    assert nested.info.run_name == "evaluate-train-codea1-seed1-alpha0.5"
    assert nested.data.metrics["code/lab/pass_at_1"] == 40.0
    assert [a.path for a in train.client.list_artifacts(eval_id, "eval")] == ["eval/report.html"]


def test_run_links_open_the_runs_view_not_the_genai_overview(cfg: Config) -> None:
    """MLflow 3.17's UI opens an experiment in its global GenAI view (an empty traces overview) whatever the
    experiment's kind tag says (seen in a headless browser); the links we print carry the query that opens runs."""
    from tasks.tracking import MLFLOW_UI, run_link

    tr = MlflowTracker(cfg)
    experiment_id = tr.client.get_run(tr.run_id).info.experiment_id
    assert run_link(cfg, tr.run_id) == (
        f"{MLFLOW_UI}/#/experiments/{experiment_id}/runs/{tr.run_id}?workflowType=machine_learning"
    )
    tr.end()
