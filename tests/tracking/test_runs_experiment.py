"""A training run started by ``dvc exp run`` names its DVC experiment: tags and a name of its own.

Regression: the MLflow runs carried no DVC experiment, so two experiments of the same params were both
``train-codea1-seed1-alpha0.25`` and could not be told apart or traced back to ``dvc exp show``.
"""

from __future__ import annotations

from tracking.runs import MlflowTracker


def test_a_run_under_dvc_exp_run_is_tagged_and_named_after_the_experiment(mlflow_cfg, monkeypatch) -> None:
    monkeypatch.setenv("DVC_EXP_NAME", "alpha-sweep")
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", "0123abc")
    first = MlflowTracker(mlflow_cfg, run_name="train-codea1-seed1-alpha0.25")
    monkeypatch.setenv("DVC_EXP_NAME", "alpha-sweep-2")
    second = MlflowTracker(mlflow_cfg, run_name="train-codea1-seed1-alpha0.25")
    runs = [first.client.get_run(t.run_id) for t in (first, second)]
    assert [r.info.run_name for r in runs] == [
        "train-codea1-seed1-alpha0.25-alpha-sweep",
        "train-codea1-seed1-alpha0.25-alpha-sweep-2",
    ]
    assert runs[0].data.tags["dvc.exp.name"] == "alpha-sweep"
    assert runs[0].data.tags["dvc.exp.baseline_rev"] == "0123abc"
    assert runs[1].data.tags["dvc.exp.name"] == "alpha-sweep-2"
    for tracker in (first, second):
        tracker.end()


def test_a_run_outside_an_experiment_keeps_its_name_and_has_no_experiment_tags(
    mlflow_cfg, monkeypatch
) -> None:
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    monkeypatch.delenv("DVC_EXP_BASELINE_REV", raising=False)
    tracker = MlflowTracker(mlflow_cfg, run_name="train-codea1-seed1-alpha0.5")
    run = tracker.client.get_run(tracker.run_id)
    assert run.info.run_name == "train-codea1-seed1-alpha0.5"
    assert not [k for k in run.data.tags if k.startswith("dvc.exp.")]
    tracker.end()
