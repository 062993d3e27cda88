"""What ``flows.evaluate`` writes into its DVC outputs: the same bytes for every run of the same inputs.

Bug guarded: ``report.html`` carried the Prefect flow run id, the MLflow run ids and the git commit, so every fresh
run (and every run at the commit that recorded the previous run's ``dvc.lock``) changed the evaluate stage's hash in
``dvc.lock`` though every number was the same.
"""

from __future__ import annotations

import json
from pathlib import Path

from codea1_core.evaluation.report import render_report
from flows.evaluate import RUN_IDS_FILE, workspace_page


def _page(context: dict[str, str]) -> str:
    return render_report({"code/lab/pass@1": 40.0}, history=[], notes=["code model: m"], context=context)


def test_the_workspace_report_keeps_no_run_id_and_the_ids_go_beside_it(tmp_path: Path) -> None:
    ids = {
        "Prefect flow run": "evaluate-codea1-seed1 (aa060bdd-91c0-4d5c-b093-a3d7452a7737)",
        "MLflow training run": "367eb95a132345099ce2e41b349fb74a",
        "MLflow run (after `codea1 ui`)": "http://127.0.0.1:5000/#/experiments/1/runs/367eb95a132345099ce2e41b349fb74a",
    }
    context = {"git commit": "ab34d467c051f2f64b759c2e73a7174c0c1bbec3", **ids}
    page = _page(context)
    assert "367eb95a" in page and "aa060bdd" in page  # what MLflow's copy of the report shows
    kept = workspace_page(page, context, tmp_path)
    assert "367eb95a" not in kept and "aa060bdd" not in kept and "ab34d467" not in kept
    assert RUN_IDS_FILE in kept and "<h2>Run</h2>" in kept
    assert json.loads((tmp_path / RUN_IDS_FILE).read_text()) == context
    # another run of the same inputs (new runs, at the later commit that recorded the first run's dvc.lock)
    swap = (("367eb95a", "0123abcd"), ("aa060bdd", "ffff0000"), ("ab34d467", "18ad40c6"))
    other = {k: v.replace(*swap[0]).replace(*swap[1]).replace(*swap[2]) for k, v in context.items()}
    assert workspace_page(_page(other), other, tmp_path) == kept


def test_a_report_without_a_run_table_is_written_as_rendered(tmp_path: Path) -> None:
    context: dict[str, str] = {}
    page = _page(context)
    assert workspace_page(page, context, tmp_path) == page and not (tmp_path / RUN_IDS_FILE).exists()
