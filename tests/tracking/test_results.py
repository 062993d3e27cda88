"""What the evaluate stage records: on and nested under the training run; links that open the runs view."""

from __future__ import annotations

from pathlib import Path

from codea1_core.config import Config
from tracking import results
from tracking.runs import MlflowTracker


def test_evaluation_is_recorded_on_and_nested_under_the_training_run(cfg: Config, tmp_path: Path) -> None:
    """Regression: evaluation lived in a separate run with no link to its training run."""
    train = MlflowTracker(cfg, run_name="train-codea1-seed1-alpha0.5")
    report = tmp_path / "report.html"
    report.write_text("<html></html>")
    eval_id = results.log_evaluation(cfg, {"code/lab/pass@1": 40.0, "n": "x"}, report, train.run_id)
    run = train.client.get_run(train.run_id)
    assert run.data.metrics["eval/code/lab/pass_at_1"] == 40.0
    assert run.data.tags["codea1.evaluate_run_id"] == eval_id
    nested = train.client.get_run(eval_id)
    assert nested.data.tags["mlflow.parentRunId"] == train.run_id
    assert nested.info.run_name == "evaluate-train-codea1-seed1-alpha0.5"
    assert nested.data.metrics["code/lab/pass_at_1"] == 40.0
    assert [a.path for a in train.client.list_artifacts(eval_id, "eval")] == ["eval/report.html"]


def test_a_re_evaluation_appends_no_second_point_to_the_training_run(cfg: Config, tmp_path: Path) -> None:
    """Evaluating the same export twice left eval/* at step 0 twice in the training run's history; a changed
    number is still recorded (its latest value is the new one)."""
    train = MlflowTracker(cfg, run_name="train-codea1-seed1-alpha0.5")
    report = tmp_path / "report.html"
    report.write_text("<html></html>")
    for _ in range(2):
        results.log_evaluation(cfg, {"code/lab/pass@1": 40.0, "test/lab/pass@5": 20.0}, report, train.run_id)
    results.log_evaluation(cfg, {"code/lab/pass@1": 40.0, "test/lab/pass@5": 25.0}, report, train.run_id)
    history = {
        key: [(m.step, m.value) for m in train.client.get_metric_history(train.run_id, key)]
        for key in ("eval/code/lab/pass_at_1", "eval/test/lab/pass_at_5")
    }
    assert history == {
        "eval/code/lab/pass_at_1": [(0, 40.0)],
        "eval/test/lab/pass_at_5": [(0, 20.0), (0, 25.0)],
    }
    assert train.client.get_run(train.run_id).data.metrics["eval/test/lab/pass_at_5"] == 25.0


def test_run_links_open_the_runs_view_not_the_genai_overview(cfg: Config) -> None:
    """MLflow 3.17's UI opens an experiment in its global GenAI view (an empty traces overview) whatever the
    experiment's kind tag says (seen in a headless browser); the links we print carry the query that opens runs."""
    from tracking.results import MLFLOW_UI, run_link

    tr = MlflowTracker(cfg)
    experiment_id = tr.client.get_run(tr.run_id).info.experiment_id
    assert run_link(cfg, tr.run_id) == (
        f"{MLFLOW_UI}/#/experiments/{experiment_id}/runs/{tr.run_id}?workflowType=machine_learning"
    )
    tr.end()


def test_the_training_run_is_found_through_the_config_done_json_names(cfg: Config, tmp_path: Path) -> None:
    """The run id lives beside the DVC outputs, keyed by config: DONE.json (an output) names only the config."""
    import json

    cfg = cfg.replace(**{"orchestration.checkpoint_dir": str(tmp_path / "train")})
    folder = Path(cfg.orchestration.checkpoint_dir)
    assert results.training_run_id(cfg) is None  # nothing trained
    results.record_run_id(folder, "fp-a", "run-a")
    results.record_run_id(folder, "fp-b", "run-b")
    results.record_run_id(folder, "fp-c", None)  # a null tracker: nothing to record
    assert (
        results.recorded_run_id(folder, "fp-a") == "run-a" and results.recorded_run_id(folder, "fp-c") is None
    )
    (folder / "final").mkdir(parents=True)
    (folder / "final" / "DONE.json").write_text(
        json.dumps({"iteration": 2, "versions": {}, "fingerprint": "fp-b"})
    )
    assert results.training_run_id(cfg) == "run-b"
    (folder / "final" / "DONE.json").write_text(json.dumps({"iteration": 2, "fingerprint": "fp-restored"}))
    assert results.training_run_id(cfg) is None  # outputs of a config this folder's store never trained
    (folder / results.RUNS_FILE).write_text("{not json")
    assert results.recorded_run_id(folder, "fp-a") is None
