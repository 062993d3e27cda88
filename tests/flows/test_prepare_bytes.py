"""``prepare``'s DVC-tracked outputs are byte-reproducible: a rerun of the same inputs writes the same bytes.

Guards the bug where ``data/prepared/report.json`` carried the run's wall-clock seconds and its cache-hit
counts, so ``dvc status`` after a rerun said the stage's output changed (and lab-compare's seed-1 arm reran
prepare). The per-run numbers now go to the untracked ``data/cache/prepare_run.json``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from codea1_core.config import Config
from flows.prepare import prepare

RUN_FIELDS = ("seconds", "sandbox_programs", "cache_hits")  # what differs per run (flows.prepare.RUN_FIELDS)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.e2e
def test_prepare_twice_writes_the_same_bytes_and_keeps_run_numbers_apart(tmp_path, prefect_harness):
    cfg = Config.from_dict(
        {
            "data": {
                "prepared_dir": str(tmp_path / "data" / "prepared"),
                "data_dir": str(tmp_path / "no-data"),
                "train_sources": ["lab"],
                "val_sources": ["lab"],
                "eval_benchmarks": ["lab_heldout"],
                "max_problems_per_source": 3,
            },
            "lab": {"train_per_family": 1, "heldout_per_family": 1},
            "sandbox": {"workers": 2},
        }
    )
    out, cache = Path(cfg.data.prepared_dir), tmp_path / "data" / "cache"
    first = prepare(cfg)
    before = _snapshot(out)
    assert first["sandbox_programs"] > 0 and "report.json" in before and "train.parquet" in before
    again = prepare(cfg)  # every expected value from the cache: other run numbers, same outputs
    assert again["sandbox_programs"] == 0 and again["cache_hits"] == first["sandbox_programs"]
    assert _snapshot(out) == before
    shutil.rmtree(cache)  # and from scratch, the sandbox run again
    prepare(cfg)
    assert _snapshot(out) == before
    assert not set(RUN_FIELDS) & set(json.loads(before["report.json"]))
    run_stats = json.loads((cache / "prepare_run.json").read_text())
    assert set(run_stats) == set(RUN_FIELDS) and run_stats["sandbox_programs"] == first["sandbox_programs"]
