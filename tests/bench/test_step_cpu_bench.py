"""``bench/step_cpu_bench.py`` cannot rot: one shrunken step (B = 32, M = N = 8) through the real phases, and its
verdicts on the targets."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import step_cpu_bench  # noqa: E402

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the process sandbox is Linux-only"
)

PHASES = ["parse", "gate", "plan", "reference", "plan_candidates", "candidates", "assemble", "score", "merge"]


def test_shrunken_step_runs_every_phase(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "step.json"
    # targets out of reach of any machine's noise: this test checks the bench, not this machine's speed
    argv = [
        "--scale",
        "0.125",
        "--scaling-jobs",
        "24",
        "--target-ratio",
        "100",
        "--target-gate-growth",
        "1000",
    ]
    assert step_cpu_bench.main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert len(result["problems"]) == 32 and len(set(result["problems"])) == 32
    assert list(result["phases"]) == PHASES
    phases = result["phases"]
    assert phases["parse"]["calls"] == 32 * 8 * 8  # every test response parsed
    assert phases["plan_candidates"]["calls"] == 32 * 8  # one candidate job per program
    assert phases["assemble"]["calls"] == phases["reference"]["calls"] + phases["candidates"]["calls"]
    assert phases["candidates"]["calls"] > phases["reference"]["calls"] > 32  # replay and unique calls ran
    # the synthetic codes pass and fail: correct, wrong and raising programs all reached the sandbox
    assert result["statuses"]["ok"] > 0 and result["statuses"]["error"] > 0
    assert set(result["statuses"]) <= {"ok", "error"}  # no time-out, no infrastructure error
    assert 0 < result["metrics"]["test/validity"] < 1 and result["metrics"]["mistake_book/size"] > 0
    s = result["summary"]
    assert 3.5 < s["gate_row_ratio"] < 4.5  # rows x1 and x4
    assert s["ratio"] == pytest.approx(s["other_cpu_s"] / s["sandbox_cpu_s"])
    assert (
        set(result["scaling_calls_per_s"]) == {"1", "2"} and min(result["scaling_calls_per_s"].values()) > 0
    )
    printed = capsys.readouterr().out
    assert "projected on 64 idle cores" in printed and "MISSED" not in printed and result["missed"] == []


def test_a_missed_target_is_named_and_fails_the_run() -> None:
    summary = {"ratio": 0.4, "gate_growth": 16.0, "gate_row_ratio": 4.0}
    missed = step_cpu_bench.missed_targets(summary, target_ratio=0.25, target_gate_growth=6.0)
    assert len(missed) == 2 and "40.0% > --target-ratio 25%" in missed[0] and "x16.00" in missed[1]
    met = {"ratio": 0.2, "gate_growth": 4.4, "gate_row_ratio": 4.0}
    assert step_cpu_bench.missed_targets(met, target_ratio=0.25, target_gate_growth=6.0) == []


def test_synthetic_completions_are_seeded_and_shaped_like_the_recipe() -> None:
    problems = step_cpu_bench.step_problems(8, seed=3)
    first = step_cpu_bench.completions(problems, 8, 8, seed=3)
    again = step_cpu_bench.completions(step_cpu_bench.step_problems(8, seed=3), 8, 8, seed=3)
    assert [[c.text for c in row] for row in first[0]] == [[c.text for c in row] for row in again[0]]
    code_out, test_out, golden = first
    assert [len(row) for row in code_out] == [8] * 8 and all(len(s) == 8 for row in test_out for s in row)
    suite = test_out[0][0][0].text
    assert suite.startswith("Tests:\n```python\n") and 5 <= suite.count("assert ") <= 10
    # each problem's distinct calls (a family with few distinct inputs offers fewer than POOL)
    assert all(20 <= len({t.call for t in g}) == len(g) <= step_cpu_bench.POOL for g in golden)
