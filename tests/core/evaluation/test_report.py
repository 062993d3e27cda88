"""HTML report, run comparison and the evaluate flow end to end (fake executor and policies, null tracker)."""

from __future__ import annotations

import base64
import json
import re

import pytest
from support import FakeExecutor, TextPolicy, fenced, problem

from codea1_core.config import Config
from codea1_core.evaluation.report import comparison_table, pass_rate_rows, render_report, training_chart

METRICS = {
    "code/humanevalplus/base/pass@1": 80.0,
    "code/humanevalplus/plus/pass@1": 70.0,
    "code/mbppplus/base/pass@1": 60.0,
    "test/lab_heldout/mul": 7.1,
}


def _pngs(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([^"]+)"', html)]


def test_report_is_self_contained_with_png_plots():
    history = [
        {
            "iteration": i,
            "code/reward_mean": 0.1 * i,
            "test/reward_mean": 0.05 * i,
            "mistake_book/added": 10 - i,
        }
        for i in range(5)
    ]
    html = render_report(METRICS, history=history)
    pngs = _pngs(html)
    assert len(pngs) == 2 and all(p.startswith(b"\x89PNG") for p in pngs)
    assert "http" not in html.replace("http-equiv", "")  # no external resources
    assert "test/lab_heldout/mul" in html and "7.10" in html


def test_report_without_history_says_so():
    html = render_report(METRICS, history=[])
    assert "No training metrics history found" in html and len(_pngs(html)) == 1
    assert training_chart([{"iteration": 1, "other": 3}]) is None


def test_pass_rate_rows_and_comparison_table_marks_best():
    assert pass_rate_rows(METRICS) == [
        ("humanevalplus", "base", 80.0),
        ("humanevalplus", "plus", 70.0),
        ("mbppplus", "base", 60.0),
    ]
    table = comparison_table({"a": {"x/pass@1": 50.0}, "b": {"x/pass@1": 60.0, "y": 1.0}})
    assert "<b>60.00</b>" in table and "<b>50.00</b>" not in table and "–" in table


def test_compare_writes_report_and_rejects_bad_files(tmp_path):
    from flows.common import UserError
    from flows.evaluate import compare, main

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"code/x/pass@1": 10.0}))
    b.write_text(json.dumps({"code/x/pass@1": 20.0}))
    out = compare([str(a), str(b)], tmp_path / "cmp.html")
    assert "<b>20.00</b>" in out.read_text()
    with pytest.raises(UserError, match="missing.json: metrics file not found"):
        compare([str(a), str(tmp_path / "missing.json")], tmp_path / "x.html")
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert main(["--compare", str(a), str(tmp_path / "bad.json"), "--out", str(tmp_path / "y.html")]) == 2
    assert not (tmp_path / "y.html").exists()


@pytest.mark.e2e
def test_evaluate_flow_writes_metrics_and_report(tmp_path, prefect_harness, monkeypatch):
    from prefect import flow

    from codea1_core.data.prepared import save_prepared
    from flows.evaluate import evaluate
    from workspace.resume import write_history

    ps = [problem("a"), problem("b")]
    prepared = tmp_path / "prepared"
    save_prepared(ps, prepared / "eval_toy.parquet")
    train_dir = tmp_path / "train"
    write_history(train_dir, [{"iteration": i, "code/reward_mean": 0.2 * i} for i in range(3)])
    cfg = Config.from_dict(
        {
            "data": {"eval_benchmarks": ["toy"], "prepared_dir": str(prepared)},
            "eval": {
                "n_samples": 2,
                "k_list": [1],
                "test_sources": ["toy"],
                "solve_benchmarks": ["toy"],
                "solve_candidates": 2,
                "out_dir": str(tmp_path / "eval"),
            },
            "orchestration": {"checkpoint_dir": str(train_dir)},
            "tracking": {
                "tracking_uri": f"sqlite:///{tmp_path}/mlflow.db",
                "artifact_location": str(tmp_path / "art"),
            },
        }
    )
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    oracle = TextPolicy(lambda text: fenced(ps[0].reference_solution))
    golden = TextPolicy(lambda text: fenced("assert add(1, 2) == 3\nassert add(-1, 1) == 0"))
    in_flow = flow(name="evaluate-injected", validate_parameters=False)(evaluate)  # the artifact needs a run
    metrics = in_flow(cfg, code_policy=oracle, test_policy=golden, executor=FakeExecutor())
    assert metrics["code/toy/plus/pass@1"] == 100.0 and metrics["test/toy/pass@5"] == 100.0
    assert metrics["solve/toy/pass@1"] == 100.0
    on_disk = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert on_disk == metrics
    html = (tmp_path / "eval" / "report.html").read_text()
    assert len(_pngs(html)) == 2  # pass rates + training curves
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("codea1").experiment_id])
    assert run.data.metrics["code/toy/plus/pass_at_1"] == 100.0  # MLflow names cannot hold '@'
    assert run.data.metrics["test/toy/mul"] == metrics["test/toy/mul"]
    assert [a.path for a in client.list_artifacts(run.info.run_id, "eval")] == ["eval/report.html"]
    headline = json.loads((tmp_path / "eval" / "headline.json").read_text())  # DVC's readable metrics file
    assert headline["test"] == {"trained": 100.0} and "code" not in headline  # no such metric here
    from prefect.artifacts import Artifact

    art = Artifact.get("codea1-learning")  # a markdown artifact per run with the learning table
    assert art is not None and art.type == "markdown" and "| `test/toy/pass@5` | 100 |" in art.data


def test_resolve_model_path_precedence(tmp_path):
    from flows.evaluate import resolve_model_path

    cfg = Config.from_dict(
        {"orchestration": {"checkpoint_dir": str(tmp_path)}, "model": {"code_path": "base"}}
    )
    assert resolve_model_path(cfg, "code") == "base"
    (tmp_path / "final" / "code").mkdir(parents=True)
    assert resolve_model_path(cfg, "code") == str(tmp_path / "final" / "code")
    assert resolve_model_path(cfg.replace(**{"eval.code_model": "pinned"}), "code") == "pinned"
    assert resolve_model_path(cfg, "code", "arg") == "arg"
