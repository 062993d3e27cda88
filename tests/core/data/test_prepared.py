"""The record of what prepared a file (``codea1_core.data.prepared``): written into each parquet file, compared
with the reading config, a mismatch or a missing record refused in one line naming the keys and the command.

Bug guarded: the lab's ``data/prepared`` read by a real-model config was silently trained on ("no training
step: 156 problems, data.train_batch_size=256").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from codea1_core.config import Config
from codea1_core.data.dataset_types import DatasetError
from codea1_core.data.lab import lab_problems
from codea1_core.data.prepared import check_record, prepared_record, read_record, save_prepared

LAB = Config.from_dict({})
PREPARE = "`dvc repro prepare`, or `codea1 prepare` with this run's params and overrides"


def _saved(tmp_path: Path, cfg: Config, group: str) -> Path:
    return save_prepared(
        lab_problems(cfg.lab, "val")[:2], tmp_path / f"{group}.parquet", prepared_record(cfg, group)
    )


def test_each_file_records_the_params_that_decide_its_content(tmp_path: Path) -> None:
    train = prepared_record(LAB, "train")
    assert train["data.train_sources"] == ["lab"] and train["lab.seed"] == 0 and train["data.seed"] == 1
    assert train["data.reference_call_timeout_s"] == 60.0 and train["sandbox.float_abs_tol"] == 1.0e-6
    assert "data.val_sources" not in train and "data.kodcode_path" not in train
    assert "data.train_sources" not in prepared_record(LAB, "eval_lab_heldout")  # its name is its benchmark
    assert "lab.seed" not in prepared_record(LAB, "eval_mbppplus")
    kod = prepared_record(LAB.replace(**{"data.train_sources": ["kodcode"]}), "train")
    assert kod["data.kodcode_difficulty"] == "hard" and "lab.seed" not in kod
    assert read_record(_saved(tmp_path, LAB, "train")) == train
    assert read_record(save_prepared([], tmp_path / "bare.parquet")) is None


def test_the_same_config_reads_its_own_files(tmp_path: Path) -> None:
    for group in ("train", "val", "eval_lab_heldout"):
        check_record(_saved(tmp_path, LAB, group), LAB)
    cfg = LAB.replace(**{"data.train_batch_size": 256, "sandbox.memory_mb": 16, "data.eval_benchmarks": []})
    check_record(tmp_path / "train.parquet", cfg)  # keys that do not decide the data do not matter


def test_another_configs_file_is_one_line_naming_the_keys_and_the_command(tmp_path: Path) -> None:
    path = _saved(tmp_path, LAB, "train")
    real = LAB.replace(**{"data.train_sources": ["kodcode", "mbpp"], "data.train_batch_size": 256})
    with pytest.raises(DatasetError) as err:
        check_record(path, real)
    assert str(err.value) == (
        f"{path} was prepared by another config: data.train_sources=['lab'] (this run: ['kodcode', 'mbpp']): "
        f"prepare this run's data: {PREPARE}"
    )
    eval_path = _saved(tmp_path, LAB, "eval_lab_heldout")
    with pytest.raises(
        DatasetError, match=r"lab.seed=0 \(this run: 7\), lab.train_per_family=12 \(this run: 3\)"
    ):
        check_record(eval_path, LAB.replace(**{"lab.seed": 7, "lab.train_per_family": 3}))


def test_a_file_without_a_record_is_refused_in_one_line(tmp_path: Path) -> None:
    """A folder prepared before files carried their record: refused (a record computed from the contents could
    check the source names only, not the lab's sizes, the caps or the reference limits)."""
    path = save_prepared(lab_problems(LAB.lab, "val")[:2], tmp_path / "val.parquet")
    with pytest.raises(DatasetError) as err:
        check_record(path, LAB)
    assert str(err.value) == (
        f"{path}: no record of the data params that prepared it (written by an older codea1 or by hand): "
        f"prepare it again: {PREPARE}"
    )
    (tmp_path / "junk.parquet").write_bytes(b"junk")
    with pytest.raises(DatasetError, match="junk.parquet: not a readable parquet file"):
        check_record(tmp_path / "junk.parquet", LAB)
