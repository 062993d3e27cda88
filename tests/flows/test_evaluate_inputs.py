"""Inputs of ``codea1 evaluate`` refused in one line before any work: a prepared benchmark file that another
config prepared, or that records nothing (``codea1_core.data.prepared.check_record``).

Bug guarded: evaluate read whatever ``data/prepared`` held, whichever config had prepared it.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from codea1_core.config import load_config

PREPARE = "`dvc repro prepare`, or `codea1 prepare` with this run's params and overrides"


def _setup(tmp_path: Path, record: bool) -> tuple[Path, Path]:
    from codea1_core.data.lab import lab_problems
    from codea1_core.data.prepared import prepared_record, save_prepared

    cfg = load_config(Path(__file__).resolve().parents[2] / "params.yaml").replace(
        **{
            "data.prepared_dir": str(tmp_path / "prepared"),
            "eval.out_dir": str(tmp_path / "eval"),
            "tracking.backend": "null",
        }
    )
    path = tmp_path / "prepared" / "eval_lab_heldout.parquet"
    save_prepared(
        lab_problems(cfg.lab, "test")[:4], path, prepared_record(cfg, "eval_lab_heldout") if record else None
    )
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(cfg.to_dict()))
    return params, path


def test_another_configs_benchmark_file_is_one_line_naming_the_key(tmp_path: Path, capsys) -> None:
    from flows.evaluate import main

    params, path = _setup(tmp_path, record=True)
    assert main(["--params", str(params), "lab.seed=5"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"error: {path} was prepared by another config: lab.seed=0 (this run: 5): prepare this run's data: {PREPARE}"
    )
    assert "Traceback" not in err and not (tmp_path / "eval").exists()


def test_a_benchmark_file_without_its_record_is_one_line(tmp_path: Path, capsys) -> None:
    from flows.evaluate import main

    params, path = _setup(tmp_path, record=False)
    assert main(["--params", str(params)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        last.startswith(f"error: {path}: no record of the data params that prepared it") and PREPARE in last
    )
