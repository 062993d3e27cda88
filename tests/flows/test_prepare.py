"""The prepare stage end to end: real loaders, real sandbox, real GX, Prefect test harness."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import yaml

from codea1_core.config import Config
from codea1_core.data.dataset_types import is_pending
from codea1_core.data.datasets import load_humaneval
from codea1_core.data.prepared import load_prepared, prepared_record, read_record
from codea1_core.values import values_equal
from flows.prepare import main, prepare


def _cfg(tmp_path: Path, **data) -> Config:
    base = {
        "data": {
            "prepared_dir": str(tmp_path / "data" / "prepared"),
            "data_dir": str(tmp_path / "no-data"),
            "train_sources": ["lab"],
            "val_sources": ["lab"],
            "eval_benchmarks": ["lab_heldout"],
            "max_problems_per_source": 4,
            "reference_call_timeout_s": 5.0,
            **data,
        },
        "lab": {"train_per_family": 1, "heldout_per_family": 1},
        "sandbox": {"workers": 2},
    }
    return Config.from_dict(base)


def _mbpp_row(task_id: int, code: str, asserts: list[str]) -> dict:
    return {
        "task_id": task_id,
        "text": f"Task {task_id}.",
        "code": code,
        "test_list": asserts,
        "test_setup_code": "",
        "challenge_test_list": [],
    }


@pytest.mark.e2e
def test_prepare_offline_lab_and_humaneval_then_cached_rerun(tmp_path, prefect_harness, capsys):
    cfg = _cfg(tmp_path, eval_benchmarks=["lab_heldout", "humaneval", "humanevalplus"])
    report = prepare(cfg)
    out = Path(cfg.data.prepared_dir)
    assert "no humanevalplus/HumanEvalPlus" in report["skipped_sources"]["eval_humanevalplus/humanevalplus"]
    assert sorted(p.name for p in out.glob("*.parquet")) == [
        "eval_humaneval.parquet",
        "eval_lab_heldout.parquet",
        "train.parquet",
        "val.parquet",
    ]
    assert json.loads((out / "report.json").read_text())["outputs"]["eval_humaneval"]["problems"] == 4
    assert "skipped" in capsys.readouterr().out and report["sandbox_programs"] > 0

    # Every expected value came from the reference and agrees with HumanEval's own assert literals.
    claims = {t.call: t.expected for p in load_humaneval() for t in p.tests}
    humaneval = load_prepared(out / "eval_humaneval.parquet")
    checked = 0
    for problem in humaneval:
        assert problem.tests and problem.metadata["reference_passes"] is True
        for test in problem.tests:
            assert not is_pending(test.expected)
            try:
                literal = ast.literal_eval(claims[test.call].answer)
            except (ValueError, SyntaxError):
                continue
            assert values_equal(test.expected, literal, 1e-6, 1e-6), test.call
            checked += 1
    assert checked >= 4
    assert all(p.tests and p.split == "train" for p in load_prepared(out / "train.parquet"))
    for group in ("train", "val", "eval_lab_heldout", "eval_humaneval"):  # what prepared each file, in it
        assert read_record(out / f"{group}.parquet") == prepared_record(cfg, group)

    again = prepare(cfg)  # same inputs: everything comes from the expected-value cache
    assert again["sandbox_programs"] == 0 and again["cache_hits"] == report["sandbox_programs"]
    assert load_prepared(out / "eval_humaneval.parquet") == humaneval


@pytest.mark.e2e
def test_prepare_excludes_and_rejects_with_reasons(tmp_path, prefect_harness):
    rows = [
        _mbpp_row(601, "def inc(x):\n    return x + 1", ["assert inc(1) == 2", "assert inc(2) == 3"]),
        _mbpp_row(602, "def dec(x):\n    return x - 1", ["assert dec(1) == 5", "assert dec(2) == 7"]),
        _mbpp_row(603, "def inv(x):\n    return 1 / x", ["assert inv(1) == 1", "assert inv(0) == 0"]),
        _mbpp_row(
            604,
            "def slow(x):\n    while x:\n        pass\n    return 0",
            ["assert slow(0) == 0", "assert slow(1) == 0"],
        ),
        _mbpp_row(605, "def sq(x):\n    return x * x", ["assert sq(y) == 4"]),
    ]
    data_dir = tmp_path / "data_in"
    (data_dir / "mbpp").mkdir(parents=True)
    (data_dir / "mbpp" / "mbpp.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8"
    )
    kod = {
        "question_id": "Q_1",
        "question": "Add one.",
        "solution": "def inc(x):\n    return x + 1\n",
        "test": "from solution import inc\n\ndef test_inc():\n    assert inc(1) == 2\n",
        "test_info": [{"function_name": "inc", "function_declaration": "def inc(x):"}],
        "gpt_difficulty": "hard",
        "subset": "Leetcode",
        "style": "instruct",
    }
    (tmp_path / "kod.jsonl").write_text(json.dumps(kod) + "\n", encoding="utf-8")
    cfg = _cfg(
        tmp_path,
        data_dir=str(data_dir),
        train_sources=["mbpp", "kodcode"],
        max_problems_per_source=0,
        reference_call_timeout_s=1.0,
        kodcode_path=str(tmp_path / "kod.jsonl"),
    )
    report = prepare(cfg)
    kept = {p.id: p for p in load_prepared(Path(cfg.data.prepared_dir) / "train.parquet")}
    assert sorted(kept) == ["kodcode/Q_1", "mbpp/601", "mbpp/603", "mbpp/604"]
    assert kept["kodcode/Q_1"].tests[0].expected == 2 and report["sources"]["train/kodcode"]["kept"] == 1
    assert [t.call for t in kept["mbpp/603"].tests] == ["inv(1)"] and kept["mbpp/601"].tests[1].expected == 3
    rejected = {r["id"]: r["reason"] for r in report["rejected"]}
    assert rejected["mbpp/602"] == "no golden tests left ({'claim_mismatch': 2})"
    assert "call uses non-builtin names" in rejected["mbpp/605"]
    assert report["excluded_test_reasons"] == {
        "claim_mismatch": 2,
        "reference_error": 1,
        "reference_timeout": 1,
    }
    assert report["sources"]["train/mbpp"] == {"loaded": 5, "kept": 3, "rejected": 2, "excluded_tests": 4}


@pytest.mark.e2e
def test_prepare_bad_input_is_one_line_error_and_writes_nothing(tmp_path, prefect_harness, capsys):
    data_dir = tmp_path / "data_in"
    (data_dir / "mbpp").mkdir(parents=True)
    good = json.dumps(_mbpp_row(601, "def inc(x):\n    return x + 1", ["assert inc(1) == 2"]))
    (data_dir / "mbpp" / "mbpp.jsonl").write_text(good + "\n{broken\n", encoding="utf-8")
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(_cfg(tmp_path).to_dict()), encoding="utf-8")
    code = main(["--params", str(params), f"data.data_dir={data_dir}", "data.train_sources=[mbpp]"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "mbpp.jsonl:2: invalid JSON" in err
    assert main(["--params", str(params), "data.eval_benchmarks=[nope]"]) == 2
    assert "unknown source 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "data" / "prepared").exists()


@pytest.mark.e2e
def test_prepare_shared_data_subset(tmp_path, shared_data_dir, prefect_harness):
    cfg = _cfg(
        tmp_path,
        data_dir=str(shared_data_dir),
        train_sources=["mbpp"],
        val_sources=["mbpp"],
        eval_benchmarks=["humanevalplus", "mbppplus"],
        max_problems_per_source=1,
    )
    report = prepare(cfg)
    out = Path(cfg.data.prepared_dir)
    assert report["rejected"] == [] and report["skipped_sources"] == {}
    for name, prefix in (
        ("train", "mbpp/"),
        ("val", "mbpp/"),
        ("eval_humanevalplus", "HumanEval/"),
        ("eval_mbppplus", "Mbpp/"),
    ):
        problems = load_prepared(out / f"{name}.parquet")
        assert len(problems) == 1 and all(p.id.startswith(prefix) and p.tests for p in problems)
    assert sum(len(p.plus_tests) for p in load_prepared(out / "eval_mbppplus.parquet")) > 0


@pytest.mark.e2e
@pytest.mark.slow
def test_prepare_full_evalplus_and_mbpp(tmp_path, shared_data_dir, prefect_harness):
    """Acceptance: 164 HumanEval+ and 378 MBPP+ problems and the MBPP splits, each reference passing its goldens."""
    cfg = _cfg(
        tmp_path,
        data_dir=str(shared_data_dir),
        train_sources=["mbpp"],
        val_sources=["mbpp"],
        eval_benchmarks=["humanevalplus", "mbppplus"],
        max_problems_per_source=0,
        reference_call_timeout_s=20.0,
    )
    report = prepare(cfg)
    outputs = report["outputs"]
    assert outputs["eval_humanevalplus"]["problems"] == 164 and outputs["eval_mbppplus"]["problems"] == 378
    assert outputs["train"]["problems"] >= 370 and outputs["val"]["problems"] >= 88


def test_prepare_reference_infra_failure_aborts_through_the_one_guard(tmp_path, monkeypatch):
    """Regression: prepare had its own copy of the infra guard (a bare RuntimeError, no retry);
    it now goes through ``tasks.execute.run_jobs`` (limit 0: nothing with an infra failure is cached)."""
    import flows.prepare as prepare
    from codea1_core.data.lab import lab_problems
    from codea1_core.types import CallOutcome
    from tasks.execute import InfraFailure

    class Broken:
        rounds = 0

        def run_many(self, jobs):
            Broken.rounds += 1
            return [[CallOutcome("infra_error", error="worker died") for _ in e] for _, e in jobs]

        def close(self) -> None:
            pass

    monkeypatch.setattr(prepare, "_reference_executor", lambda cfg: Broken())
    cfg = _cfg(tmp_path)
    problems = lab_problems(cfg.lab, "val")[:2]
    cache = tmp_path / "cache"
    with pytest.raises(
        InfraFailure, match=r"prepare: reference programs: .* e\.g\. \['lab/.*prepare's limit=0\.0"
    ):
        prepare._run_references(cfg, problems, cache, {})
    assert Broken.rounds == 2 and not list(cache.rglob("*.json"))  # retried once, nothing cached
