"""A register rerun with the same decision logs nothing twice.

Before: every rerun of the register stage appended its numbers to the training run's metric history again
(``register/new`` had as many points as reruns)."""

from __future__ import annotations


def test_logging_the_same_decision_twice_keeps_one_point_per_metric(mlflow_cfg) -> None:
    from mlflow.tracking import MlflowClient

    from tracking.results import log_to_run
    from tracking.store import client as store_client
    from tracking.store import experiment_id

    client = store_client(mlflow_cfg)
    run_id = client.create_run(experiment_id(client, mlflow_cfg), run_name="train").info.run_id
    numbers = {"register/new": 0.5, "register/promoted": 1.0}
    log_to_run(mlflow_cfg, run_id, numbers, {"decision": "champion"}, "register")
    log_to_run(mlflow_cfg, run_id, numbers, {"decision": "champion"}, "register")
    history = MlflowClient(tracking_uri=mlflow_cfg.tracking.tracking_uri).get_metric_history(
        run_id, "register/new"
    )
    assert [m.value for m in history] == [0.5]
    log_to_run(
        mlflow_cfg, run_id, {"register/new": 0.75}, {"decision": "challenger"}, "register"
    )  # a new number
    history = client.get_metric_history(run_id, "register/new")
    assert sorted(m.value for m in history) == [0.5, 0.75]
