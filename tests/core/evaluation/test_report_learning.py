"""report.html opens on the learning table (warm start -> trained, both roles), then the run's context.

Regression: the report showed the trained model only, then a flat table of every metric: no warm start ->
trained comparison, no Test LLM chart, no run id, commit, params or link to the MLflow run.
"""

from __future__ import annotations

import base64
import re

from codea1_core.evaluation.report import learning_rows, render_report

PROMOTE = "code/lab_heldout_seen/base/pass@1"
METRICS = {
    PROMOTE: 58.5,
    f"warmstart/{PROMOTE}": 45.4,
    f"delta/{PROMOTE}": 13.1,
    "code/lab_heldout/base/pass@1": 50.0,
    "warmstart/code/lab_heldout/base/pass@1": 40.0,
    "delta/code/lab_heldout/base/pass@1": 10.0,
    "test/lab_heldout/pass@5": 29.7,
    "warmstart/test/lab_heldout/pass@5": 23.5,
    "delta/test/lab_heldout/pass@5": 6.2,
    "test/lab_heldout/mut@5": 36.1,
    "warmstart/test/lab_heldout/mut@5": 40.6,
    "delta/test/lab_heldout/mut@5": -4.5,
    "test/lab_heldout/pass@5_ult": 26.9,
    "code/lab_heldout/base/avg@8": 30.0,
}


def test_learning_rows_promote_first_then_code_then_test() -> None:
    keys = [k for k, _, _, _ in learning_rows(METRICS, PROMOTE)]
    assert keys == [
        PROMOTE,
        "code/lab_heldout/base/pass@1",
        "test/lab_heldout/mut@5",
        "test/lab_heldout/pass@5",
    ]
    assert learning_rows(METRICS, PROMOTE)[0] == (PROMOTE, 45.4, 58.5, 13.1)


def test_report_opens_on_learning_with_both_roles_and_the_run_context() -> None:
    context = {"git commit": "abc123", "MLflow training run": "r1", "MLflow run": "http://127.0.0.1:5000/#/x"}
    page = render_report(METRICS, promote=PROMOTE, context=context, params={"reward.alpha": 0.5})
    body = page[page.index("<body>") :]
    assert body.index("Learning: warm start") < body.index("<h2>Run</h2>") < body.index("Pass rates")
    first_table = body[body.index("<table>") : body.index("</table>")]
    assert "warm start" in first_table and "45.40" in first_table and "+13.10" in first_table
    assert "test/lab_heldout/mut@5" in first_table and "-4.50" in first_table
    assert "(promote metric)" in first_table
    pngs = [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]
    assert len(pngs) == 2  # learning (Code LLM and Test LLM panels) and pass rates
    assert '<a href="http://127.0.0.1:5000/#/x">' in page and "abc123" in page and "r1" in page
    assert "reward.alpha" in page[page.index("Params") :]
    assert not re.search(r'(src|href)="https?://(?!127\.0\.0\.1)', page)  # nothing loaded from the network
